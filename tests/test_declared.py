"""The declaration machinery shared by the models' options, the decoding options and the run
config (``transformerkit.declared``): the field helper and the one check of a value."""

import dataclasses
import math

import numpy as np
import pytest

from transformerkit.declared import PYTHON_NAMES, Problem, check, nullable, option, value_types


@dataclasses.dataclass(kw_only=True)
class Declared:
    count: int = option(1, minimum=1, help="a positive count", flag="--n")
    rate: float | None = option(None, above=0.0, maximum=1.0, help="a rate in (0, 1]")
    scale: float = option(1.0, minimum=0.0, help="a non-negative number")
    free: float = option(0.0, help="any number")
    mode: str = option("a", choices=("a", "b"), help="one of two")
    either: int | str = option("auto", help="a number or a word")
    on: bool = option(True, help="a switch")
    needed: int = option(help="no default")


FIELDS = {f.name: f for f in dataclasses.fields(Declared)}


def test_the_declaration_is_metadata_with_absent_keys_none():
    count, needed = FIELDS["count"], FIELDS["needed"]
    assert (count.default, count.metadata["minimum"], count.metadata["flag"]) == (1, 1, "--n")
    assert count.metadata["label"] is None and count.metadata.get("own_default") is None
    assert needed.default is dataclasses.MISSING and needed.metadata["help"] == "no default"
    assert value_types(FIELDS["rate"]) == (float,) and nullable(FIELDS["rate"])
    assert value_types(FIELDS["either"]) == (int, str) and not nullable(FIELDS["either"])


@pytest.mark.parametrize("name, value, normalised", [
    ("count", 3, 3), ("count", np.int64(3), 3), ("scale", 2, 2.0), ("rate", None, None),
    ("rate", 1, 1.0), ("either", 2, 2), ("either", "auto", "auto"), ("on", False, False),
    ("mode", "b", "b"), ("free", math.inf, math.inf),  # no range declared: any float
])
def test_fitting_values_come_back_normalised(name, value, normalised):
    checked, problem = check(FIELDS[name], value)
    assert problem is None and checked == normalised and type(checked) is type(normalised)


@pytest.mark.parametrize("name, value, error, message", [
    ("count", 0, ValueError, "x must be at least 1, got 0"),
    ("count", True, TypeError, "x must be an int, got bool True"),
    ("count", 2.0, TypeError, "x must be an int, got float 2.0"),
    ("count", None, TypeError, "x must be an int, got None"),
    ("rate", 0, ValueError, "x must be in (0, 1], got 0.0"),
    ("rate", math.nan, ValueError, "x must be in (0, 1], got nan"),
    ("scale", -1.0, ValueError, "x must be a finite number >= 0, got -1.0"),
    ("scale", math.inf, ValueError, "x must be a finite number >= 0, got inf"),
    ("scale", "1", TypeError, "x must be a number, got str '1'"),
    ("mode", "c", ValueError, "x must be one of 'a', 'b'; got 'c'"),
    ("either", 1.5, TypeError, "x must be an int or a string, got float 1.5"),
    ("on", 1, TypeError, "x must be True or False, got int 1"),
])
def test_a_value_that_does_not_fit_is_a_problem_saying_why(name, value, error, message):
    _, problem = check(FIELDS[name], value)
    assert isinstance(problem, Problem) and problem.error is error
    assert problem.message("x") == message


def test_each_caller_names_types_and_null_its_own_way():
    _, problem = check(FIELDS["count"], None)
    names = {**PYTHON_NAMES, int: "an integer"}
    assert problem.message("train.x", names, null="nothing (null)") == \
        "train.x must be an integer, got nothing (null)"


def test_convert_takes_what_the_type_converts_except_for_choices():
    assert check(FIELDS["count"], 64.0, convert=True) == (64, None)
    assert check(FIELDS["on"], 0, convert=True) == (False, None)
    _, problem = check(FIELDS["count"], "many", convert=True)
    assert problem.error is TypeError and problem.message("x").startswith("x must be an int")
    _, problem = check(FIELDS["mode"], 1, convert=True)  # not str(1): a choice as given
    assert problem.message("x") == "x must be a string, got int 1"
