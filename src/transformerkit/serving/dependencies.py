"""What a route needs from its application, as FastAPI dependencies: the
:class:`~.registry.RunRegistry`, the :class:`~.batching.Batcher`, the
:class:`~.limits.Limits` and the :class:`~.metrics.ServerMetrics`.
:func:`~.app.create_app` sets each in ``app.state``
(:func:`install`); a route declares a parameter of the type below (``limits: ServerLimits``)
and FastAPI looks it up per request. The lookups are coroutines, so they run on the event
loop, not on a worker thread."""

from typing import Annotated

from fastapi import Depends, Request

from transformerkit.serving.batching import Batcher
from transformerkit.serving.limits import Limits
from transformerkit.serving.metrics import ServerMetrics
from transformerkit.serving.registry import RunRegistry


def install(app, registry, batcher, limits, metrics):
    """Hold the registry, batcher, limits and metrics in ``app.state`` for the lookups
    below."""
    app.state.registry = registry
    app.state.batcher = batcher
    app.state.limits = limits
    app.state.metrics = metrics


async def registry_of(request: Request) -> RunRegistry:
    return request.app.state.registry


async def batcher_of(request: Request) -> Batcher:
    return request.app.state.batcher


async def limits_of(request: Request) -> Limits:
    return request.app.state.limits


async def metrics_of(request: Request) -> ServerMetrics:
    return request.app.state.metrics


Registry = Annotated[RunRegistry, Depends(registry_of)]
ModelCalls = Annotated[Batcher, Depends(batcher_of)]
ServerLimits = Annotated[Limits, Depends(limits_of)]
Metrics = Annotated[ServerMetrics, Depends(metrics_of)]
