"""The HTTP API over loaded runs: :func:`create_app`.

Routes (every error is a JSON ``{"error": ..., "status": ...}`` that says what was wrong,
:mod:`.errors`):

- ``GET /``: the page; ``GET /health``, ``GET /models`` (:mod:`.info_routes`);
- ``POST /translate``, ``POST /generate``, ``POST /attention`` (:mod:`.model_routes`;
  bodies: :mod:`.schemas`);
- ``GET /openapi.json``: the OpenAPI schema, with this server's limits and model names
  (:mod:`.openapi`; no ``/docs``: its viewer loads from a CDN);
- ``GET /metrics``: Prometheus metrics (:mod:`.metrics`; every answer is counted by its
  middleware, outside the others).

With ``api_keys`` every route but ``/`` and ``/health`` needs ``Authorization: Bearer KEY``
(:mod:`.auth`; 401 otherwise), as the OpenAPI schema says.

The routes find the runs, the batcher and the limits through FastAPI dependencies
(:mod:`.dependencies`), which this factory sets. Browsers let a page call the API only from
the server's own origin (its page at ``/``); ``cors_origins`` names other origins whose
pages may (Starlette's ``CORSMiddleware``). Status codes: 404 unknown model, 413 body too
large, 422 invalid request (types, unknown fields, empty or too long texts, limits), 400
body not JSON or not UTF-8, 415 a body not sent as JSON, 429 queue full, 503 timeout.
"""

import contextlib
import urllib.parse

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

import transformerkit
from transformerkit.serving import dependencies, info_routes, metrics, model_routes, openapi
from transformerkit.serving.auth import BearerAuth, check_keys, document_keys
from transformerkit.serving.batching import Batcher
from transformerkit.serving.errors import add_error_handlers
from transformerkit.serving.limits import BodySizeLimit, Limits
from transformerkit.serving.registry import RunRegistry
from transformerkit.serving.schemas import ErrorResponse

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 404, 413, 415, 422, 429, 503)}


def check_origins(origins):
    """``origins`` as a list if each is ``*`` or ``scheme://host[:port]`` (what a browser
    sends as ``Origin``), else a ``ValueError`` naming the bad one."""
    origins = list(origins or ())
    for origin in origins:
        if origin == "*":
            continue
        parts = urllib.parse.urlsplit(origin) if isinstance(origin, str) else None
        if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
                or origin != f"{parts.scheme}://{parts.netloc}" or parts.username):
            raise ValueError(f"CORS origin {origin!r} is not '*' or scheme://host[:port] "
                             "(for example https://app.example.com or http://localhost:3000)")
    return origins


@contextlib.asynccontextmanager
async def lifespan(app):
    """The batcher's worker runs while the application does."""
    app.state.batcher.start()
    yield
    await app.state.batcher.stop()
    app.state.metrics.close()


def create_app(runs, limits=None, engine="keras", cors_origins=(), api_keys=()):
    """A FastAPI application serving ``runs``.

    Args:
        runs: ``{name: transformerkit.api.Run}``; the first is the default model.
        limits: a :class:`~.limits.Limits` (default: its defaults).
        engine: "keras" or "ctranslate2", passed to ``Run.translate`` / ``Run.generate``
            (attention always comes from the Keras model).
        cors_origins: origins (``https://host[:port]``, or ``*`` for any) whose pages may
            call the API from a browser; none by default (the server's own page only).
        api_keys: the keys a request may send as ``Authorization: Bearer KEY``
            (:class:`~.auth.BearerAuth`); none by default: anyone who reaches the server.
    """
    cors_origins = check_origins(cors_origins)
    api_keys = check_keys(api_keys, "api_keys")
    registry = RunRegistry(runs, engine)
    limits = limits or Limits()
    server_metrics = metrics.ServerMetrics()
    batcher = Batcher(window_s=limits.batch_window_ms / 1000, max_batch=limits.max_batch_texts,
                      queue_size=limits.queue_size, timeout_s=limits.timeout,
                      observer=server_metrics)
    app = FastAPI(title="transformerkit", version=transformerkit.__version__,
                  description="Translate, generate and look at attention with trained runs.",
                  docs_url=None, redoc_url=None, lifespan=lifespan, responses=_ERRORS)
    dependencies.install(app, registry, batcher, limits, server_metrics)
    app.state.page = info_routes.page_html()
    routers = (info_routes.router, model_routes.router, metrics.router)
    for router in routers:
        app.include_router(router)
    openapi.install(app, limits, lambda: getattr(getattr(app.state, "registry", None),
                                                 "names", None))
    app.add_middleware(BodySizeLimit, max_bytes=limits.max_body_bytes)
    if api_keys:  # outside the body limit: a request without a key is not read
        app.add_middleware(BearerAuth, keys=api_keys)
        document_keys(app)
    app.add_middleware(metrics.RequestMetrics, metrics=server_metrics,  # counts 401s too
                       routers=(app.router, *routers))
    if cors_origins:  # added last, so outermost: errors (401, 413 too) carry its headers,
        # and preflights (which browsers send without the key) are answered
        app.add_middleware(CORSMiddleware, allow_origins=cors_origins,
                           allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "Authorization"], max_age=600)
    add_error_handlers(app)
    return app
