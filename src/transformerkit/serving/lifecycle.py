"""Whether the server takes requests: :class:`Lifecycle` (starting -> ready -> draining) and
:class:`Admission`, the middleware that refuses requests while the server is not ready and
counts the ones it lets in.

A server is "starting" while its models load (``GET /health``: 503), "ready" once they are
loaded and warmed (200), and "draining" from the moment it is told to stop (SIGTERM): it
takes no new requests (503 with ``Connection: close``, so a load balancer sends them to
another instance) and finishes the ones it has, then exits (:mod:`.shutdown`). "failed"
means the models could not be loaded; ``transformerkit serve`` then exits non-zero.
"""

import asyncio
import json

STARTING, READY, DRAINING, FAILED = "starting", "ready", "draining", "failed"

# paths answered in every state: the health probe, the metrics and the page (no model needed)
OPEN_PATHS = frozenset({"/health", "/metrics", "/"})

_REFUSALS = {
    STARTING: "the server is starting: its models are loading; try again shortly",
    DRAINING: "the server is shutting down; send the request to another instance",
    FAILED: "the server could not load its models; see its log",
    "stopped": "the server stopped before the request was done (its shutdown timeout "
               "passed); send it again",
}


class Lifecycle:
    """The state of one server process and the requests it is working on.

    ``state`` is ``"starting"``, ``"ready"``, ``"draining"`` or ``"failed"``; ``in_flight``
    counts the requests let in and not yet answered (a streamed answer until its body
    ends); :meth:`wait_idle` waits until there are none. The counting happens on the event
    loop; :meth:`drain` only sets the state, so a signal handler may call it.
    """

    def __init__(self, state=STARTING):
        self.state = state
        self.failure = None  # the exception that made the state "failed"
        self.loader = None  # the thread loading the runs, if they load in the background
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def ready(self):
        """Models loaded: take requests (unless the server is draining already)."""
        if self.state == STARTING:
            self.state = READY

    def drain(self):
        """Take no new requests from now on; the ones let in go on."""
        if self.state != FAILED:
            self.state = DRAINING

    def fail(self, error):
        """The models could not be loaded: refuse every request, remember why."""
        self.state = FAILED
        self.failure = error

    def enter(self):
        self.in_flight += 1
        self._idle.clear()

    def leave(self):
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout=None):
        """True once no request is in flight, False if ``timeout`` seconds pass first."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


class Admission:
    """ASGI middleware: a request for anything but :data:`OPEN_PATHS` gets a 503 JSON error
    (with ``Retry-After``; ``Connection: close`` while draining) unless ``lifecycle`` is
    ready; the requests it lets in are counted in ``lifecycle.in_flight`` until the
    application is done with them (a streamed body until it ends). A request cut off by
    the end of a drain gets a 503 too."""

    def __init__(self, app, lifecycle):
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        lifecycle = self.lifecycle
        if lifecycle.state != READY:
            await self._refuse(send, lifecycle.state)
            return
        lifecycle.enter()
        started = False

        async def watched_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except asyncio.CancelledError:
            # uvicorn cancels the requests left when the shutdown timeout passes: a 503
            # that says so, not its 500 and a traceback (the request ends here either way)
            if started or lifecycle.state != DRAINING:
                raise
            await self._refuse(send, "stopped")
        finally:
            lifecycle.leave()

    @staticmethod
    async def _refuse(send, state):
        body = json.dumps({"error": _REFUSALS[state], "status": 503}).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), (b"retry-after", b"1")]
        if state != STARTING:  # this instance will not serve again: let the client go
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
