"""``train.precision``: auto, float32, or mixed_bfloat16 (bfloat16 math, float32 weights).

Under ``mixed_bfloat16`` the layers compute in bfloat16 and keep float32 variables; the
numerically delicate parts stay in float32: the attention softmax
(:func:`transformerkit.layers.attention.scaled_dot_product_attention` casts its logits,
and the fused kernels of JAX and PyTorch accumulate the softmax in float32), layer
normalisation (Keras computes it in float32), the models' logits (cast to float32) and the
masked cross-entropy (computed in float32). On eager PyTorch the training step casts each
weight to bfloat16 once per step (``training/step.py``, ``kernels/cast_once.py``)
and its products run on oneDNN's bfloat16 kernels (AVX512-BF16 or AMX).

``auto`` (the default) is resolved per machine by :func:`resolve_precision`:
``mixed_bfloat16`` where the bfloat16 step is the faster one, ``float32`` elsewhere.
"""

import contextlib
from typing import NamedTuple

import keras

from transformerkit import precisions
from transformerkit.config import TRAIN_POLICIES

# The widths from which the PyTorch CPU step gains from bfloat16 products: below it the
# casts and the float32 parts around the products cost more than the products save
# (bench/precision_step.py; docs/benchmarks.md, "Training step").
AUTO_MIN_D_MODEL = 128

class Precision(NamedTuple):
    """The precision a run trains in: ``used`` (a Keras dtype policy) and why."""

    used: str
    reason: str


def resolve_precision(name, d_model=None, backend=None):
    """The :class:`Precision` that ``train.precision: name`` means on this machine.

    ``float32``, ``mixed_bfloat16`` and ``mixed_float16`` mean themselves. ``auto``:

    - on a GPU: ``mixed_bfloat16`` where it has bfloat16 (PyTorch's
      ``torch.cuda.is_bf16_supported``; a TPU, or a JAX/TensorFlow GPU), else ``float32``;
    - on a CPU, PyTorch backend: ``mixed_bfloat16`` where the CPU has bfloat16 dot products
      (``amx_bf16`` or ``avx512_bf16`` in ``/proc/cpuinfo``), PyTorch has oneDNN, no
      ``ONEDNN_MAX_CPU_ISA`` cap keeps oneDNN below them, and the model is at least
      :data:`AUTO_MIN_D_MODEL` wide (``d_model``; None: not known, taken as wide enough);
      ``float32`` elsewhere: without those units PyTorch's bfloat16 products are emulated
      and many times slower (docs/benchmarks.md);
    - on a CPU, JAX and TensorFlow: ``float32`` (the bfloat16 CPU step made to pay is
      PyTorch's).

    The decision reads the flags and the environment only (nothing is timed); it is the
    same for every call in a process.
    """
    if name not in (*TRAIN_POLICIES, "auto"):
        raise ValueError(f"precision must be auto or one of {TRAIN_POLICIES}, got {name!r}")
    if name != "auto":
        return Precision(name, f"train.precision: {name}")
    backend = backend or keras.backend.backend()
    accelerator = _accelerator_bfloat16(backend)
    if accelerator is not None:
        return accelerator
    if backend != "torch":
        return Precision("float32", f"auto: CPU on the {backend} backend, where bfloat16 "
                                    "training is not faster (the fast bfloat16 CPU step is "
                                    "PyTorch's)")
    usable, why = precisions.bfloat16_units()  # the CPU's flags and oneDNN's cap
    if not usable:
        return Precision("float32", f"auto: {why}; bfloat16 would be emulated")
    import torch

    if not torch.backends.mkldnn.is_available():
        return Precision("float32", "auto: this PyTorch has no oneDNN (its bfloat16 "
                                    "products)")
    if d_model is not None and d_model < AUTO_MIN_D_MODEL:
        return Precision("float32", f"auto: d_model {d_model} < {AUTO_MIN_D_MODEL}: at this "
                                    "width the casts cost more than bfloat16 products save")
    return Precision("mixed_bfloat16", f"auto: {why}, oneDNN's bfloat16 products")


def _accelerator_bfloat16(backend):
    """:class:`Precision` for a run on an accelerator, or None on a CPU."""
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return None
        if torch.cuda.is_bf16_supported():
            return Precision("mixed_bfloat16", "auto: GPU with bfloat16")
        return Precision("float32", "auto: GPU without bfloat16")
    if backend == "jax":
        import jax

        platform = jax.default_backend()
        if platform == "cpu":
            return None
        return Precision("mixed_bfloat16", f"auto: {platform.upper()} (bfloat16)")
    if backend == "tensorflow":
        import tensorflow as tf

        if not tf.config.list_physical_devices("GPU"):
            return None
        return Precision("mixed_bfloat16", "auto: GPU (bfloat16)")
    return None


@contextlib.contextmanager
def precision_policy(name):
    """Set Keras' global dtype policy to ``name`` inside the block, then restore the old one
    (so one ``train`` call does not change the models a later call builds)."""
    if name not in TRAIN_POLICIES:
        raise ValueError(f"precision must be one of {TRAIN_POLICIES}, got {name!r}")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
