"""Several processes training one model: which process this is, and agreeing with the others.

A run of N processes (``torchrun --nproc_per_node N -m transformerkit train ...`` on PyTorch,
``KERAS_DISTRIBUTION_*`` or ``jax.distributed`` on JAX) has one :class:`ProcessGroup` per
process: its ``rank`` (0 .. N-1), ``size`` N and a few small collectives over the
backend's own library (``torch.distributed`` with gloo on CPU and NCCL with CUDA;
``jax.experimental.multihost_utils`` on JAX). Rank 0 alone writes files; every decision
that ends or shapes training (stop now, the early-stopping value, checkpoint state) is
agreed through these collectives so that every rank takes the same step.

:class:`GradientAllReduce` is the PyTorch gradient exchange: the gradients of all ranks,
flattened into buckets of about 25 MB, summed with ``all_reduce`` and divided by N, before
the optimizer step (what ``DistributedDataParallel`` does, here called from
``TransformerBase.train_step`` because a Keras model is not driven through a DDP wrapper).

A collective that fails (a rank died, the network broke, a peer did not answer within
``train.process_timeout``) raises :class:`ProcessGroupError` (a ``ConnectionError``) that
says which rank noticed and how to continue (``--resume``).
"""

import dataclasses
import datetime
import logging
import os

import numpy as np

log = logging.getLogger("transformerkit")

BUCKET_BYTES = 25 << 20  # DDP's default bucket size


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
    timeout: float = 1800.0

    @property
    def is_main(self):
        """Whether this process writes the run's files (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self):
        return self.size > 1

    def _fail(self, what, err):
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
            raise self._fail(what, err) from err

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
            raise self._fail(what, err) from err

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
            raise self._fail(what, err) from err

    def barrier(self, what="a barrier"):
        """Wait until every rank gets here."""
        self.sum([0.0], what)


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


def setup(timeout_seconds=1800.0):
    """The :class:`ProcessGroup` of this process, joining the others first if launched as
    one of several: on PyTorch by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment:
    ``init_process_group`` with NCCL when CUDA is present, else gloo, and the given timeout
    on every collective); on JAX after ``jax.distributed`` was initialized (see
    :mod:`transformerkit.training.distribution`). One process: ``ProcessGroup()``.

    Raises ``ProcessGroupError`` when the other ranks cannot be reached within the timeout,
    ``ValueError`` for a torchrun launch on another backend than PyTorch.
    """
    import keras

    backend = keras.backend.backend()
    world = torchrun_world_size()
    timeout = float(timeout_seconds)
    if backend == "jax":
        import jax

        if world > 1 and jax.process_count() == 1:
            raise ValueError(
                f"WORLD_SIZE={world} (a torchrun launch) but the backend is JAX: torchrun "
                "starts PyTorch processes. Use --backend torch, or launch JAX processes with "
                "KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and _PROCESS_ID and "
                "train.distribution: data_parallel (README, 'Many devices and processes')")
        if jax.process_count() > 1:
            return ProcessGroup(jax.process_index(), jax.process_count(), "jax", timeout)
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


class GradientAllReduce:
    """Averages gradients over the ranks of ``group``: ``__call__(grads) -> grads``, a list
    of torch tensors (or None, kept as None: every rank has the same unused weights).

    The gradients are concatenated into flat buckets of at most ``bucket_bytes`` (one
    tensor larger than that is a bucket of its own), each summed with one ``all_reduce``
    and divided by the number of ranks. ``replicas`` is that number (the models' token
    weighting reads it); ``bytes_per_call`` the bytes of the last call's buckets.
    """

    def __init__(self, group, bucket_bytes=BUCKET_BYTES):
        self.group = group
        self.replicas = group.size
        self.bucket_bytes = int(bucket_bytes)
        self.bytes_per_call = 0

    def __call__(self, grads):
        import torch
        import torch.distributed as dist

        present = [i for i, g in enumerate(grads) if g is not None]
        out = list(grads)
        buckets, current, size = [], [], 0
        for i in present:
            nbytes = grads[i].numel() * grads[i].element_size()
            if current and size + nbytes > self.bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        if current:
            buckets.append(current)
        self.bytes_per_call = 0
        try:
            for bucket in buckets:
                flat = torch.cat([grads[i].reshape(-1) for i in bucket])
                dist.all_reduce(flat)
                flat.div_(self.replicas)
                self.bytes_per_call += flat.numel() * flat.element_size()
                offset = 0
                for i in bucket:
                    count = grads[i].numel()
                    out[i] = flat[offset:offset + count].view_as(grads[i])
                    offset += count
        except Exception as err:  # noqa: BLE001
            raise self.group._fail("the gradient all-reduce", err) from err
        return out

    def wrap_apply(self, optimizer):
        """A context manager under which ``optimizer.apply(grads, variables)`` first averages
        ``grads`` over the ranks (Keras' own PyTorch ``train_step`` calls it)."""
        import contextlib

        @contextlib.contextmanager
        def wrapped():
            original = optimizer.apply

            def apply(grads, trainable_variables=None):
                return original(self(list(grads)), trainable_variables)

            optimizer.apply = apply
            try:
                yield
            finally:
                del optimizer.apply  # the class's method again

        return wrapped()
