"""Calls without Keras' per-call bookkeeping where it is moot: sub-layers we own, reshapes."""

import keras
from keras import ops

_EAGER_BACKEND = keras.backend.backend() == "torch"
if _EAGER_BACKEND:
    import torch
    import torch.nn.functional as F
    from keras.src.backend import get_autocast_scope  # no public accessor in Keras 3

FAST_CALLS = True  # module switch, for tests and benchmarks that compare both paths

# Keras activations by their torch kernels, as Keras' own PyTorch backend computes them
# (``keras.activations.gelu`` is exact, ``approximate=False``; ``relu`` has no threshold).
_TORCH_ACTIVATIONS = {keras.activations.gelu: F.gelu,
                      keras.activations.relu: F.relu} if _EAGER_BACKEND else {}


def call_sublayer(layer, *args, **kwargs):
    """``layer(*args, **kwargs)`` for a built sub-layer that this package's layers call with
    every mask and ``training`` argument given explicitly.

    On PyTorch, which runs eagerly, Keras' ``Layer.__call__`` costs about 0.1 ms of Python
    per call (input conversion, call context, mask inference, name and autocast scopes), and
    each ``keras.ops`` function some 20-60 us more around its ``torch`` kernel; a small GPT
    makes some fifty layer calls per forward pass, which made its training step ~40% slower
    than the same model in plain PyTorch (nanoGPT). For a built layer called on PyTorch
    tensors of its compute dtype (floats; ids are not cast), with no mixed-precision
    autocast (compute dtype = variable dtype) and no distribution layout to apply,
    ``__call__`` does nothing but run ``layer.call``: this helper then calls ``layer.call``
    directly, and for plain ``Dense`` and ``LayerNormalization`` layers (no LoRA, no
    quantization, last-axis normalisation) the same ``torch`` kernels that their ``call``
    reaches through ``keras.ops``. Everywhere
    else (JAX and TensorFlow, which trace once; symbolic inputs; mixed precision; a
    ``keras.distribution``) it is ``layer(*args, **kwargs)``. The outputs carry no Keras
    mask: callers pass masks on explicitly.
    """
    x = args[0]
    if not direct_call_allowed(layer, x):
        return layer(*args, **kwargs)
    kind = type(layer).call
    if kind is keras.layers.Dense.call and not layer.lora_enabled \
            and layer.quantization_mode is None and not kwargs:
        return _dense(layer, x)
    if kind is keras.layers.LayerNormalization.call and not layer.rms_scaling \
            and layer.axis in (-1, [-1]) and not kwargs:
        return _layer_norm(layer, x)
    return layer.call(*args, **kwargs)


def direct_call_allowed(layer, x):
    """Whether ``layer(x, ...)`` would only run ``layer.call(x, ...)`` (see
    :func:`call_sublayer`): eager PyTorch, a built layer, a torch tensor input of its compute
    dtype (or ids), no mixed-precision autocast (the layer's own or an enclosing one), no
    distribution layout to apply."""
    return (eager_torch_tensor(x) and layer.built
            and layer.compute_dtype == layer.variable_dtype and get_autocast_scope() is None
            and (not x.is_floating_point()  # Keras would cast float inputs to compute_dtype
                 or keras.backend.standardize_dtype(x.dtype) == layer.compute_dtype)
            and keras.distribution.distribution() is None)


def _dense(layer, x):
    """``Dense.call``: ``activation(x @ kernel + bias)``."""
    y = torch.matmul(x, layer.kernel.value)
    if layer.bias is not None:
        y = y + layer.bias.value
    if layer.activation is None:
        return y
    return _TORCH_ACTIVATIONS.get(layer.activation, layer.activation)(y)


def _layer_norm(layer, x):
    """``LayerNormalization.call`` over the last axis (``F.layer_norm``, as ``keras.ops``)."""
    gamma = None if layer.gamma is None else layer.gamma.value
    beta = None if layer.beta is None else layer.beta.value
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, layer.epsilon)


def eager_torch_tensor(x):
    """Whether ``x`` is a concrete PyTorch tensor on the PyTorch backend with the shortcuts on
    (:data:`FAST_CALLS`): where this package may call ``torch`` directly."""
    return FAST_CALLS and _EAGER_BACKEND and isinstance(x, torch.Tensor)


def shape(x):
    """``keras.ops.shape(x)``; on PyTorch, for a torch tensor, its ``shape`` itself (the
    wrapper's symbolic-tensor checks cost a few us a call, attention makes a dozen)."""
    if eager_torch_tensor(x):
        return x.shape
    return ops.shape(x)


def reshape(x, shape):
    """``keras.ops.reshape(x, shape)``; on PyTorch, for a torch tensor, ``x.reshape(shape)``
    itself: the ``keras.ops`` wrapper's checks (symbolic inputs, shape validation) cost
    ~20-40 us a call, and attention makes four reshapes per layer."""
    if eager_torch_tensor(x):
        return x.reshape(shape)
    return ops.reshape(x, shape)
