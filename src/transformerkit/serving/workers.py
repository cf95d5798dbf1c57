"""Several worker processes (``transformerkit serve --workers N``): :func:`run_workers`.

uvicorn's own process manager (``uvicorn.supervisors.Multiprocess``) binds the socket once,
starts N worker processes (``spawn``) that accept on it, restarts a worker that dies, and
at SIGTERM or SIGINT sends SIGTERM to every worker and waits for them. Each worker builds
its application from an import string (``Config(..., factory=True)``), so each loads its
own copy of the models; the settings reach it as JSON in an environment variable
(:data:`SETTINGS_VARIABLE`, :func:`worker_settings`).

uvicorn 0.54 has no option for the server class its workers run: its ``Process`` always
runs a plain ``uvicorn.Server``. :class:`WorkerProcess` runs a
:class:`~.shutdown.DrainingServer` instead, so every worker drains at SIGTERM, and
:class:`Workers` is ``Multiprocess`` starting (and restarting) ``WorkerProcess`` es. uvicorn's
SIGHUP (restart the workers) and SIGTTIN (one more) are not offered.

Workers share the machine's cores: each sets torch's intra-op threads (or, with the
ctranslate2 engine, CTranslate2's) to its share (:func:`share_threads`). Metrics of several
processes need a folder they all write (prometheus-client's multiprocess mode): a fresh one
in ``PROMETHEUS_MULTIPROC_DIR`` unless the user set one (:func:`metrics_folder`).
"""

import contextlib
import functools
import json
import logging
import os
import sys
import tempfile

from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from transformerkit.serving.shutdown import DrainingServer, exit_if_still_loading
from transformerkit.threads import cores_available

log = logging.getLogger("transformerkit.serve")

SETTINGS_VARIABLE = "TRANSFORMERKIT_SERVE_SETTINGS"  # JSON, from serve to its workers
METRICS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def worker_settings():
    """The settings :func:`run_workers` passed to this worker process (a dict)."""
    try:
        return json.loads(os.environ[SETTINGS_VARIABLE])
    except KeyError:
        raise RuntimeError(f"{SETTINGS_VARIABLE} is not set: this factory builds the "
                           "application of a worker started by transformerkit serve "
                           "--workers") from None


def share_threads(workers, engine="keras"):
    """This worker's share of the cores, ``max(1, cores // workers)``: set as torch's
    intra-op threads for the keras and compiled engines, returned for the ctranslate2
    engine (its ``intra_threads``, which the caller passes on: PyTorch is not imported).
    Nothing when ``OMP_NUM_THREADS`` is set (the user chose), for one worker, or on another
    backend than torch. Returns the thread count, or None."""
    from transformerkit.backend import choose_default_backend

    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    threads = max(1, cores_available() // workers)
    if engine == "ctranslate2":
        return threads
    if choose_default_backend() != "torch":
        return None
    import torch

    torch.set_num_threads(threads)
    return threads


@contextlib.contextmanager
def metrics_folder():
    """``PROMETHEUS_MULTIPROC_DIR`` set to a fresh folder for the duration (removed after),
    unless the user set it already."""
    if os.environ.get(METRICS_VARIABLE):
        yield os.environ[METRICS_VARIABLE]
        return
    with tempfile.TemporaryDirectory(prefix="transformerkit-metrics-") as folder:
        os.environ[METRICS_VARIABLE] = folder
        try:
            yield folder
        finally:
            del os.environ[METRICS_VARIABLE]


class WorkerProcess(Process):
    """uvicorn's worker process, running a :class:`~.shutdown.DrainingServer`; it exits with
    uvicorn's ``STARTUP_FAILURE`` status when its runs could not be loaded."""

    def __init__(self, config, sockets, shutdown_timeout):
        self.shutdown_timeout = shutdown_timeout
        super().__init__(config, sockets)

    @functools.cached_property
    def server(self):  # created in the worker, where uvicorn's Process.target runs it
        return DrainingServer(config=self.config, shutdown_timeout=self.shutdown_timeout)

    def target(self, sockets=None):
        super().target(sockets)
        exit_if_still_loading(self.server)
        if self.server.exit_code:
            sys.exit(STARTUP_FAILURE)


class Workers(Multiprocess):
    """``Multiprocess`` with :class:`WorkerProcess` es; ``failed`` says whether a worker
    could not load the runs (the supervisor then stops every worker)."""

    def __init__(self, config, sockets, shutdown_timeout):
        super().__init__(config, sockets)
        self.shutdown_timeout = shutdown_timeout
        self.failed = False

    def start_worker(self):
        process = WorkerProcess(self.config, self.sockets, self.shutdown_timeout)
        process.start()
        return process

    def init_processes(self):
        self.processes = [self.start_worker() for _ in range(self.processes_num)]

    def keep_subprocess_alive(self):
        """uvicorn's: a worker that does not answer is killed and replaced, unless it
        exited because its runs could not be loaded (every worker would): then stop."""
        if self.should_exit.is_set():
            return
        for index, process in enumerate(self.processes):
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                log.error("worker %s could not load the runs; stopping", process.pid)
                self.failed = True
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            log.warning("worker %s died (exit status %s); starting another", process.pid,
                        process.exitcode)
            self.processes[index] = self.start_worker()

    def restart_all(self):  # SIGHUP
        log.warning("SIGHUP: transformerkit serve does not restart its workers in place; "
                    "restart the server")

    def handle_ttin(self):  # SIGTTIN
        log.warning("SIGTTIN: transformerkit serve keeps --workers workers")


def run_workers(config, settings, shutdown_timeout):
    """Serve with ``config.workers`` worker processes until SIGTERM or SIGINT; each builds
    its application from ``config.app`` (an import string of a factory reading
    ``settings``, :func:`worker_settings`). Returns 0, or 1 if the runs could not be
    loaded."""
    os.environ[SETTINGS_VARIABLE] = json.dumps(settings)
    try:
        with metrics_folder():
            supervisor = Workers(config, [config.bind_socket()], shutdown_timeout)
            supervisor.run()
    finally:
        del os.environ[SETTINGS_VARIABLE]
    return 1 if supervisor.failed else 0
