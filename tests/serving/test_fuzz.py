"""The HTTP API fuzzed from its own OpenAPI schema (Schemathesis, in-process over ASGI) on
the two tiny runs of ``conftest.py``.

For each operation of the served schema (``GET /openapi.json``, with this server's limits
and model names written in: ``serving/openapi.py``), Schemathesis generates requests that
fit the schema (positive) and requests that break it (negative: wrong types, missing and
unknown fields, out-of-range numbers, bodies that are not JSON or not UTF-8), a bounded and
reproducible number of each (Hypothesis: ``max_examples``, ``derandomize``). Every answer must
not be a 5xx (``not_a_server_error``), must have a status the schema declares for that
operation, with the declared content type and a body matching the declared model (the error
model for a 4xx), and a request that breaks the schema must be refused
(``negative_data_rejection``). Schemathesis' ``positive_data_acceptance`` is not checked: a
request can fit the schema and still be refused with a 422 for what no schema says (an empty
or whitespace-only text, more tokens than the model's ``max_length``, ``/generate`` on a
Transformer, options that contradict each other). After the fuzzing, a good request of the
operation is answered.

The limits are small (``max_new_tokens`` 8, beam size 4, 4 texts of 40 characters) so the
generated requests that reach a model stay cheap. The number of cases per operation and
generation mode, and the statuses they got, are printed (and counted in the suite's
``fuzz:`` summary line).
"""

import collections

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from transformerkit.serving.app import create_app  # noqa: E402
from transformerkit.serving.limits import Limits  # noqa: E402
from transformerkit.serving.server import load_runs  # noqa: E402

pytestmark = pytest.mark.slow

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance, negative_data_rejection]
EXAMPLES = 150  # per operation and generation mode
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
LIMITS = Limits(max_texts=4, max_chars=40, max_new_tokens=8, max_beam_size=4,
                max_body_bytes=4096, timeout=30.0)
# a request each operation must answer with 200 after the fuzzing
GOOD = {"POST /translate": {"texts": ["ein zwei"], "beam_size": 2, "max_new_tokens": 6},
        "POST /generate": {"prompt": "ein", "model": "poet", "max_new_tokens": 4, "seed": 1},
        "POST /attention": {"source": "ein zwei", "target": "one two"},
        "GET /health": None, "GET /models": None, "GET /metrics": None}
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)


@pytest.fixture(scope="module")
def api_schema(run_dirs):
    """The served schema of an application over the tiny runs (Schemathesis starts its
    lifespan, so the batcher runs, and calls it in-process)."""
    app = create_app(load_runs(run_dirs), LIMITS)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def operations(schema):
    found = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        found[operation.label] = operation
    return found


def test_the_schema_has_the_fuzzed_operations_and_the_servers_limits(api_schema):
    """Every operation the schema lists is fuzzed below (a new route must be added to GOOD);
    the limits and model names are in the request bodies."""
    assert set(operations(api_schema)) == set(GOOD)
    bodies = api_schema.raw_schema["components"]["schemas"]
    texts = bodies["TranslateRequest"]["properties"]["texts"]
    assert (texts["maxItems"], texts["items"]["maxLength"]) == (4, 40)
    assert bodies["TranslateRequest"]["properties"]["beam_size"]["maximum"] == 4
    model = bodies["GenerateRequest"]["properties"]["model"]["anyOf"][0]
    assert model["enum"] == ["numbers", "poet"]


def has_body(operation):
    return operation.definition.raw.get("requestBody") is not None


def fuzz_with(operation, mode, cases, statuses):
    """A Hypothesis test of ``operation``'s generated requests in ``mode``, counting the
    cases and the statuses of their answers."""
    @FUZZ
    @given(case=operation.as_strategy(mode))
    def fuzz(case):
        cases[mode.value] += 1
        response = case.call_and_validate(checks=CHECKS)
        statuses[response.status_code] += 1

    return fuzz


@pytest.mark.parametrize("label", sorted(GOOD))
def test_generated_requests_get_declared_answers_and_no_server_error(api_schema, label,
                                                                     record_property,
                                                                     capsys):
    operation = operations(api_schema)[label]
    # an operation without parameters or body has no invalid request to generate
    modes = MODES if has_body(operation) else MODES[:1]
    cases, statuses = collections.Counter(), collections.Counter()
    for mode in modes:
        fuzz_with(operation, mode, cases, statuses)()
    record_property("fuzz_cases", sum(cases.values()))
    with capsys.disabled():
        print(f"\nfuzz {label}: {dict(cases)} cases; statuses {dict(sorted(statuses.items()))}")
    for mode in modes:
        assert cases[mode.value] >= (EXAMPLES // 2 if has_body(operation) else 1), cases
    if has_body(operation):  # the fuzzer reached the model, not only the checks
        assert statuses[200] >= 5, statuses
        assert sum(n for status, n in statuses.items() if 400 <= status < 500) >= EXAMPLES
    good = operation.Case(body=GOOD[label]) if GOOD[label] else operation.Case()
    answer = good.call()
    assert answer.status_code == 200, answer.text
