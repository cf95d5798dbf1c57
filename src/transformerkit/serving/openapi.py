"""The served OpenAPI schema (``GET /openapi.json``): FastAPI's, derived from the request
bodies of :mod:`.schemas`, with this server's own bounds written in.

The bodies' pydantic models are the same for every server; what one server takes depends on
its :class:`~.limits.Limits` and its runs. So that a client (or a schema-driven test tool)
reading the schema sees what this server accepts, :func:`install` adds to the schema, once,
when it is first asked for: ``maxItems`` of ``texts`` (``--max-texts``), ``maxLength`` of
each text, prompt, source and target (``--max-chars``), ``maximum`` of ``max_new_tokens``
(``--max-new-tokens``), of ``beam_size`` and ``n_best`` (``--max-beam-size``), and the
names of the served runs (once loaded) as the ``enum`` of ``model``. What no schema can say is still
refused with a 422 naming the rule: an empty or whitespace-only text, a text of more tokens
than the model's ``max_length``, a route the named model does not serve (``/generate`` on a
Transformer), an option that contradicts another.
"""


def _constrain(properties, name, **keywords):
    """Add ``keywords`` to the non-null branches of property ``name`` (pydantic writes an
    optional field as ``anyOf: [{...}, {"type": "null"}]``)."""
    found = properties.get(name)
    if found is None:
        return
    for branch in found.get("anyOf", [found]):
        if branch.get("type") != "null":
            branch.update(keywords)


def with_limits(schema, limits, model_names):
    """``schema`` (an OpenAPI dict, changed in place and returned) with ``limits`` and the
    ``model_names`` written into the request bodies."""
    bodies = schema.get("components", {}).get("schemas", {})

    def properties(body):
        return bodies.get(body, {}).get("properties", {})

    texts = properties("TranslateRequest").get("texts")
    if texts is not None:
        texts["maxItems"] = limits.max_texts
        texts.setdefault("items", {})["maxLength"] = limits.max_chars
    _constrain(properties("GenerateRequest"), "prompt", maxLength=limits.max_chars)
    for name in ("source", "target"):
        _constrain(properties("AttentionRequest"), name, maxLength=limits.max_chars)
    for body in ("TranslateRequest", "GenerateRequest"):
        _constrain(properties(body), "max_new_tokens", maximum=limits.max_new_tokens)
    for name in ("beam_size", "n_best"):
        _constrain(properties("TranslateRequest"), name, maximum=limits.max_beam_size)
    if model_names:
        for body in ("TranslateRequest", "GenerateRequest", "AttentionRequest"):
            _constrain(properties(body), "model", enum=list(model_names))
    return schema


def install(app, limits, model_names):
    """Make ``app.openapi()`` answer the schema :func:`with_limits`, built on first use and
    kept (as FastAPI's own) once ``model_names()`` gives the served names; before that (None:
    the runs are still loading) it is built anew at each call, without the names."""
    plain = app.openapi

    def openapi():
        if app.openapi_schema is None:
            names = model_names()
            schema = with_limits(plain(), limits, names)
            app.openapi_schema = schema if names is not None else None
            return schema
        return app.openapi_schema

    app.openapi = openapi
