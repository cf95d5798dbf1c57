"""Options declared once, as data: the field helper and the one check of a value against it.

The models' options (``models/options.py``), the search and generation options
(``decoding/options.py``) and the run config's ``data:`` and ``train:`` sections
(``config/sections.py``) are dataclasses whose fields come from :func:`option`: a default,
one line of ``help``, the allowed ``choices`` or range, and what else the module needs
(``flag``, ``label``, ``own_default``, ``decoding``, ``differs``). The field's annotation is
its type (``int | None`` may be None, ``int | str`` takes either). :func:`check` checks a
value against a field the same way for all three and returns a :class:`Problem` rather than
raising, because each raises its own error (``TypeError``/``ValueError`` in Python,
``ConfigError`` for a config file) with the name its user knows (``beam_size``,
``train.epochs``).

A leaf module: plain Python, importing nothing from transformerkit, so that the config
(level 2) and the decoding options (level 3) can both use it.
"""

import functools
import math
import numbers
import typing
from dataclasses import MISSING, field
from typing import NamedTuple

RANGE_KEYS = ("minimum", "above", "maximum", "below")

PYTHON_NAMES = {int: "an int", float: "a number", str: "a string", bool: "True or False",
                list: "a list", dict: "a dict"}
"""How an error message names each type for Python callers (a YAML file says "true/false")."""


class _Declaration(dict):
    """A field's metadata: the keys :func:`option` was given; any other key reads as None,
    so a module asks ``f.metadata["flag"]`` of every field without each declaring it."""

    def __missing__(self, key):
        return None


def option(default=MISSING, *, help, choices=None, minimum=None, above=None, maximum=None,
           below=None, **extra):
    """A dataclass field: its ``default`` (none: a required argument), one line of ``help``,
    its allowed ``choices`` or range (``minimum``/``maximum`` inclusive, ``above``/``below``
    exclusive), and the ``extra`` keys of the declaring module, kept as given."""
    return field(default=default, metadata=_Declaration(
        help=help, choices=choices, minimum=minimum, above=above, maximum=maximum,
        below=below, **extra))


@functools.cache  # every options object checks each of its fields on construction
def value_types(f):
    """The types a field's values may have: ``(int,)`` for ``int | None``, ``(int, str)``
    for ``int | str``."""
    return tuple(t for t in typing.get_args(f.type) or (f.type,) if t is not type(None))


def value_type(f):
    """The (first) type of a field's values: ``int`` for ``int | None``."""
    return value_types(f)[0]


@functools.cache
def nullable(f):
    """Whether a field may be None (declared ``X | None``)."""
    return type(None) in typing.get_args(f.type)


class Problem(NamedTuple):
    """Why ``value`` does not fit its field. ``error`` is ``TypeError`` where it is not of
    the declared ``types`` (or None where the field is not nullable), else ``ValueError``
    with ``text`` saying what it must be (``"must be at least 1, got 0"``)."""

    error: type
    types: tuple
    value: object
    text: str | None = None

    def message(self, name, names=PYTHON_NAMES, null="None"):
        """The message naming the option ``name``, with the caller's ``names`` of the types
        and of ``null``: ``"beam_size must be an int, got str '4'"``."""
        if self.text is not None:
            return f"{name} {self.text}"
        expected = " or ".join(names[t] for t in self.types)
        got = null if self.value is None else f"{type(self.value).__name__} {self.value!r:.40}"
        return f"{name} must be {expected}, got {got}"


def check(f, value, *, convert=False):
    """``(value, None)`` with ``value`` normalised if it fits field ``f`` (see
    :func:`check_value`), else ``(value, Problem)``."""
    meta = f.metadata
    return check_value(value, value_types(f), nullable=nullable(f), choices=meta["choices"],
                       convert=convert, **{key: meta[key] for key in RANGE_KEYS})


def check_value(value, types, *, nullable=False, choices=None, minimum=None, above=None,
                maximum=None, below=None, convert=False):
    """``(value, None)`` where ``value`` fits the declaration, else ``(value, Problem)``.

    In order: None only where ``nullable``; one of ``types`` (a bool is no int or number; an
    int where a number is expected becomes a ``float``, numpy numbers Python ones); one of
    ``choices``; a number in its range, and finite where a range is declared (NaN and
    infinity are in none). ``convert``: a value not of the (first) type is converted with
    it (``int(64.0)``) rather than refused, unless ``choices`` are declared; the models'
    constructors have always taken such values.
    """
    if value is None:
        return value, None if nullable else Problem(TypeError, types, value)
    kind = next((t for t in types if _is_a(value, t)), None)
    if kind is None and convert and choices is None:
        try:
            kind, value = types[0], types[0](value)
        except (TypeError, ValueError):
            pass
    if kind is None:
        return value, Problem(TypeError, types, value)
    if kind in (int, float):
        value = kind(value)
    if choices is not None and value not in choices:
        return value, Problem(ValueError, types, value, f"must be one of "
                              f"{', '.join(map(repr, choices))}; got {value!r}")
    if kind in (int, float):
        allowed = _outside(value, minimum, above, maximum, below)
        if allowed:
            return value, Problem(ValueError, types, value, f"must be {allowed}, got {value}")
    return value, None


def _is_a(value, kind):
    """Whether ``value`` is of the declared ``kind``: a bool is no int or number, a numpy
    integer is an int."""
    if kind in (int, float):
        abstract = numbers.Integral if kind is int else numbers.Real
        return isinstance(value, abstract) and not isinstance(value, bool)
    return isinstance(value, kind)


def _outside(value, low, above, high, below):
    """What a number outside its range must be (``"at least 1"``, ``"in (0, 1]"``,
    ``"a finite number >= 0"``); None where it is inside or no range is declared."""
    if low is None and above is None and high is None and below is None:
        return None
    if math.isfinite(value) and all((low is None or value >= low, above is None or value > above,
                                     high is None or value <= high,
                                     below is None or value < below)):
        return None
    if high is None and below is None:  # a lower bound only
        if isinstance(value, int):
            return f"at least {low}" if above is None else f"greater than {above}"
        return f"a finite number >= {low:g}" if above is None else f"a finite number > {above:g}"
    left = "(-inf" if low is None and above is None else (
        f"({above:g}" if above is not None else f"[{low:g}")
    right = f"{below:g})" if below is not None else f"{high:g}]"
    return f"in {left}, {right}"
