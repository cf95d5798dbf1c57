"""The served OpenAPI schema carries the server's limits and model names
(``serving/openapi.py``): on the schema FastAPI derives from the model routes, no runs
needed; the request bodies take what the schema's types say. (``test_fuzz.py`` checks the
same on the served app, and that the server keeps to its schema.)"""

import pytest

pytest.importorskip("fastapi")
from fastapi import FastAPI  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from transformerkit.serving import model_routes, openapi  # noqa: E402
from transformerkit.serving.limits import Limits  # noqa: E402
from transformerkit.serving.schemas import GenerateRequest, TranslateRequest  # noqa: E402

LIMITS = Limits(max_texts=5, max_chars=70, max_new_tokens=9, max_beam_size=6)


def routes_app():
    app = FastAPI()
    app.include_router(model_routes.router)
    return app


def test_the_limits_and_names_are_written_into_the_request_bodies():
    schema = openapi.with_limits(routes_app().openapi(), LIMITS, ["numbers", "poet"])
    bodies = schema["components"]["schemas"]
    translate = bodies["TranslateRequest"]["properties"]
    assert translate["texts"]["maxItems"] == 5 and translate["texts"]["minItems"] == 1
    assert translate["texts"]["items"] == {"type": "string", "maxLength": 70}
    assert translate["beam_size"]["maximum"] == translate["n_best"]["maximum"] == 6
    # an optional field: the bound goes on its non-null branch
    assert translate["max_new_tokens"]["anyOf"] == [
        {"minimum": 1, "type": "integer", "maximum": 9}, {"type": "null"}]
    generate = bodies["GenerateRequest"]["properties"]
    assert generate["prompt"]["maxLength"] == 70 and generate["prompt"]["minLength"] == 1
    assert generate["max_new_tokens"]["anyOf"][0]["maximum"] == 9
    attention = bodies["AttentionRequest"]["properties"]
    assert attention["source"]["maxLength"] == attention["target"]["anyOf"][0]["maxLength"] == 70
    for body in ("TranslateRequest", "GenerateRequest", "AttentionRequest"):
        assert bodies[body]["properties"]["model"]["anyOf"] == [
            {"type": "string", "enum": ["numbers", "poet"]}, {"type": "null"}]


def test_the_schema_is_kept_once_the_names_are_known():
    app = routes_app()
    names = None
    openapi.install(app, LIMITS, lambda: names)
    loading = app.openapi()  # the runs are loading: no names, nothing kept
    assert "enum" not in loading["components"]["schemas"]["GenerateRequest"]["properties"][
        "model"]["anyOf"][0]
    assert loading["components"]["schemas"]["GenerateRequest"]["properties"]["prompt"][
        "maxLength"] == 70
    assert app.openapi_schema is None
    names = ["poet"]
    served = app.openapi()
    assert served["components"]["schemas"]["GenerateRequest"]["properties"]["model"][
        "anyOf"][0]["enum"] == ["poet"]
    assert app.openapi() is served is app.openapi_schema


def test_an_integer_written_as_a_float_is_the_integer_the_schema_says():
    """JSON Schema's ``integer`` takes 4.0 (Schemathesis sends such requests as valid);
    a fraction, a string, a boolean stay refused."""
    request = TranslateRequest.model_validate({"texts": ["a"], "beam_size": 4.0,
                                               "max_new_tokens": 1e3, "top_k": 2.0})
    assert (request.beam_size, request.max_new_tokens, request.top_k) == (4, 1000, 2)
    assert type(request.beam_size) is int
    assert GenerateRequest.model_validate({"prompt": "a", "seed": -3.0}).seed == -3
    for value in (4.5, "4", True, float("inf")):
        with pytest.raises(ValidationError, match="beam_size"):
            TranslateRequest.model_validate({"texts": ["a"], "beam_size": value})
    assert TranslateRequest.model_json_schema()["properties"]["beam_size"]["type"] == "integer"
