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
(:mod:`.dependencies`), which this factory sets. Until the runs are loaded, and from
SIGTERM on, :class:`~.lifecycle.Admission` answers 503 to all but ``/``, ``/health`` and
``/metrics``. Browsers let a page call the API only from
the server's own origin (its page at ``/``); ``cors_origins`` names other origins whose
pages may (Starlette's ``CORSMiddleware``). Status codes: 404 unknown model, 413 body too
large, 422 invalid request (types, unknown fields, empty or too long texts, limits), 400
body not JSON or not UTF-8, 415 a body not sent as JSON, 429 queue full, 503 timeout,
starting or draining.
"""

import asyncio
import contextlib
import logging
import threading

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

import transformerkit
from transformerkit.serving import dependencies, info_routes, metrics, model_routes, openapi
from transformerkit.serving.auth import BearerAuth, check_keys, document_keys
from transformerkit.serving.batching import Batcher
from transformerkit.serving.errors import add_error_handlers
from transformerkit.serving.lifecycle import Admission, Lifecycle
from transformerkit.serving.limits import BodySizeLimit, Limits
from transformerkit.serving.origins import check_origins
from transformerkit.serving.registry import RunRegistry, check_engine
from transformerkit.serving.schemas import ErrorResponse

log = logging.getLogger("transformerkit.serve")

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 404, 413, 415, 422, 429, 503)}


@contextlib.asynccontextmanager
async def lifespan(app):
    """The batcher's worker runs while the application does; runs given as a loader load
    meanwhile on a thread of their own (:func:`load_in_background`). The lifespan state
    (the ASGI spec's ``state``) carries the :class:`~.lifecycle.Lifecycle` to the server,
    which drains it on SIGTERM (:mod:`.shutdown`)."""
    lifecycle = app.state.lifecycle
    app.state.batcher.start()
    if app.state.load_runs is None:
        lifecycle.ready()
    else:
        load_in_background(app, app.state.load_runs)
    yield {"lifecycle": lifecycle}
    await app.state.batcher.stop()
    app.state.metrics.close()


def load_in_background(app, load_runs):
    """Call ``load_runs()`` on a daemon thread (the event loop answers ``/health``
    meanwhile); then, on the loop, install its runs and make the app ready, or, if it
    raised, log why and mark the lifecycle failed (``transformerkit serve`` then exits
    non-zero, for whatever restarts it to see)."""
    loop = asyncio.get_running_loop()
    lifecycle, engine = app.state.lifecycle, app.state.engine

    def loaded(registry):
        app.state.registry = registry
        lifecycle.ready()  # unless it is draining already
        log.info("loaded: %s (engine %s); %s", ", ".join(registry.names), engine,
                 lifecycle.state)

    def load():
        try:
            outcome, result = loaded, RunRegistry(load_runs(), engine)
        except Exception as error:  # noqa: BLE001 - any failure ends the server, logged
            expected = isinstance(error, (OSError, ValueError, TypeError))
            log.error("could not load the runs: %s: %s", type(error).__name__, error,
                      exc_info=not expected)
            outcome, result = lifecycle.fail, error
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
            loop.call_soon_threadsafe(outcome, result)

    lifecycle.loader = threading.Thread(target=load, name="transformerkit-load", daemon=True)
    lifecycle.loader.start()


def create_app(runs, limits=None, engine=None, cors_origins=(), api_keys=()):
    """A FastAPI application serving ``runs``.

    Args:
        runs: ``{name: transformerkit.api.Run}`` (the first is the default model; ready
            once started), or a function of no arguments returning that dict (such as
            ``functools.partial(server.load_runs, run_dirs)``), called on a thread of its
            own once the application starts: until it returns, ``GET /health`` says
            "starting" and every other request but ``/`` and ``/metrics`` gets a 503
            (:class:`~.lifecycle.Admission`); if it raises, the state is "failed".
        limits: a :class:`~.limits.Limits` (default: its defaults).
        engine: "keras" or "ctranslate2", passed to ``Run.translate`` / ``Run.generate``
            (attention always comes from the Keras model); None: the declared default of
            ``RuntimeOptions.engine``.
        cors_origins: origins (``https://host[:port]``, or ``*`` for any) whose pages may
            call the API from a browser; none by default (the server's own page only).
        api_keys: the keys a request may send as ``Authorization: Bearer KEY``
            (:class:`~.auth.BearerAuth`); none by default: anyone who reaches the server.
    """
    cors_origins = check_origins(cors_origins)
    api_keys = check_keys(api_keys, "api_keys")
    engine = check_engine(engine)
    load_runs = runs if callable(runs) else None
    registry = None if load_runs else RunRegistry(runs, engine)
    limits = limits or Limits()
    server_metrics = metrics.ServerMetrics()
    batcher = Batcher(window_s=limits.batch_window_ms / 1000, max_batch=limits.max_batch_texts,
                      queue_size=limits.queue_size, timeout_s=limits.timeout,
                      observer=server_metrics)
    app = FastAPI(title="transformerkit", version=transformerkit.__version__,
                  description="Translate, generate and look at attention with trained runs.",
                  docs_url=None, redoc_url=None, lifespan=lifespan, responses=_ERRORS)
    dependencies.install(app, registry, batcher, limits, server_metrics, Lifecycle())
    app.state.load_runs, app.state.engine = load_runs, engine
    app.state.page = info_routes.page_html()
    routers = (info_routes.router, model_routes.router, metrics.router)
    for router in routers:
        app.include_router(router)
    openapi.install(app, limits, lambda: getattr(getattr(app.state, "registry", None),
                                                 "names", None))
    app.add_middleware(BodySizeLimit, max_bytes=limits.max_body_bytes)
    app.add_middleware(Admission, lifecycle=app.state.lifecycle)
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
