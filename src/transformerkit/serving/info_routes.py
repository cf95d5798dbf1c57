"""The routes that describe the server: ``GET /`` (the page, ``page/index.html``, the only
file served, under a Content-Security-Policy that lets it talk to this server only),
``GET``/``HEAD /health`` (whether the server takes requests: :mod:`.lifecycle`) and
``GET /models`` (each run's config summary and metrics)."""

import importlib.resources
import os

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse

from transformerkit.serving.dependencies import ModelCalls, Registry, ServerLifecycle
from transformerkit.serving.lifecycle import READY

# the page may run its own inline script and style and talk to this server, nothing else
PAGE_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'")

router = APIRouter()


def page_html():
    """The page's HTML (package data: ``transformerkit/serving/page/index.html``)."""
    page = importlib.resources.files("transformerkit.serving") / "page" / "index.html"
    return page.read_text(encoding="utf-8")


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def index(request: Request):
    return HTMLResponse(request.app.state.page, headers={"Content-Security-Policy": PAGE_POLICY})


@router.head("/health", include_in_schema=False)  # for monitors that probe with HEAD
@router.get("/health", responses={503: {"description": "starting, draining or failed"}})
async def health(lifecycle: ServerLifecycle, registry: Registry, batcher: ModelCalls):
    """200 ``{"status": "ready", ...}`` while the server takes requests; 503 with the state
    ("starting", "draining" or "failed") otherwise, so a readiness probe or a load balancer
    sends requests elsewhere meanwhile. ``pid`` names the worker process that answered."""
    if lifecycle.state != READY:
        return JSONResponse({"status": lifecycle.state, "pid": os.getpid()}, status_code=503,
                            headers={"Retry-After": "1"})
    return {"status": READY, "models": registry.names, "engine": registry.engine,
            "waiting": len(batcher.waiting), "batches": batcher.batches,
            "in_flight": lifecycle.in_flight, "pid": os.getpid()}


@router.get("/models")
async def models(registry: Registry):
    return {"default": registry.default, "models": registry.summaries}
