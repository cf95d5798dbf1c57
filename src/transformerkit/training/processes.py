"""Several processes training one model: which process this is, and agreeing with the others.

A run of N processes (``torchrun --nproc_per_node N -m transformerkit train ...`` on PyTorch,
``KERAS_DISTRIBUTION_*`` or ``jax.distributed`` on JAX) has one :class:`ProcessGroup` per
process: its ``rank`` (0 .. N-1), ``size`` N and a few small collectives over the
backend's own library (``torch.distributed`` with gloo on CPU and NCCL with CUDA;
``jax.experimental.multihost_utils`` on JAX). Rank 0 alone writes files; every decision
that ends or shapes training (stop now, the early-stopping value, checkpoint state) is
agreed through these collectives so that every rank takes the same step.

:class:`~transformerkit.training.step.GradientAllReduce` (in ``training/step.py``, with the
step that calls it) is the PyTorch gradient exchange over these processes.

A collective that fails (a rank died, the network broke, a peer did not answer within
``train.process_timeout``) raises :class:`ProcessGroupError` (a ``ConnectionError``) that
says which rank noticed and how to continue (``--resume``).

JAX processes are joined by :func:`join_jax_processes` from Keras' own variables
``KERAS_DISTRIBUTION_JOB_ADDRESSES`` (the coordinator's ``host:port``, that of process 0),
``KERAS_DISTRIBUTION_NUM_PROCESSES`` and ``KERAS_DISTRIBUTION_PROCESS_ID``, the arguments
of ``jax.distributed.initialize``; CPU processes exchange data through gloo.
"""

import dataclasses
import datetime
import logging
import os
import subprocess
import sys

import numpy as np

from transformerkit import internals

log = logging.getLogger("transformerkit")

DEFAULT_TIMEOUT = 1800.0  # seconds; train.process_timeout's default (30m)
JAX_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID")


class ProcessGroupError(ConnectionError):
    """A rank could not reach the others (lost peer, timeout, unreachable rendezvous)."""


def torchrun_world_size():
    """``WORLD_SIZE`` that ``torchrun`` (or any ``env://`` launcher) set, else 1."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"WORLD_SIZE={value!r} is not an integer") from None


@dataclasses.dataclass
class ProcessGroup:
    """This process's place in the run. ``kind``: None (one process), ``"torch"`` or
    ``"jax"``; ``timeout``: seconds any collective may wait."""

    rank: int = 0
    size: int = 1
    kind: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    @property
    def is_main(self):
        """Whether this process writes the run's files (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self):
        return self.size > 1

    def lost(self, what, err):
        """The :class:`ProcessGroupError` to raise when the collective ``what`` failed with
        ``err`` (a JAX process then skips its shutdown barrier)."""
        if self.kind == "jax":
            _skip_jax_shutdown()
        return ProcessGroupError(
            f"rank {self.rank} of {self.size} lost contact with the other processes during "
            f"{what} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
            "another process died, was killed or did not answer within "
            f"train.process_timeout={self.timeout:g} s. Training stopped; start the same "
            "launch again with --resume to continue from the last checkpoint")

    def _device(self):
        import torch
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def sum(self, values, what="a reduction"):
        """Element-wise sum over ranks of a 1-D float array (float64 NumPy)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if not self.distributed:
            return values
        try:
            if self.kind == "torch":
                import torch
                import torch.distributed as dist

                tensor = torch.as_tensor(values, device=self._device())
                dist.all_reduce(tensor)
                return tensor.cpu().numpy()
            from jax.experimental import multihost_utils

            gathered = multihost_utils.process_allgather(values.astype(np.float32))
            return np.asarray(gathered, dtype=np.float64).reshape(self.size, -1).sum(0)
        except ProcessGroupError:
            raise
        except Exception as err:  # noqa: BLE001 - any backend failure is a lost peer
            raise self.lost(what, err) from err

    def any(self, flag, what="agreeing to stop"):
        """Whether ``flag`` is true on any rank (every rank gets the same answer)."""
        return bool(self.sum([1.0 if flag else 0.0], what)[0] > 0)

    def broadcast(self, value, what="a broadcast"):
        """Rank 0's JSON-like ``value`` on every rank."""
        if not self.distributed:
            return value
        try:
            if self.kind == "torch":
                import torch.distributed as dist

                box = [value]
                dist.broadcast_object_list(box, src=0, device=self._device())
                return box[0]
            return _jax_gather_objects(value)[0]
        except Exception as err:  # noqa: BLE001
            raise self.lost(what, err) from err

    def gather(self, value, what="a gather"):
        """Every rank's JSON-like ``value``, as a list in rank order, on every rank."""
        if not self.distributed:
            return [value]
        try:
            if self.kind == "torch":
                import torch.distributed as dist

                out = [None] * self.size
                dist.all_gather_object(out, value)
                return out
            return _jax_gather_objects(value)
        except Exception as err:  # noqa: BLE001
            raise self.lost(what, err) from err

    def barrier(self, what="a barrier"):
        """Wait until every rank gets here."""
        self.sum([0.0], what)


_jax_exit = {"status": None}  # set when this JAX process lost its peers or failed


def _skip_jax_shutdown(status=2):
    """End this JAX process at exit with ``status`` instead of ``jax.distributed``'s
    shutdown, whose barrier would wait for the lost or stuck processes until the heartbeat
    or shutdown timeout and then abort with a stack trace (status 134) after our error."""
    _jax_exit["status"] = status


def _install_jax_exit_handlers():
    """After joining several JAX processes: an ``atexit`` handler, registered after JAX's
    own and so run before it, that leaves at once (flushing the output) when
    :func:`_skip_jax_shutdown` was called; and an ``excepthook`` that calls it for an
    uncaught exception (status 1; 2 with a clear message when a collective failed, e.g. a
    gradient all-reduce whose peer died), so that the other processes see the connection
    close at once instead of waiting for this one."""
    import atexit

    def exit_now():
        if _jax_exit["status"] is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(_jax_exit["status"])

    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        previous(kind, value, traceback)
        text = str(value)
        lost = "Gloo" in text or "Connection reset" in text or "heartbeat" in text
        if lost:
            import jax

            sys.stderr.write(
                f"error: JAX process {jax.process_index()} of {jax.process_count()} lost "
                "contact with the other processes (a collective failed: another process "
                "died or was killed). Training stopped; start the same launch again with "
                "--resume to continue from the last checkpoint\n")
        _skip_jax_shutdown(2 if lost else 1)

    atexit.register(exit_now)
    sys.excepthook = excepthook


def _jax_gather_objects(value):
    """Every process's JSON text of ``value`` (padded bytes through ``process_allgather``)."""
    import json

    from jax.experimental import multihost_utils

    raw = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8)
    length = int(np.max(multihost_utils.process_allgather(np.array([len(raw)], np.int32))))
    padded = np.zeros(length, np.int32)
    padded[:len(raw)] = raw
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(-1, length)
    return [json.loads(bytes(row[row > 0].astype(np.uint8)).decode("utf-8")) for row in rows]


def jax_launch():
    """``(coordinator "host:port", process count, process id)`` from the
    ``KERAS_DISTRIBUTION_*`` variables, or None when ``KERAS_DISTRIBUTION_JOB_ADDRESSES`` is
    unset (one process). Raises ``ValueError`` naming a missing or malformed variable."""
    addresses = os.environ.get(JAX_VARIABLES[0], "").strip()
    if not addresses:
        return None
    values = []
    for name in JAX_VARIABLES[1:]:
        value = os.environ.get(name, "")
        try:
            values.append(int(value))
        except ValueError:
            raise ValueError(f"{JAX_VARIABLES[0]}={addresses!r} starts one of several JAX "
                             f"processes, which needs {name} as an integer; got "
                             f"{name}={value!r}") from None
    count, index = values
    if not 0 <= index < count:
        raise ValueError(f"{JAX_VARIABLES[2]}={index} must be in 0 .. {count - 1} "
                         f"({JAX_VARIABLES[1]}={count})")
    coordinator = addresses.split(",")[0].strip()  # Keras: the first address is process 0's
    if ":" not in coordinator:
        raise ValueError(f"{JAX_VARIABLES[0]}={addresses!r}: the coordinator needs a port, "
                         "as host:port (e.g. 10.0.0.1:1234)")
    return coordinator, count, index


# After argv[2] seconds, unless killed first, say argv[3] on stderr and stop the process
# argv[1] (SIGTERM; only while it is still this watchdog's parent, never a reused pid).
_WATCHDOG = """import os, signal, sys, time
parent = int(sys.argv[1])
time.sleep(float(sys.argv[2]))
if os.getppid() == parent:
    sys.stderr.write(sys.argv[3])
    sys.stderr.flush()
    os.kill(parent, signal.SIGTERM)
"""


def join_jax_processes(timeout_seconds=DEFAULT_TIMEOUT):
    """Initialize ``jax.distributed`` from the ``KERAS_DISTRIBUTION_*`` variables (see
    :func:`jax_launch`), once per process and before JAX touches a device; nothing when
    they are unset or ``jax.distributed`` is already initialized.

    Every process waits for all the others to connect; one that has not seen them all
    within ``timeout_seconds`` is stopped (SIGTERM) by a watchdog process that prints why on
    stderr (JAX itself would abort the process only after its own timeout, with a C++
    stack trace). The same
    timeout bounds JAX's heartbeat and its shutdown barrier, so that a job whose process
    died ends instead of waiting. Raises ``ValueError`` for malformed variables or when JAX
    already runs on its devices.
    """
    import jax

    launch = jax_launch()
    if launch is None or jax.distributed.is_initialized():
        return
    coordinator, count, index = launch
    timeout = float(timeout_seconds)
    # CPU processes exchange data through gloo; GPUs and TPUs use their own (NCCL, ICI)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")

    message = (f"error: JAX process {index} of {count} could not reach the other processes "
               f"through the coordinator at {coordinator} within train.process_timeout="
               f"{timeout:g} s; start all {count} processes with the same "
               f"{JAX_VARIABLES[0]} (process 0's host:port, reachable from every host) and "
               f"{JAX_VARIABLES[1]}, and each with its own {JAX_VARIABLES[2]}\n")
    # jax.distributed.initialize waits in C++ holding the GIL (and aborts with a C++ stack
    # trace after its own timeout), so the watchdog is a process of its own
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()),
                                 str(timeout), message])
    try:
        jax.distributed.initialize(
            coordinator, count, index, initialization_timeout=int(timeout) + 60,
            heartbeat_timeout_seconds=int(max(10, min(timeout, 100))),
            shutdown_timeout_seconds=int(max(10, timeout)))
    except RuntimeError as err:
        raise ValueError(f"could not join the JAX processes ({err}); JAX was already in use "
                         "before transformerkit read the KERAS_DISTRIBUTION_* variables") \
            from err
    finally:
        watchdog.kill()
        watchdog.wait()
    log.info("JAX process %d of %d (coordinator %s)", index, count, coordinator)
    _install_jax_exit_handlers()
    _build_saving_references()


def _build_saving_references():
    """Build the reference objects of Keras' saving code now, outside any distribution.

    ``model.save`` compares every object with a fresh ``Optimizer(1.0)`` (and Layer, Metric,
    Loss) to skip their attributes; under a ``keras.distribution`` of several processes
    that optimizer's variables go through ``jax.device_put`` to every process's devices, a
    collective that waits for the other processes, which are not saving (rank 0 writes
    alone). Keras caches these sets, but reads the cache under another key than it writes
    (``saving_attr_skiplist_`` / ``saving_attr_skipset_``, Keras 3.15): both are filled here.
    """
    skipset = internals.get("saving_attr_skipset")
    set_global = internals.get("set_global_attribute")
    if skipset is None or set_global is None:  # internals warned once: Keras builds them later
        return
    for kind in ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer",
                 "Loss"):
        set_global(f"saving_attr_skiplist_{kind}", skipset(kind))


def setup(timeout_seconds=DEFAULT_TIMEOUT):
    """The :class:`ProcessGroup` of this process, joining the others first if launched as
    one of several: on PyTorch by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment:
    ``init_process_group`` with NCCL when CUDA is present, else gloo, and the given timeout
    on every collective); on JAX by the ``KERAS_DISTRIBUTION_*`` variables
    (:func:`join_jax_processes`) or a ``jax.distributed.initialize`` of the caller's.
    One process: ``ProcessGroup()``.

    Raises ``ProcessGroupError`` when the other ranks cannot be reached within the timeout
    (a JAX process is stopped by a watchdog instead, see :func:`join_jax_processes`),
    ``ValueError`` for a torchrun launch on another backend than PyTorch.
    """
    import keras

    backend = keras.backend.backend()
    world = torchrun_world_size()
    timeout = float(timeout_seconds)
    if backend == "jax":
        import jax

        join_jax_processes(timeout)
        if world > 1 and jax.process_count() == 1:
            raise ValueError(
                f"WORLD_SIZE={world} (a torchrun launch) but the backend is JAX: torchrun "
                "starts PyTorch processes. Use --backend torch, or launch JAX processes with "
                "KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and _PROCESS_ID and "
                "train.distribution: data_parallel (README, 'Many processes')")
        if jax.process_count() > 1:
            group = ProcessGroup(jax.process_index(), jax.process_count(), "jax", timeout)
            log.info("process %d of %d (JAX, %s)", group.rank, group.size,
                     jax.devices()[0].platform)
            return group
        return ProcessGroup(timeout=timeout)
    if world <= 1:
        return ProcessGroup(timeout=timeout)
    if backend != "torch":
        raise ValueError(f"WORLD_SIZE={world} (a torchrun launch) needs the PyTorch backend; "
                         f"this process uses {backend!r}: run with --backend torch")
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    if not dist.is_initialized():
        use_cuda = torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        address = (f"{os.environ.get('MASTER_ADDR', '?')}:"
                   f"{os.environ.get('MASTER_PORT', '?')}")
        try:
            dist.init_process_group("nccl" if use_cuda else "gloo",
                                    timeout=datetime.timedelta(seconds=timeout))
            # the store's rendezvous does not wait for every rank: a first collective does
            tensor = torch.zeros(1, device="cuda" if use_cuda else "cpu")
            dist.all_reduce(tensor)
        except Exception as err:  # noqa: BLE001 - store timeouts, refused connections
            raise ProcessGroupError(
                f"rank {rank} of {world} could not reach the other processes at {address} "
                f"within {timeout:g} s ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); check that all "
                f"{world} processes were started with the same MASTER_ADDR/MASTER_PORT "
                "(torchrun --nnodes/--rdzv-endpoint) and that the address is reachable") from err
    group = ProcessGroup(dist.get_rank(), dist.get_world_size(), "torch", timeout)
    log.info("process %d of %d (%s)", group.rank, group.size, dist.get_backend())
    return group
