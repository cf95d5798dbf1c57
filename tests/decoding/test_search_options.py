"""Search and generation options declared once (``transformerkit.decoding.options``): their
checks, and every interface that takes them derived from the declaration (the command line,
``Run.translate``/``Run.generate``, the HTTP request bodies, the CTranslate2 runtime)."""

import dataclasses
import inspect
import math

import pytest
from paths import ROOT

from transformerkit.decoding.options import (
    GenerationOptions,
    SearchOptions,
    fields_of,
    flag_name,
    resolve,
    value_type,
)

OPTION_CLASSES = (SearchOptions, GenerationOptions)


def test_the_defaults_are_the_papers_search():
    options = SearchOptions()
    assert (options.beam_size, options.alpha, options.n_best) == (4, 0.6, 1)  # section 6.1
    assert options.searches_beams and not options.samples
    assert SearchOptions(beam_size=1).searches_beams is False
    assert SearchOptions(beam_size=1, n_best=3).width == 3  # the beam widens to n_best
    assert SearchOptions(temperature=0.7).samples


@pytest.mark.parametrize("name,value,error", [
    ("beam_size", 0, ValueError), ("beam_size", 2.0, TypeError), ("beam_size", True, TypeError),
    ("alpha", -0.1, ValueError), ("alpha", math.nan, ValueError), ("alpha", "0.6", TypeError),
    ("alpha", 10.5, ValueError),  # ((5+len)/6)^alpha would leave float32 (or Python floats)
    ("n_best", 0, ValueError), ("batch_size", 0, ValueError), ("max_new_tokens", 0, ValueError),
    ("stopping", "never", ValueError), ("max_len_a", -1.0, ValueError),
    ("max_len_b", -1, ValueError), ("temperature", -1.0, ValueError),
    ("top_k", 0, ValueError), ("top_p", 0.0, ValueError), ("top_p", 1.5, ValueError),
    ("seed", "1", TypeError), ("beam_size", None, TypeError),
])
def test_each_option_is_checked_with_an_error_naming_it(name, value, error):
    with pytest.raises(error, match=name):
        SearchOptions(**{name: value})


def test_options_that_contradict_each_other_are_refused():
    with pytest.raises(ValueError, match="n_best=2 lists come from beam search"):
        SearchOptions(n_best=2, temperature=1.0)
    with pytest.raises(ValueError, match="allow no output token"):
        SearchOptions(max_len_a=0.0, max_len_b=0)
    SearchOptions(max_len_a=None, max_len_b=None)  # no cap at all is allowed
    with pytest.raises(TypeError, match="stop_at_eos"):
        GenerationOptions(stop_at_eos=1)


def test_values_are_normalised_and_the_options_are_frozen():
    options = SearchOptions(alpha=1, max_len_a=2)  # ints where numbers are asked for
    assert isinstance(options.alpha, float) and isinstance(options.max_len_a, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam_size = 2
    assert options.replace(beam_size=2).beam_size == 2
    with pytest.raises(ValueError, match="beam_size"):
        options.replace(beam_size=0)


def test_keywords_in_place_of_options():
    assert resolve(SearchOptions, None, {}, "translate") == SearchOptions()
    base = SearchOptions(beam_size=2)
    assert resolve(SearchOptions, base, {}, "translate") is base
    assert resolve(SearchOptions, base, {"alpha": 1.0}, "translate") == \
        SearchOptions(beam_size=2, alpha=1.0)
    with pytest.raises(TypeError, match=r"translate\(\) got unknown option\(s\) beam; the "
                                        "options are alpha, batch_size, beam_size"):
        resolve(SearchOptions, None, {"beam": 2}, "translate()")
    with pytest.raises(TypeError, match="options must be a SearchOptions"):
        resolve(SearchOptions, GenerationOptions(), {}, "translate()")


def test_keywords_are_checked_once_per_set_of_values_and_types():
    """The options of the same keywords are made once (frozen: the same object), a value is
    told apart from an equal one of another type (``True`` from ``1``: refused however
    often ``1`` was taken), a value that fails its check fails every time, and an
    unhashable one is checked all the same."""
    first = resolve(SearchOptions, None, {"beam_size": 1, "max_len_a": 2}, "translate()")
    assert resolve(SearchOptions, None, {"max_len_a": 2, "beam_size": 1}, "translate()") \
        is first
    assert isinstance(first.max_len_a, float)
    as_float = resolve(SearchOptions, None, {"beam_size": 1, "max_len_a": 2.0}, "translate()")
    assert as_float == first and isinstance(as_float.max_len_a, float)
    for _ in range(2):
        with pytest.raises(TypeError, match="beam_size"):
            resolve(SearchOptions, None, {"beam_size": True}, "translate()")
        with pytest.raises(ValueError, match="beam_size"):
            resolve(SearchOptions, None, {"beam_size": 0}, "translate()")
        with pytest.raises(TypeError, match="seed"):
            resolve(SearchOptions, None, {"seed": [1]}, "translate()")


def test_each_flag_of_the_command_line_is_a_declared_option():
    from transformerkit.cli.parser import build_parser

    parser = build_parser()
    args = {"translate": ["translate", "RUN"], "generate": ["generate", "RUN", "--prompt", "x"],
            "evaluate": ["evaluate", "RUN"]}
    for command, options_class in (("translate", SearchOptions),
                                   ("generate", GenerationOptions),
                                   ("evaluate", SearchOptions)):
        parsed = vars(parser.parse_args(args[command]))
        for f in fields_of(options_class):
            # a flag not given leaves nothing: the run's own options (or the declared
            # defaults) stand, so that an imported run searches as its checkpoint says
            assert f.name not in parsed, (command, f.name)
            given = [flag_name(f)] if value_type(f) is bool else \
                [flag_name(f), "1" if f.default is None else str(f.default)]
            argv = args[command] + given
            if command == "evaluate" and f.name in ("n_best", "temperature", "top_k",
                                                    "top_p", "seed"):
                with pytest.raises(SystemExit):  # evaluation searches, it does not sample
                    parser.parse_args(argv)
                continue
            assert f.name in vars(parser.parse_args(argv)), (command, f.name)
    parsed = parser.parse_args(["translate", "RUN", "--beam", "2", "--max-len-a", "none",
                                "--stopping", "heuristic", "--top-p", "0.5", "--forced-eos",
                                "--penalty", "power"])
    assert (parsed.beam_size, parsed.max_len_a, parsed.stopping, parsed.top_p,
            parsed.forced_eos, parsed.penalty) == (2, None, "heuristic", 0.5, True, "power")
    assert parser.parse_args(["translate", "RUN", "--no-renormalize"]).renormalize is False
    assert parser.parse_args(["generate", "R", "--prompt", "x", "--no-stop-at-eos"]) \
        .stop_at_eos is False
    assert flag_name(fields_of(SearchOptions)[0]) == "--beam"


def test_the_python_api_and_the_runtime_take_the_declared_options():
    from transformerkit.api import Run
    from transformerkit.export.runtime import CTranslate2Engine

    for method in (Run.translate, Run.translate_batches, Run.generate,
                   CTranslate2Engine.translate, CTranslate2Engine.translate_batches,
                   CTranslate2Engine.generate):
        parameters = inspect.signature(method).parameters
        declared = {f.name for cls in OPTION_CLASSES for f in fields_of(cls)}
        assert "options" in parameters and not declared & set(parameters), method.__name__


def test_the_request_bodies_are_the_declared_options():
    from transformerkit.serving.schemas import GenerateRequest, TranslateRequest

    for request, options_class, own in ((TranslateRequest, SearchOptions, {"texts", "model"}),
                                        (GenerateRequest, GenerationOptions,
                                         {"prompt", "model", "stream"})):
        declared = {f.name: f for f in fields_of(options_class)}
        body = set(request.model_fields) - own
        assert body == set(declared) - {"batch_size"}  # the server batches itself
        for name in body:
            assert request.model_fields[name].default == declared[name].default, name
            assert request.model_fields[name].description == declared[name].metadata["help"]
    with pytest.raises(ValueError, match="stopping"):
        TranslateRequest(texts=["a"], stopping="never")
    with pytest.raises(ValueError, match="beam_size"):
        TranslateRequest(texts=["a"], beam_size=0)


def test_search_functions_have_no_defaults_of_their_own():
    """The id-level searches read the declared defaults: none of their parameters is a
    search option with a default written again (generate_ids' defaults are read from
    GenerationOptions itself)."""
    from transformerkit.decoding import (
        beam_translate,
        generate_ids,
        greedy_translate,
        sample_translate,
        translate_batches,
        translate_texts,
    )

    declared = {f.name for f in fields_of(SearchOptions)}
    for function in (beam_translate, greedy_translate, sample_translate, translate_batches,
                     translate_texts):
        assert not declared & set(inspect.signature(function).parameters), function.__name__
    parameters = inspect.signature(generate_ids).parameters
    for f in fields_of(GenerationOptions):
        if f.name in parameters:
            assert parameters[f.name].default == f.default, f.name


@pytest.mark.parametrize("page", ["README.md"])
def test_the_documented_defaults_are_the_declared_ones(page):
    """The README's short search table states the declared defaults (docs/decoding.md
    holds the generated tables: the next test)."""
    import re

    text = (ROOT / page).read_text(encoding="utf-8")
    rows = re.findall(r"^\| `--[a-z-]+` \(`([a-z_]+)`\) \| ([^|]+) \|", text, re.MULTILINE)
    assert len(rows) >= 4
    declared = {f.name: f.default for f in fields_of(SearchOptions)}
    for name, default in rows:
        written = default.strip().strip("`")
        if declared[name] is None:
            assert "max_length" in written or written == "none", (name, written)
        else:
            assert written == str(declared[name]), (name, written)


def test_the_documented_option_tables_are_the_generated_ones():
    """docs/decoding.md embeds ``markdown_reference`` of SearchOptions, GenerationOptions
    and RuntimeOptions; regenerate the blocks when a declaration changes."""
    import re

    from transformerkit.decoding import options

    page = (ROOT / "docs" / "decoding.md").read_text(encoding="utf-8")
    blocks = re.findall(r"<!-- generated: markdown_reference\((\w+)\) -->\n(.*?)"
                        r"<!-- end generated -->", page, re.S)
    assert [name for name, _ in blocks] == ["SearchOptions", "GenerationOptions",
                                            "RuntimeOptions"]
    for name, text in blocks:
        assert text == options.markdown_reference(getattr(options, name)), name
    table = options.markdown_reference(options.SearchOptions)
    assert "| `--beam` | `beam_size` | int >= 1 | `4` | beam size; 1 = greedy search |" in table
    assert "| number in (0, 1], or none | `none` |" in table  # top_p


@pytest.mark.parametrize("keywords, error, message", [
    ({"engine": "onnx"}, ValueError,
     "engine must be one of 'keras', 'compiled', 'ctranslate2'; got 'onnx'"),
    ({"precision": "fp8"}, ValueError, "precision must be one of"),
    ({"engine": "ctranslate2", "precision": "int8"}, ValueError,
     "precision int8 applies to the keras engine"),
    ({"threads": -1}, ValueError, "threads must be at least 0"),
    ({"threads": 1.5}, TypeError, "threads must be"),
    ({"checkpoint": ""}, ValueError, "checkpoint must name the weights"),
    ({"engine_name": "keras"}, TypeError, "load\\(\\) got unknown option\\(s\\) engine_name"),
])
def test_runtime_options_refuse_what_cannot_run_before_anything_loads(tmp_path, keywords,
                                                                       error, message):
    """``transformerkit.load(run_dir, **runtime)``: every runtime option is checked by its
    declaration (and the engine/precision rule by ``RuntimeOptions``) before the run
    directory is read: here it does not even exist."""
    import transformerkit

    with pytest.raises(error, match=message):
        transformerkit.load(tmp_path / "no-run", **keywords)


def test_runtime_options_defaults_are_declared_once():
    """The flags of the commands that use a run show the declared defaults, and a run
    loaded without options has them (``Run.runtime``)."""
    from transformerkit.cli import build_parser
    from transformerkit.decoding.options import RuntimeOptions

    declared = RuntimeOptions()
    assert (declared.engine, declared.precision, declared.threads, declared.checkpoint) == \
        ("keras", "float32", 0, "model")
    parser = build_parser()
    for command in ("translate", "generate", "evaluate"):
        args = parser.parse_args([command, "RUN", "--engine", "ctranslate2", "--threads", "2"]
                                 + (["--prompt", "x"] if command == "generate" else []))
        assert (args.engine, args.threads) == ("ctranslate2", 2)
        assert not hasattr(args, "precision")  # not given: the declaration's default applies
