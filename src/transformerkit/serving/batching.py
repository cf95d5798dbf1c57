"""Requests that arrive together share one model call.

A request is a *job*: a list of inputs, a ``call`` that maps a list of inputs to the list of
their outputs (``lambda texts: run.translate(texts, beam_size=4)``), and a ``key``. Jobs
with the same key (not None) are compatible: one call on their inputs put end to end gives
each job its slice of the outputs. A job with key None always runs alone.

The worker takes the oldest waiting job and, unless its batch is full already, waits for
others (:meth:`Batcher._time_to_wait`): right after a batch, until the clients it answered
are back (for at most a quarter of its run time: under load, two halves of the clients
would otherwise take turns for ever); else until no job has arrived for ``window_s``. Then
it runs the oldest job together with every later waiting job of the same key, up to
``max_batch`` inputs, in one call on a single worker thread: one batch at a time, never on
the event loop. Jobs of other keys wait for the next round, in arrival order. When a shared
call raises ``ValueError`` or ``TypeError`` (a bad input), each of its jobs runs again
alone, so one bad input fails its own request only.

Bounds: at most ``queue_size`` jobs wait (:class:`QueueFull` beyond, the server's 429);
a job not done ``timeout_s`` after it arrived raises :class:`TimeoutError` (503) and, if it
has not started, is dropped from the queue. A job that answers as it goes (a streamed
generation) names an event it sets once its answer has begun: the timeout applies until
then.

An optional *observer* learns how the batches go, without this module knowing what it does
with that (the server's metrics, :mod:`.metrics`): ``observer.queue_depth(n)`` whenever the
number of waiting jobs changes, ``observer.model_call(inputs, seconds)`` after each model call
(``inputs``: how many went in; ``seconds``: how long it ran, failed calls too).
"""

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

MAX_WINDOWS = 10  # the longest a batch waits for more jobs, in collection windows
RETURN_PATIENCE = 0.25  # how long to wait for the clients just answered, in batch run times


class QueueFull(Exception):
    """The queue holds ``queue_size`` jobs already."""


@dataclass(eq=False)
class _Job:
    key: object
    inputs: list
    call: object
    future: asyncio.Future
    streams: bool = False  # answers as it goes (a streamed generation)
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """Collects jobs into batches and runs them one at a time on a worker thread.

    Args:
        window_s: how long the oldest waiting job waits for compatible ones (seconds).
        max_batch: inputs in one call (a job with more runs alone, whole).
        queue_size: jobs that may wait.
        timeout_s: seconds from a job's arrival to its result.
        observer: told of the queue depth and of each model call (see the module's
            docstring); None: nobody.

    Use inside a running event loop: :meth:`start`, then :meth:`submit` from request
    handlers, :meth:`stop` at shutdown.
    """

    def __init__(self, window_s=0.01, max_batch=64, queue_size=256, timeout_s=60.0,
                 observer=None):
        self.window_s = float(window_s)
        self.max_batch = int(max_batch)
        self.queue_size = int(queue_size)
        self.timeout_s = float(timeout_s)
        self.observer = observer
        self.waiting = []  # jobs in arrival order
        self.batches = 0  # model calls made (each may serve several jobs)
        self._free_since = 0.0  # when the last batch ended, its run time and jobs
        self._last_run_s = 0.0
        self._last_jobs = 0
        self._arrived = None
        self._task = None
        self._thread = None

    def start(self):
        self._arrived = asyncio.Event()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transformerkit-model")
        self._task = asyncio.get_running_loop().create_task(self._work())

    async def stop(self):
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for job in self.waiting:  # their requests end with the server
            job.future.cancel()
        self.waiting.clear()
        self._queue_changed()
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None

    async def submit(self, inputs, call, key=None, started=None):
        """The outputs of ``call(inputs)``, computed in a batch with compatible jobs.

        Raises :class:`QueueFull` at once when the queue is full, :class:`TimeoutError`
        after ``timeout_s``, and whatever ``call`` raised. ``started``: None, or an
        ``asyncio.Event`` that ``call`` sets (through the event loop) once its answer has
        begun, such as a stream's first piece: the timeout applies until then only.
        """
        if self._task is None:
            raise RuntimeError("the batcher is not running (call start() in the event loop)")
        if len(self.waiting) >= self.queue_size:
            raise QueueFull(f"{len(self.waiting)} requests are waiting already (the "
                            "server's --queue-size); try again shortly")
        job = _Job(key, list(inputs), call, asyncio.get_running_loop().create_future(),
                   streams=started is not None)
        self.waiting.append(job)
        self._queue_changed()
        self._arrived.set()
        try:
            if started is None:
                return await asyncio.wait_for(asyncio.shield(job.future), self.timeout_s)
            await asyncio.wait_for(_until_done_or_set(job.future, started), self.timeout_s)
            return await asyncio.shield(job.future)
        except asyncio.TimeoutError:
            if job in self.waiting:  # not started: nobody will run it now
                self.waiting.remove(job)
                self._queue_changed()
            job.future.cancel()  # a result that comes later is dropped
            raise TimeoutError(f"no result within {self.timeout_s:g} s (the server's "
                               "--timeout); the server is busy or the request is too "
                               "large") from None
        except asyncio.CancelledError:  # the client went away: drop the job if it waits
            if job in self.waiting:
                self.waiting.remove(job)
                self._queue_changed()
            job.future.cancel()
            raise

    def _queue_changed(self):
        if self.observer is not None:
            self.observer.queue_depth(len(self.waiting))

    def _take_batch(self):
        """The oldest job and the later waiting jobs of its key, within ``max_batch``."""
        first = self.waiting[0]
        batch, size = [first], len(first.inputs)
        if first.key is not None:
            for job in self.waiting[1:]:
                if job.key == first.key and size + len(job.inputs) <= self.max_batch:
                    batch.append(job)
                    size += len(job.inputs)
        for job in batch:
            self.waiting.remove(job)
        self._queue_changed()
        return batch

    def _batch_is_full(self):
        first = self.waiting[0]
        if first.key is None:
            return True
        return sum(len(j.inputs) for j in self.waiting if j.key == first.key) >= self.max_batch

    def _time_to_wait(self):
        """Seconds to wait for more jobs before the oldest job's batch runs (<= 0: now).

        Right after a batch, the clients it answered are likely to send again: wait for
        as many jobs as it had to arrive, for at most ``RETURN_PATIENCE`` of its run time
        (and at least ``window_s``). Otherwise the window opens when the oldest job
        arrived (or the model became free, if later) and closes once no job has arrived
        for ``window_s``, after at most ``MAX_WINDOWS`` windows.
        """
        if self._batch_is_full():
            return 0.0
        now = time.monotonic()
        patience = self._free_since + max(self.window_s, RETURN_PATIENCE * self._last_run_s)
        if self._last_jobs and now < patience:
            returned = sum(job.arrived > self._free_since for job in self.waiting)
            return 0.0 if returned >= self._last_jobs else patience - now
        opened = max(self.waiting[0].arrived, self._free_since)
        latest = max(opened, self.waiting[-1].arrived)
        return min(latest + self.window_s, opened + MAX_WINDOWS * self.window_s) - now

    async def _work(self):
        while True:
            if not self.waiting:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            wait = self._time_to_wait()
            if wait > 0:  # until then, or until the next job arrives
                self._arrived.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), wait)
                continue  # the oldest job may have timed out meanwhile
            batch = self._take_batch()
            self.batches += 1
            started = time.monotonic()
            try:
                await self._run(batch)
            except (ValueError, TypeError):  # one job's input spoiled it: each job alone
                if len(batch) > 1:
                    for job in batch:
                        with contextlib.suppress(Exception):
                            await self._run([job])
            except Exception as error:  # a fault of the server: every job gets it
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(error)
            self._free_since = time.monotonic()
            self._last_run_s = self._free_since - started
            # a stream's length says nothing of when clients return: no patience after one
            self._last_jobs = 0 if any(job.streams for job in batch) else len(batch)

    async def _run(self, batch):
        """Run ``batch`` in one call on the worker thread and hand each job its outputs (or
        the error, re-raised for the caller)."""
        inputs = [x for job in batch for x in job.inputs]
        try:
            outputs = await self._call(batch[0].call, inputs)
            if len(outputs) != len(inputs):
                raise RuntimeError(f"a batch of {len(inputs)} inputs gave {len(outputs)} "
                                   "outputs")
        except Exception as error:
            if len(batch) == 1 and not batch[0].future.done():
                batch[0].future.set_exception(error)
            raise
        start = 0
        for job in batch:
            if not job.future.done():
                job.future.set_result(outputs[start:start + len(job.inputs)])
            start += len(job.inputs)

    async def _call(self, call, inputs):
        """``call(inputs)`` on the worker thread, timed for the observer."""
        started = time.monotonic()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, call, inputs)
        finally:
            if self.observer is not None:
                self.observer.model_call(len(inputs), time.monotonic() - started)


async def _until_done_or_set(future, event):
    """Wait until ``future`` is done or ``event`` is set (cancelling neither)."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({future, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
