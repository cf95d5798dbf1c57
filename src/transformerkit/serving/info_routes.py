"""The routes that describe the server: ``GET /`` (the page, ``page/index.html``, the only
file served, under a Content-Security-Policy that lets it talk to this server only),
``GET``/``HEAD /health`` and ``GET /models`` (each run's config summary and metrics)."""

import importlib.resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from transformerkit.serving.dependencies import ModelCalls, Registry

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
@router.get("/health")
async def health(registry: Registry, batcher: ModelCalls):
    return {"status": "ok", "models": registry.names, "engine": registry.engine,
            "waiting": len(batcher.waiting), "batches": batcher.batches}


@router.get("/models")
async def models(registry: Registry):
    return {"default": registry.default, "models": registry.summaries}
