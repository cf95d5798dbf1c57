"""Data- and model-parallel training through ``keras.distribution`` (JAX backend).

``train.distribution`` picks one of:

- ``none``: one device (the default);
- ``data_parallel``: every device holds all weights and takes a slice of each batch; the
  gradients of the global batch are combined by XLA (``keras.distribution.DataParallel``);
- ``model_parallel``: a 2-D device mesh ``(batch, model)``; the attention and feed-forward
  kernels and the embeddings are split along ``model`` (Megatron style: Q/K/V and the inner
  feed-forward kernel by output columns, the attention output and outer feed-forward
  kernel by input rows), batches along ``batch`` (``keras.distribution.ModelParallel``).

Several processes (``data_parallel`` only; one per host, or several on one machine): every
process runs the same ``train`` with ``KERAS_DISTRIBUTION_JOB_ADDRESSES`` (process 0's
``host:port``), ``KERAS_DISTRIBUTION_NUM_PROCESSES`` and its own
``KERAS_DISTRIBUTION_PROCESS_ID``, which join ``jax.distributed``
(:func:`~transformerkit.training.processes.join_jax_processes`; or call
``jax.distributed.initialize`` yourself first). ``list_devices`` then sees every process's
devices, every process builds the same global batch and feeds its own contiguous share of
its rows (:class:`DivisibleBatches`); the gradients of the global batch are combined by
XLA's collectives (gloo between CPU processes).

A batch whose row count is not a multiple of the data-parallel width is padded with rows
of padding ids (0): the masked loss and accuracy ignore them, so the numbers are unchanged.
"""

import math

import keras
import numpy as np

from transformerkit.training.processes import DEFAULT_TIMEOUT, jax_launch, join_jax_processes

KINDS = ("none", "data_parallel", "model_parallel")

# Variable paths (``model.weights[i].path``) -> how they are split over the ``model`` axis.
# Kernels are (in, out): Q/K/V and the inner feed-forward kernel split their output columns
# (each device holds some heads / some hidden units), the attention output and the outer
# feed-forward kernel their input rows; embeddings (vocab, d_model) split d_model.
MODEL_PARALLEL_LAYOUT = {
    r".*/(query|key|value)/kernel": (None, "model"),
    r".*/(query|key|value)/bias": ("model",),
    r".*attention/output/kernel": ("model", None),
    r".*feedforward/inner/kernel": (None, "model"),
    r".*feedforward/inner/bias": ("model",),
    r".*feedforward/outer/kernel": ("model", None),
    r".*embedding.*/embeddings": (None, "model"),
    r".*output_projection/kernel": ("model", None),
}


def build_distribution(kind, num_devices=None, model_parallel_size=None,
                       timeout=DEFAULT_TIMEOUT):
    """A ``keras.distribution.Distribution`` for ``kind`` (see the module docstring), or None.

    Args:
        kind: ``"none"``, ``"data_parallel"`` or ``"model_parallel"``.
        num_devices: how many of ``keras.distribution.list_devices()`` to use (default all;
            with several processes all of them).
        model_parallel_size: size of the ``model`` mesh axis for ``model_parallel`` (default:
            all devices); the ``batch`` axis gets ``num_devices // model_parallel_size``.
        timeout: seconds to wait for the other processes of a ``KERAS_DISTRIBUTION_*``
            launch, if they were not joined yet (``processes.setup`` joins them first).

    Raises ``ValueError`` for an unknown kind, a backend other than JAX, device counts that
    do not fit, or several processes with another kind than ``data_parallel``.
    """
    if kind not in KINDS:
        raise ValueError(f"train.distribution must be one of {KINDS}, got {kind!r}")
    backend = keras.backend.backend()
    several = backend == "jax" and _several_jax_processes()
    if several and kind != "data_parallel":
        raise ValueError(f"several JAX processes (KERAS_DISTRIBUTION_* are set) train with "
                         f"train.distribution: data_parallel, got {kind!r}")
    if kind == "none":
        return None
    if backend != "jax":
        raise ValueError(f"train.distribution={kind} needs the JAX backend (keras.distribution "
                         f"is implemented for JAX only); this process uses {backend!r}: run "
                         "with --backend jax or KERAS_BACKEND=jax")
    from keras import distribution

    join_jax_processes(timeout)
    devices = distribution.list_devices()
    count = len(devices) if num_devices is None else int(num_devices)
    if not 1 <= count <= len(devices) or (several and count != len(devices)):
        raise ValueError(f"train.devices={num_devices}, but {len(devices)} device(s) are "
                         f"available{' (all of them with several processes)' * several}: "
                         f"{devices}")
    devices = devices[:count]
    # auto_shard_dataset=False: each process already feeds its own rows (DivisibleBatches)
    if kind == "data_parallel":
        return distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    model_size = count if model_parallel_size is None else int(model_parallel_size)
    if model_size < 1 or count % model_size:
        raise ValueError(f"train.model_parallel_size={model_parallel_size} must divide the "
                         f"number of devices ({count})")
    mesh = distribution.DeviceMesh((count // model_size, model_size), ("batch", "model"),
                                   devices=devices)
    layout_map = distribution.LayoutMap(mesh)
    for pattern, axes in MODEL_PARALLEL_LAYOUT.items():
        layout_map[pattern] = axes
    return distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch",
                                      auto_shard_dataset=False)


def _several_jax_processes():
    import jax

    return jax_launch() is not None or (jax.distributed.is_initialized()
                                        and jax.process_count() > 1)


def batch_multiple(dist):
    """Rows of a batch must be a multiple of this under ``dist`` (1 without one)."""
    if dist is None:
        return 1
    mesh = dist.device_mesh
    return int(mesh.shape[mesh.axis_names.index(dist.batch_dim_name)])


def check_model_parallel_shapes(model, dist):
    """Raise a clear error if a weight that ``dist`` splits is not divisible by its axis."""
    if not isinstance(dist, keras.distribution.ModelParallel):
        return
    mesh = dist.device_mesh
    for variable in model.weights:
        layout = dist.get_variable_layout(variable)
        for size, axis in zip(variable.shape, layout.axes, strict=False):
            parts = mesh.shape[mesh.axis_names.index(axis)] if axis else 1
            if size % parts:
                raise ValueError(f"model_parallel: {variable.path} has shape {variable.shape}; "
                                 f"its size {size} is not divisible by the {parts} devices of "
                                 f"the {axis!r} axis; change model_parallel_size or the model")


def pad_rows(array, multiple):
    """``(rows, ...)`` -> ``(ceil(rows / multiple) * multiple, ...)``, new rows all 0 (padding)."""
    extra = -len(array) % multiple
    if not extra:
        return array
    return np.concatenate([array, np.zeros((extra, *array.shape[1:]), array.dtype)])


class DivisibleBatches(keras.utils.PyDataset):
    """Wraps a batch dataset so that every batch has a multiple of ``multiple`` rows, and
    keeps this host's share of them (rows ``[p * n / P, (p + 1) * n / P)`` of host ``p`` of
    ``P``; all of them on one host).

    Padding rows hold only padding ids (0), which the masked loss and metrics ignore; the
    epoch methods (``set_epoch``, ``on_epoch_begin``/``end``) reach the wrapped dataset.
    """

    def __init__(self, dataset, multiple, process_index=0, process_count=1):
        super().__init__()
        self.dataset, self.multiple = dataset, int(multiple)
        self.process_index, self.process_count = int(process_index), int(process_count)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        def local_rows(array):  # (rows, ...) -> (padded_rows / process_count, ...)
            array = pad_rows(np.asarray(array), self.multiple)
            share = len(array) // self.process_count
            return array[self.process_index * share:(self.process_index + 1) * share]

        return keras.tree.map_structure(local_rows, self.dataset[i])

    def set_epoch(self, epoch):
        self.dataset.set_epoch(epoch)

    def on_epoch_begin(self):
        self.dataset.on_epoch_begin()

    def on_epoch_end(self):
        self.dataset.on_epoch_end()


def divisible(dataset, dist):
    """``dataset`` itself, or wrapped in :class:`DivisibleBatches` when ``dist`` needs it."""
    if dataset is None or dist is None:
        return dataset
    import jax

    multiple = batch_multiple(dist)
    count = jax.process_count()
    return DivisibleBatches(dataset, math.lcm(multiple, count), jax.process_index(), count)
