"""Graceful shutdown: :class:`DrainingServer`, a ``uvicorn.Server`` that drains before it
stops.

uvicorn by itself stops listening at the first SIGTERM, so a request sent after it gets
"connection refused" and a load balancer learns of the shutdown only from failures. Here
the first SIGTERM or SIGINT only makes the application's :class:`~.lifecycle.Lifecycle`
"draining": the server keeps its socket, answers new requests 503 (``Connection: close``)
and ``/health`` 503 "draining", and finishes every request it has, queued or running.
Once none is left, or ``shutdown_timeout`` seconds after the signal, it stops as uvicorn
does: it closes the socket, gives open connections ``CLOSE_GRACE_S`` seconds
(``timeout_graceful_shutdown``), and the application's lifespan stops the batcher. The
process then exits 0 (uvicorn would re-raise the signal and die by it). A second SIGINT
(Ctrl-C twice) stops at once, as in uvicorn; a later SIGTERM changes nothing.

The server finds the lifecycle in the lifespan state (``{"lifecycle": ...}``, set by
:func:`~.app.lifespan`). If the lifecycle turns "failed" (the runs could not be loaded)
the server stops and :attr:`DrainingServer.exit_code` is 1.
"""

import asyncio
import logging
import os
import signal
import sys
import time

import uvicorn

from transformerkit.serving.lifecycle import FAILED

log = logging.getLogger("transformerkit.serve")

CLOSE_GRACE_S = 2  # seconds open connections get once the requests are done


class DrainingServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose first SIGTERM/SIGINT drains the application for at most
    ``shutdown_timeout`` seconds before it stops (module docstring)."""

    def __init__(self, config, shutdown_timeout):
        super().__init__(config)
        self.shutdown_timeout = float(shutdown_timeout)
        self.exit_code = 0
        self._signalled_at = None  # time.monotonic() of the first signal
        self._drain = None  # the task waiting for the requests in flight

    def lifecycle(self):
        """The application's lifecycle, once its lifespan has started (else None)."""
        lifespan = getattr(self, "lifespan", None)
        return None if lifespan is None else lifespan.state.get("lifecycle")

    def handle_exit(self, sig, frame):
        """The signal handler (uvicorn installs it for SIGINT and SIGTERM); it runs between
        two steps of the event loop, so it only sets flags (``on_tick`` acts on them).
        uvicorn's own handler is not called: it records the signal to raise it again after
        the shutdown, which would end the process by SIGTERM instead of with status 0."""
        if self._signalled_at is None:
            self._signalled_at = time.monotonic()
            lifecycle = self.lifecycle()
            if lifecycle is None:  # not started yet: nothing to drain
                self.should_exit = True
            else:
                lifecycle.drain()
        elif sig == signal.SIGINT:  # Ctrl-C again: stop now, as uvicorn does
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter):
        """uvicorn's tick (every 0.1 s): also start the drain after a signal, and stop if
        the runs could not be loaded."""
        lifecycle = self.lifecycle()
        if self._signalled_at is not None and self._drain is None and lifecycle is not None:
            self._drain = asyncio.ensure_future(self._finish_requests(lifecycle))
        if lifecycle is not None and lifecycle.state == FAILED and not self.should_exit:
            self.exit_code = 1
            self.should_exit = True
        return await super().on_tick(counter)

    async def _finish_requests(self, lifecycle):
        left = self.shutdown_timeout - (time.monotonic() - self._signalled_at)
        log.info("draining: %d request(s) in flight; stopping once they are done or in "
                 "%.0f s", lifecycle.in_flight, max(left, 0))
        if not await lifecycle.wait_idle(max(left, 0)):
            log.warning("shutdown timeout (%g s) passed with %d request(s) in flight; "
                        "stopping anyway", self.shutdown_timeout, lifecycle.in_flight)
        self.should_exit = True


def exit_if_still_loading(server):
    """End this process now, with ``server.exit_code``, if the server stopped while its runs
    were still loading (a SIGTERM during start-up): the loading thread cannot be stopped,
    and the interpreter's normal exit would tear PyTorch down under it (an abort). Call it
    after ``server.run()`` in the process's main thread; it returns if nothing is loading."""
    lifecycle = server.lifecycle()
    loader = getattr(lifecycle, "loader", None)
    if loader is None or not loader.is_alive():
        return
    log.info("stopped while the runs were loading: exiting without waiting for them")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(server.exit_code)
