"""``train.precision``: float32, or mixed_bfloat16 (bfloat16 math, float32 weights).

Under ``mixed_bfloat16`` the layers compute in bfloat16 and keep float32 variables; the
numerically delicate parts stay in float32: the attention softmax
(:func:`transformerkit.layers.attention.scaled_dot_product_attention` casts its logits,
and the fused kernels of JAX and PyTorch accumulate the softmax in float32), layer
normalisation (Keras computes it in float32), the models' logits (cast to float32) and the
masked cross-entropy (computed in float32).
"""

import contextlib

import keras

from transformerkit.config import PRECISIONS


@contextlib.contextmanager
def precision_policy(name):
    """Set Keras' global dtype policy to ``name`` inside the block, then restore the old one
    (so one ``train`` call does not change the models a later call builds)."""
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {name!r}")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
