"""The server's Prometheus metrics (``prometheus_client``), served at ``GET /metrics``.

- :class:`ServerMetrics`: every metric of one application, on its own ``CollectorRegistry``
  (not the library's process-global one: two applications in one process keep their own
  counts, and importing this module registers nothing). It is also the batcher's observer
  (:mod:`.batching`): queue depth, inputs per model call, seconds per model call.
- :class:`RequestMetrics`: the ASGI middleware that counts every answer by route template,
  method and status and times it until its body ends (a streamed answer: its last chunk).
  It sits outside the API-key check and the body limit, so 401s and 413s are counted too.
  A path that matches no route is counted as the route ``unmatched`` and an unusual method
  as ``other``, so random paths cannot grow the number of series.
- :data:`router`: ``GET /metrics``, the classic text format (``text/plain; version=0.0.4``,
  what every Prometheus version reads and what prometheus_client answers a scraper that
  asks for nothing newer; the metric names need none of the newer formats' escaping).

With several worker processes the server sets ``PROMETHEUS_MULTIPROC_DIR`` to an empty folder
before the workers start (``prometheus_client`` chooses where values live when it is first
imported): each worker then writes its values to files there, and ``/metrics`` sums the
files of every worker (``prometheus_client.multiprocess.MultiProcessCollector``; the queue
depth gauge as the sum over the live workers, the counters and histograms over all, the
workers that ended too).
"""

import asyncio
import os
import time

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    multiprocess,
    values,
)
from starlette.routing import Match, Route

PREFIX = "transformerkit"
# request and model-call seconds: from a refusal in a millisecond to a long generation
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0, 120.0, 300.0)
INPUTS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # inputs in one model call
UNMATCHED = "unmatched"  # the route label of a path that matches no route
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
CLIENT_GONE = 499  # the status counted when the client left before any answer (as nginx)


def is_rejection(status):
    """Whether an answer refused the request: any 4xx (but :data:`CLIENT_GONE`), or 503
    (busy, starting, draining)."""
    return (400 <= status < 500 and status != CLIENT_GONE) or status == 503


def multiprocess_dir():
    """``PROMETHEUS_MULTIPROC_DIR`` if set (several workers), else None; a clear error if
    it names no folder or was set after ``prometheus_client`` was imported (its values
    would then live in this process only)."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return None
    if not os.path.isdir(path):
        raise ValueError(f"PROMETHEUS_MULTIPROC_DIR={path!r} is not a folder: create it (empty) "
                         "before the server starts")
    if values.ValueClass is values.MutexValue:
        raise RuntimeError("PROMETHEUS_MULTIPROC_DIR was set after prometheus_client was "
                           "imported; set it before the server process starts")
    return path


class ServerMetrics:
    """The metrics of one application (names: the table in ``docs/serving.md``); in
    multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set (:func:`multiprocess_dir`)."""

    def __init__(self):
        self.multiprocess_path = multiprocess_dir()
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            f"{PREFIX}_requests", "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"], registry=registry)
        self.request_seconds = Histogram(
            f"{PREFIX}_request_duration_seconds", "seconds from a request's arrival to the end "
            "of its answer's body, by route template", ["route"], buckets=SECONDS_BUCKETS,
            registry=registry)
        self.rejected = Counter(
            f"{PREFIX}_rejected", "requests refused (4xx, 503), by status", ["status"],
            registry=registry)
        self.queue = Gauge(
            f"{PREFIX}_queue_depth", "requests waiting for the model", registry=registry,
            multiprocess_mode="livesum")
        self.batch_inputs = Histogram(
            f"{PREFIX}_batch_size", "inputs (texts, prompts, sources) in one model call",
            buckets=INPUTS_BUCKETS, registry=registry)
        self.model_seconds = Histogram(
            f"{PREFIX}_model_call_seconds", "seconds of one model call (a batch)",
            buckets=SECONDS_BUCKETS, registry=registry)
        self.sentences = Counter(
            f"{PREFIX}_sentences", "texts translated (/translate) or generated (/generate) by "
            "the model calls, by model", ["model"], registry=registry)
        self.tokens = Counter(
            f"{PREFIX}_tokens", "tokens of those translations (the best of each) and "
            "continuations, as the model's tokenizer encodes them, by model", ["model"],
            registry=registry)
        if self.multiprocess_path is None:
            ProcessCollector(registry=registry)  # this process's CPU seconds, memory, files
            self._scraped = registry
        else:  # every worker's files, this one's included
            self._scraped = CollectorRegistry()
            multiprocess.MultiProcessCollector(self._scraped, path=self.multiprocess_path)

    # -- the batcher's observer ----------------------------------------------------------------
    def queue_depth(self, waiting):
        self.queue.set(waiting)

    def model_call(self, inputs, seconds):
        self.batch_inputs.observe(inputs)
        self.model_seconds.observe(seconds)

    # -- what the routes and the middleware report ------------------------------------------------
    def answered(self, route, method, status, seconds):
        """One HTTP answer of ``status`` to ``method`` on ``route``, ``seconds`` long."""
        self.requests.labels(route, method, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)
        if is_rejection(status):
            self.rejected.labels(str(status)).inc()

    def outputs(self, model, texts, tokenizer):
        """``texts`` (translations, continuations) that a call of ``model`` produced; their
        tokens as ``tokenizer`` encodes them (``Run.translate`` gives texts, not ids)."""
        self.sentences.labels(model).inc(len(texts))
        self.tokens.labels(model).inc(sum(len(tokenizer.encode(text)) for text in texts))

    # -- scrape and shutdown --------------------------------------------------------------------
    def exposition(self):
        """The metrics in Prometheus's text format (bytes), summed over the workers in
        multiprocess mode."""
        return generate_latest(self._scraped)

    def close(self):
        """At the end of this worker: in multiprocess mode, its live gauges (queue depth)
        leave the sums (its counters stay)."""
        if self.multiprocess_path is not None:
            multiprocess.mark_process_dead(os.getpid(), self.multiprocess_path)


def route_of(routers, scope):
    """The path template of the route of ``routers`` that ``scope`` matches (``/translate``),
    also when only its method is wrong (405); :data:`UNMATCHED` for any other path.

    ``routers``: the application's router (its own routes, ``/openapi.json``) and the
    routers it includes (FastAPI keeps an included router's routes out of the
    application's list).
    """
    partial = None
    for router in routers:
        for route in router.routes:
            if not isinstance(route, Route):  # an included router: named in ``routers``
                continue
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return route.path
            if match == Match.PARTIAL and partial is None:
                partial = route.path
    return partial or UNMATCHED


class RequestMetrics:
    """ASGI middleware: each HTTP request counted once in ``metrics`` (:meth:`ServerMetrics.
    answered`) with the status of its answer and the seconds until the answer's body ended,
    under the template of the route of ``routers`` it matches (:func:`route_of`).

    An exception with no answer sent is counted as the 500 Starlette then sends; a request
    cancelled before any answer (the client left) as :data:`CLIENT_GONE`.
    """

    def __init__(self, app, metrics, routers):
        self.app = app
        self.metrics = metrics
        self.routers = routers

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_of(self.routers, scope)
        method = scope["method"] if scope["method"] in METHODS else "other"
        started = time.perf_counter()
        status = None
        counted = False

        def count(code):
            nonlocal counted
            counted = True
            self.metrics.answered(route, method, code, time.perf_counter() - started)

        async def timed_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                count(status)

        try:
            await self.app(scope, receive, timed_send)
        except asyncio.CancelledError:
            if not counted:
                count(status or CLIENT_GONE)
            raise
        except Exception:
            if not counted:
                count(status or 500)
            raise
        if not counted:  # the answer's body never ended (its client left mid-stream)
            count(status or CLIENT_GONE)


router = APIRouter()


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {"text/plain": {"schema": {"type": "string"}}},
          "description": "Prometheus's text format"}})
async def metrics(request: Request):
    """The server's metrics in Prometheus's text format (``docs/serving.md``, Metrics)."""
    return Response(request.app.state.metrics.exposition(),
                    media_type=CONTENT_TYPE_PLAIN_0_0_4)
