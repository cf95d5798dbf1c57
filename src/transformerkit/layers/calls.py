"""Sub-layer calls without Keras' per-call bookkeeping where it is moot (PyTorch eager).

The shortcuts here are taken only when :func:`transformerkit.fastpath.applies`; the plain
path (``layer(...)``, ``keras.ops``) is beside each of them.
"""

from typing import NamedTuple

import keras
from keras import ops

from transformerkit import fastpath, internals, precisions
from transformerkit.layers import lowprec

if keras.backend.backend() == "torch":
    import torch
    import torch.nn.functional as F
    from torch.utils.weak import WeakIdKeyDictionary

    # inference_linear's cache: first kernel -> {(kernel ids, transposed, precision): ((id,
    # version) of each source tensor, PackedLinear or LowPrecisionLinear)}, keyed by identity
    # (tensors compare elementwise); an entry lives as long as its first kernel
    _PACKED = WeakIdKeyDictionary()

    # Keras activations by their torch kernels, as Keras' own PyTorch backend computes them
    # (``keras.activations.gelu`` is exact, ``approximate=False``; ``relu`` has no threshold).
    # Others (feedforward.gelu_tanh) are called as they are, on the torch tensor.
    _TORCH_ACTIVATIONS = {keras.activations.gelu: F.gelu, keras.activations.relu: F.relu,
                          keras.activations.silu: F.silu}
    _TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                     "float16": torch.float16, "float64": torch.float64}


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
    return y if keras.backend.standardize_dtype(y.dtype) == dtype else y.to(_TORCH_DTYPES[dtype])


# Weights as torch tensors, and the two kernels that use them. The one-position decoder step
# (the ``step`` methods next to ``call`` in attention.py, blocks.py, feedforward.py) reads
# its weights with these once per decoded batch, its projections through inference_linear.

def dense_weights(layer):
    """A ``Dense`` layer's ``(kernel, bias or None)`` as torch tensors."""
    return layer.kernel.value, None if layer.bias is None else layer.bias.value


def kernels_and_biases(*layers):
    """``([kernel, ...], [bias or None, ...])`` of ``Dense`` layers as torch tensors, the
    arguments of :func:`inference_linear`."""
    return ([layer.kernel.value for layer in layers],
            [None if layer.bias is None else layer.bias.value for layer in layers])


def norm_weights(layer):
    """A last-axis ``LayerNormalization``'s ``(gamma, beta or None, epsilon)``."""
    gamma = None if layer.gamma is None else layer.gamma.value
    return gamma, None if layer.beta is None else layer.beta.value, layer.epsilon


def linear(x, weights, activation=None, low_output=False):
    """``x @ kernel + bias`` for ``weights = (kernel, bias or None)`` from
    :func:`dense_weights`: ``(..., d_in) -> (..., d_out)``, one ``addmm`` (``x`` as rows)
    (a large product under autograd: :class:`_OneDNNLinear`); or for :class:`PackedLinear`
    weights from :func:`inference_linear`, one oneDNN product; for bfloat16 or int8 weights
    (:class:`~transformerkit.layers.lowprec.LowPrecisionLinear`), their product.

    ``activation``: None or ``"relu"``, applied to the result (inside oneDNN's kernel, as
    its post-op, for packed weights: ``relu`` commutes with every rounding, so the numbers
    are the same). ``low_output``: a bfloat16 product may return its bfloat16 result as it
    is, for a consumer that widens it anyway (a residual sum, the next product); every
    other product returns float32."""
    if activation not in (None, "relu"):
        raise ValueError(f"linear: activation must be None or 'relu', got {activation!r}")
    if isinstance(weights, PackedLinear):
        return internals.get("onednn_linear")(x, weights.packed, weights.bias,
                                              activation or "none", [], "")
    if isinstance(weights, lowprec.LowPrecisionLinear):
        return lowprec.apply(x, weights, activation, low_output)
    kernel, bias = weights
    if _onednn_trains(x, kernel):
        y = _OneDNNLinear.apply(x.reshape(-1, x.shape[-1]), kernel, bias)
        y = y if x.dim() == 2 else y.view(*x.shape[:-1], kernel.shape[1])
    elif x.dim() == 2:
        y = torch.mm(x, kernel) if bias is None else torch.addmm(bias, x, kernel)
    elif bias is not None:  # one addmm: the bias inside the product's kernel, not a pass
        y = torch.addmm(bias, x.reshape(-1, x.shape[-1]), kernel).view(*x.shape[:-1],
                                                                        kernel.shape[1])
    else:
        y = torch.matmul(x, kernel)
    return y if activation is None else F.relu(y)


# The training step's products of at least this many multiply-adds (rows x d_in x d_out) take
# oneDNN's linear kernel for the forward product and the input gradient (:func:`linear`):
# the Transformer steps' products (2^28 and more) gain from it, while for smaller ones, such
# as nanoGPT's CPU recipe (2^23.6-2^25.6), the autograd function's Python costs more than the
# kernel saves (the A/B: docs/benchmarks.md, "Training step").
ONEDNN_TRAIN_MIN_MACS = 2 ** 27


def _onednn_trains(x, kernel):
    """Whether :func:`linear` takes :class:`_OneDNNLinear`: autograd recording, a float32 CPU
    product of at least :data:`ONEDNN_TRAIN_MIN_MACS` and oneDNN in this PyTorch."""
    return (torch.is_grad_enabled() and (x.requires_grad or kernel.requires_grad)
            and x.dtype == kernel.dtype == torch.float32 and x.device.type == "cpu"
            and x.numel() * kernel.shape[1] >= ONEDNN_TRAIN_MIN_MACS and _onednn_available())


if keras.backend.backend() == "torch":
    class _OneDNNLinear(torch.autograd.Function):
        """``x @ kernel + bias`` for ``x`` ``(rows, d_in)``, ``kernel`` ``(d_in, d_out)``: the
        product and the input gradient ``g @ kernel^T`` by oneDNN's linear kernel, the kernel
        gradient ``x^T @ g`` by ``torch.mm`` (MKL's was the faster one for it:
        docs/benchmarks.md, "Training step"). The same arithmetic as ``addmm``, to
        round-off."""

        @staticmethod
        def forward(ctx, x, kernel, bias):
            ctx.save_for_backward(x, kernel)
            ctx.has_bias = bias is not None
            # (d_out, d_in) as a transposed view: oneDNN reads the strides (a copy cost more)
            return internals.get("onednn_linear")(x, kernel.t(), bias, "none", [], "")

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            x, kernel = ctx.saved_tensors
            grad = grad.contiguous()
            grad_x = grad_kernel = grad_bias = None
            if ctx.needs_input_grad[0]:
                grad_x = internals.get("onednn_linear")(grad, kernel, None, "none", [], "")
            if ctx.needs_input_grad[1]:
                grad_kernel = torch.mm(x.t(), grad)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_bias = grad.sum(0)
            return grad_x, grad_kernel, grad_bias


def cast_once(dtype):
    """A Keras autocast scope (``keras.src.backend.AutocastScope``, through
    :mod:`transformerkit.internals`) to ``dtype`` that casts each float variable once while it
    is in force, not at every use: the mixed-precision training step
    (``training/step.py: TrainStep``) runs its forward pass in one, so that every weight's
    bfloat16 copy is made once per step. None where Keras lacks the scope class.

    A copy is keyed on the variable's tensor and its in-place version counter (an update
    writes a new version, which is cast anew). Where autograd records, each use is an
    autograd node of its own over the one copy (:class:`_CastOnceGrad`): its gradient
    reaches the float32 variable converted to float32 per use and summed there in float32,
    exactly as under Keras' scope, whose every use is a cast of its own. The copies live as
    long as the scope object: make one per step."""
    base = internals.get("autocast_scope")
    if base is None:
        return None
    if base not in _CAST_ONCE_CLASSES:
        _CAST_ONCE_CLASSES[base] = type("CastOnceScope", (base,), {
            "__doc__": cast_once.__doc__, "maybe_cast": _cast_once_maybe_cast})
    scope = _CAST_ONCE_CLASSES[base](dtype)
    scope.copies = {}
    return scope


_CAST_ONCE_CLASSES = {}


def _cast_once_maybe_cast(self, value):
    """``AutocastScope.maybe_cast`` with the copies of :func:`cast_once`."""
    if self.dtype is None or not isinstance(value, torch.Tensor) \
            or not value.is_floating_point():
        return super(type(self), self).maybe_cast(value)
    target = _TORCH_DTYPES[self.dtype]
    if value.dtype == target:
        return value
    entry = self.copies.get(id(value))
    version = internals.tensor_version(value)  # None: no counter, so cast at every use
    if entry is None or entry[0] is not value or version is None or entry[1] != version:
        with torch.no_grad():
            entry = (value, version, value.to(target))
        self.copies[id(value)] = entry
    if torch.is_grad_enabled() and value.requires_grad:
        return _CastOnceGrad.apply(value, entry[2])
    return entry[2]


if keras.backend.backend() == "torch":
    class _CastOnceGrad(torch.autograd.Function):
        """One use of :func:`cast_once`'s copy ``cast`` of ``master``: forward the copy (a
        view of it), backward the gradient converted to ``master``'s dtype, what the
        backward pass of ``master.to(cast.dtype)`` gives."""

        @staticmethod
        def forward(ctx, master, cast):
            ctx.master_dtype = master.dtype
            return cast.view_as(cast)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            return grad.to(ctx.master_dtype), None


class PackedLinear(NamedTuple):
    """Weights of :func:`linear` in oneDNN's blocked layout: ``packed`` holds the kernel
    transposed, ``(d_out, d_in)``, as an opaque oneDNN tensor; ``bias`` ``(d_out,)`` or None."""

    packed: object
    bias: object


def inference_linear(kernels, biases=None, transposed=False):
    """Weights for :func:`linear` without autograd (inference: the decoder step, which
    multiplies by the same matrices once per step with few rows, and ``Dense`` layers under
    ``torch.no_grad``): ``kernels`` ``(d_in, d_out_i)`` side by side (one product for
    several projections) and their ``biases`` (each None, or all given); ``transposed``: one
    ``(d_out, d_in)`` matrix instead (a tied embedding table).

    At the precision of :func:`transformerkit.layers.lowprec.current` (float32 unless a
    ``lowprec.using`` block says otherwise). For float32 weights on a CPU where that pays
    (:func:`_packs_float32`: PyTorch has oneDNN, as its x86 builds do, and the CPU is not
    Intel's, whose MKL products ``addmm`` runs are the faster there), the matrix is packed
    once into oneDNN's blocked layout (:class:`PackedLinear`), as PyTorch's own frozen
    graphs run their linear layers; at
    bfloat16 or int8, once into that precision's form (:func:`~transformerkit.layers.
    lowprec.pack`). A packed matrix is reused, per precision, until one of its source
    tensors changes (their in-place version counters: training steps and ``assign`` update
    weights in place; code that writes a weight behind PyTorch's back, through ``.data`` or a
    raw kernel, must call ``torch.autograd.graph.increment_version`` on it, as this
    package's fused Adam does). Elsewhere (float32) ``(kernel, bias)`` for ``addmm``.
    """
    biases = [None] * len(kernels) if biases is None else list(biases)
    precision = lowprec.current() if kernels[0].dtype == torch.float32 else "float32"
    packing = precision != "float32" or (kernels[0].device.type == "cpu"
                                         and kernels[0].dtype == torch.float32
                                         and _packs_float32())
    if packing:
        versions = tuple((id(t), internals.tensor_version(t))
                         for t in [*kernels, *biases] if t is not None)
        # the query kernel starts two products (qkv and query alone): the key names all
        key = (tuple(id(t) for t in kernels), transposed, precision)
        cached = _PACKED.get(kernels[0], {}).get(key)
        if cached is not None and cached[0] == versions:
            return cached[1]
    with torch.no_grad():
        bias = biases[0] if len(biases) == 1 or biases[0] is None else torch.cat(biases)
        if transposed:
            kernel = kernels[0].t()
        else:
            kernel = kernels[0] if len(kernels) == 1 else torch.cat(kernels, 1)
        if not packing:
            return kernel.contiguous(), bias
        if precision == "float32":
            packed = PackedLinear(internals.get("onednn_pack")(kernel.t().contiguous(),
                                                               _PACK_ROWS), bias)
        else:
            packed = lowprec.pack(kernel.t().contiguous(), bias, precision)
    if all(version is not None for _, version in versions):
        _PACKED.setdefault(kernels[0], {})[key] = (versions, packed)
    return packed


_PACK_ROWS = 64  # the rows oneDNN's layout is chosen for (any number of rows works with it)


def _onednn_available():
    """Whether :func:`inference_linear` may pack for oneDNN and :class:`_OneDNNLinear` may run:
    this PyTorch has oneDNN and its two linear kernels (:mod:`transformerkit.internals`)."""
    global _ONEDNN
    if _ONEDNN is None:
        _ONEDNN = (torch.backends.mkldnn.is_available() and internals.available("onednn_pack")
                   and internals.available("onednn_linear"))
    return _ONEDNN


_ONEDNN = None


def _packs_float32():
    """Whether :func:`inference_linear` packs float32 weights for oneDNN: where it can
    (:func:`_onednn_available`) on CPUs other than Intel's. PyTorch's ``addmm`` runs MKL's
    products, which are the faster on Intel CPUs and the slower on AMD's, where oneDNN's
    packed kernel wins (measured by ``bench/kernels.py``; docs/benchmarks.md). The choice is
    by vendor, not measured at run time, so that a machine always computes the same
    numbers."""
    global _FLOAT32_PACKING
    if _FLOAT32_PACKING is None:
        _FLOAT32_PACKING = (_onednn_available()
                            and precisions.cpu_vendor() != "GenuineIntel")
    return _FLOAT32_PACKING


_FLOAT32_PACKING = None


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


# PyTorch's CPU softmax vectorises each row over 16 floats (AVX-512; 8 with AVX2) and runs
# rows shorter than that through a scalar loop, several times slower per element (attention
# over 4-15 keys: a decoder's first steps, short captions and their padding buckets). Padded
# with -inf to 16 entries (exp(-inf) = 0: the same values), such rows take the vectorised
# kernel; rows of 1-3 entries are left as they are (``bench/kernels.py``; the timings:
# docs/benchmarks.md, "Kernel choices").
_SHORT_SOFTMAX = range(4, 16)


def softmax(x):
    """``keras.ops.softmax(x, axis=-1)``; on CPU PyTorch (a :mod:`transformerkit.fastpath`
    shortcut) rows of 4-15 entries are softmaxed padded with ``-inf`` to 16 entries (see
    ``_SHORT_SOFTMAX``), others by ``torch.softmax`` directly."""
    if not fastpath.applies(x):
        return ops.softmax(x, axis=-1)
    length = x.shape[-1]
    if length in _SHORT_SOFTMAX and x.device.type == "cpu":
        padded = F.pad(x, (0, 16 - length), value=float("-inf"))
        return padded.softmax(-1)[..., :length]
    return x.softmax(-1)
