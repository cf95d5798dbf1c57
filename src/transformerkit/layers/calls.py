"""Sub-layer calls without Keras' per-call bookkeeping where it is moot (PyTorch eager).

The shortcuts here are taken only when :func:`transformerkit.fastpath.applies`; the plain
path (``layer(...)``, ``keras.ops``) is beside each of them. Which PyTorch kernel runs a
product, and how weights are packed for it, is :mod:`transformerkit.kernels`' job.
"""

import keras
from keras import ops

from transformerkit import fastpath, internals
from transformerkit.kernels.products import (
    dense_weights,
    inference_linear,
    kernels_and_biases,
    linear,
)

if keras.backend.backend() == "torch":
    import torch
    import torch.nn.functional as F

    from transformerkit.kernels.cast_once import TORCH_DTYPES

    # Keras activations by their torch kernels, as Keras' own PyTorch backend computes them
    # (``keras.activations.gelu`` is exact, ``approximate=False``; ``relu`` has no threshold).
    # Others (feedforward.gelu_tanh) are called as they are, on the torch tensor.
    _TORCH_ACTIVATIONS = {keras.activations.gelu: F.gelu, keras.activations.relu: F.relu,
                          keras.activations.silu: F.silu}


def call_sublayer(layer, *args, **kwargs):
    """``layer(*args, **kwargs)`` for a built sub-layer that this package's layers call with
    every mask and ``training`` argument given explicitly.

    On PyTorch, which runs eagerly, Keras' ``Layer.__call__`` spends more Python time per
    call (input conversion, call context, mask inference, name and autocast scopes) than a
    small layer's arithmetic, and each ``keras.ops`` function adds its own wrapper around
    the ``torch`` kernel. For a built layer called on PyTorch
    tensors of its compute dtype (floats; ids are not cast), with no autocast scope to open
    (compute dtype = variable dtype, or an enclosing mixed-precision scope of the layer's
    compute dtype already in force: the training step's, :func:`cast_once`, or Keras' own)
    and no distribution layout to apply, ``__call__`` does nothing but run ``layer.call``:
    this helper then calls ``layer.call`` directly, and for plain ``Dense`` and
    ``LayerNormalization`` layers (no LoRA, no quantization, last-axis normalisation) the
    same ``torch`` kernels that their ``call`` reaches through ``keras.ops``. Everywhere
    else (JAX and TensorFlow, which trace once; symbolic inputs; a layer that would open a
    scope of its own; a ``keras.distribution``) it is ``layer(*args, **kwargs)``. The
    outputs carry no Keras mask: callers pass masks on explicitly.
    """
    x = args[0]
    kind = type(layer).call
    if kind is keras.layers.LayerNormalization.call and not layer.rms_scaling \
            and layer.axis in (-1, [-1]) and not kwargs and _layer_norm_allowed(layer, x):
        return _layer_norm(layer, x)
    if not direct_call_allowed(layer, x):
        return layer(*args, **kwargs)
    if kind is keras.layers.Dense.call and not layer.lora_enabled \
            and layer.quantization_mode is None and not kwargs:
        return _dense(layer, x)
    return layer.call(*args, **kwargs)


def direct_call_allowed(layer, x):
    """Whether ``layer(x, ...)`` would only run ``layer.call(x, ...)`` (see
    :func:`call_sublayer`): the shortcuts apply to ``x`` (:func:`~transformerkit.fastpath.applies`),
    a built layer, an input of its compute dtype (or ids), no distribution layout to apply,
    and the autocast scope Keras' call would leave in force: none for a layer whose compute
    dtype is its variables' dtype, or an enclosing mixed-precision scope of the layer's
    compute dtype (Keras keeps that scope for an autocasting layer, and the weights the call
    reads are cast by it as under Keras' call)."""
    if not fastpath.applies(x):
        return False
    autocast_scope = internals.get("get_autocast_scope")
    if autocast_scope is None or not layer.built or keras.distribution.distribution() is not None:
        return False
    scope = autocast_scope()
    if scope is None:
        allowed = layer.compute_dtype == layer.variable_dtype
    else:
        allowed = layer.autocast and scope.dtype == layer.compute_dtype
    return allowed and (not x.is_floating_point()  # Keras would cast floats to compute_dtype
                        or keras.backend.standardize_dtype(x.dtype) == layer.compute_dtype)


def _layer_norm_allowed(layer, x):
    """Whether the ``LayerNormalization`` shortcut may replace ``layer(x)``: as
    :func:`direct_call_allowed`, or inside a mixed-precision autocast scope of the layer's
    compute dtype, where Keras' LayerNormalization (``autocast=False``: its float32 weights
    are never cast, nor its input) normalises in float32 and returns the compute dtype."""
    if direct_call_allowed(layer, x):
        return True
    autocast_scope = internals.get("get_autocast_scope")
    scope = None if autocast_scope is None else autocast_scope()
    return (scope is not None and fastpath.applies(x) and layer.built
            and not layer.autocast and scope.dtype == layer.compute_dtype
            and x.is_floating_point() and keras.distribution.distribution() is None)


def _dense(layer, x):
    """``Dense.call``: ``activation(x @ kernel + bias)``; without autograd (inference), by
    weights packed once (:func:`inference_linear`)."""
    if torch.is_grad_enabled():
        y = linear(x, dense_weights(layer))
    else:
        y = linear(x, inference_linear(*kernels_and_biases(layer)))
    if layer.activation is None:
        return y
    return _TORCH_ACTIVATIONS.get(layer.activation, layer.activation)(y)


def _layer_norm(layer, x):
    """``LayerNormalization.call`` over the last axis (``F.layer_norm``, as ``keras.ops``).
    Under mixed precision (a bfloat16 ``x``, float32 weights) PyTorch's kernel normalises in
    float32 and rounds its result to ``x``'s dtype once, as Keras' float32 normalisation and
    cast do; the output is then in the layer's compute dtype."""
    y = normalize(x, norm_weights(layer))
    dtype = layer.compute_dtype
    return y if keras.backend.standardize_dtype(y.dtype) == dtype else y.to(TORCH_DTYPES[dtype])


def norm_weights(layer):
    """A last-axis ``LayerNormalization``'s ``(gamma, beta or None, epsilon)``."""
    gamma = None if layer.gamma is None else layer.gamma.value
    return gamma, None if layer.beta is None else layer.beta.value, layer.epsilon


def normalize(x, weights):
    """LayerNorm over the last axis with ``weights`` from :func:`norm_weights`. A bfloat16
    ``x`` with float32 weights (mixed precision) is normalised in float32 and rounded to
    ``x``'s dtype once: PyTorch's CPU kernel does so itself, its CUDA kernel wants one dtype
    (then ``x`` is widened first: the same numbers)."""
    gamma, beta, epsilon = weights
    if gamma is not None and x.dtype != gamma.dtype and x.device.type != "cpu":
        return F.layer_norm(x.to(gamma.dtype), (x.shape[-1],), gamma, beta, epsilon).to(x.dtype)
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, epsilon)


def shape(x):
    """``keras.ops.shape(x)``; on PyTorch, for a torch tensor, its ``shape`` itself (the
    wrapper's symbolic-tensor checks are moot for a concrete tensor)."""
    if fastpath.applies(x):
        return x.shape
    return ops.shape(x)


def reshape(x, shape):
    """``keras.ops.reshape(x, shape)``; on PyTorch, for a torch tensor, ``x.reshape(shape)``
    itself (the ``keras.ops`` wrapper's checks for symbolic inputs are moot for it)."""
    if fastpath.applies(x):
        return x.reshape(shape)
    return ops.reshape(x, shape)


__all__ = ["call_sublayer", "direct_call_allowed", "norm_weights", "normalize", "reshape",
           "shape"]
