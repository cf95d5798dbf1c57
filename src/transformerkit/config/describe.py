"""``transformerkit config``: a resolved run config as commented YAML, every key with its
type (or allowed values), default and meaning, all read from :func:`schema` (the
declarations of ``config/sections.py``, ``models/options.py`` and
``decoding/options.py``)."""

import json

import yaml

from transformerkit.config.loading import MODEL_TYPES, SECTIONS, defaults, schema


def describe(config=None, source=None):
    """``config`` (resolved; default: the defaults) as commented YAML that
    :func:`load_config` reads back to the same config: every key of every section with its
    value, then after ``#`` its type (or allowed values), its default and its meaning.
    ``source`` names where the values come from, in the header."""
    sections = schema()
    config = {**defaults(), **({} if config is None else config.to_dict())}
    lines = [f"# transformerkit configuration: {source or 'the defaults'}",
             "# Every key: its value, then its type (or allowed values), default and meaning; "
             "null: not set.",
             "# `transformerkit train` reads this file back; `--set section.key=value` "
             "overrides a key."]
    entries = {section: [f"  {name}: {_yaml_scalar(config[section][name])}" for name in keys]
               for section, keys in sections.items()}
    width = min(max(len(entry) for section in entries.values() for entry in section), 34)
    for section, keys in sections.items():
        lines += ["", f"# {section}: {SECTIONS[section]}", f"{section}:"]
        for entry, key in zip(entries[section], keys.values(), strict=True):
            lines.append(f"{entry.ljust(width)}  # {_comment(key)}")
    return "\n".join(lines) + "\n"


def _yaml_scalar(value):
    """``value`` as one line of YAML (``null``, ``true``, ``1.0e-06``, ``'yes'``)."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 30)
    text = text.removesuffix("\n...\n").rstrip("\n")
    return json.dumps(value, ensure_ascii=False) if "\n" in text else text


def _comment(key):
    """``type or choices, default D: help``, with the model types that take a ``model:`` key
    when not all do, and each one's own default."""
    if key.choices:
        allowed = " | ".join(map(_yaml_scalar, key.choices))
    else:
        allowed = " or ".join(t.__name__ for t in (key.types if isinstance(key.types, tuple)
                                                else (key.types,)))
    default, only = _yaml_scalar(key.default), ""
    if key.models is not None:
        if len(key.models) < len(MODEL_TYPES):
            only = f"{', '.join(key.models)} only; "
        if any(value is not None for value in key.models.values()):
            default += " = the model's (" + ", ".join(
                f"{model_type} {_yaml_scalar(value)}"
                for model_type, value in key.models.items()) + ")"
    return f"{only}{allowed}, default {default}: {key.help}"
