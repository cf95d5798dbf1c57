"""The products of the models' ``Dense`` layers on PyTorch: which kernel runs each, and
weights packed once for it.

- :func:`linear` multiplies by a layer's weights: ``addmm`` (MKL) for plain ``(kernel,
  bias)``, oneDNN's linear kernel for weights packed in its blocked layout
  (:class:`PackedLinear`), the low-precision kernels of :mod:`.lowprec` for bfloat16 or
  int8 weights, and oneDNN's kernel under autograd for the training step's large products
  (:class:`_OneDNNLinear`).
- :func:`inference_linear` packs a layer's weights once for inference, per precision,
  and reuses them until a source tensor changes.

The math is ``x @ kernel + bias`` everywhere (the paper's position-wise and attention
projections, ``layers/``); only the kernel and the weight layout change. The private
PyTorch functions used are listed in :mod:`transformerkit.internals`.
"""

from typing import NamedTuple

import keras

from transformerkit import internals, precisions
from transformerkit.kernels import lowprec
from transformerkit.kernels.lowprec import PACK_ROWS

if keras.backend.backend() == "torch":
    import torch
    import torch.nn.functional as F
    from torch.utils.weak import WeakIdKeyDictionary

    # inference_linear's cache: first kernel -> {(kernel ids, transposed, precision): ((id,
    # version) of each source tensor, PackedLinear or LowPrecisionLinear)}, keyed by identity
    # (tensors compare elementwise); an entry lives as long as its first kernel
    _PACKED = WeakIdKeyDictionary()


# Weights as torch tensors. The one-position decoder step (the ``step`` methods next to
# ``call`` in layers/attention.py, blocks.py, feedforward.py) reads its weights with these
# once per decoded batch, its projections through inference_linear.

def dense_weights(layer):
    """A ``Dense`` layer's ``(kernel, bias or None)`` as torch tensors."""
    return layer.kernel.value, None if layer.bias is None else layer.bias.value


def kernels_and_biases(*layers):
    """``([kernel, ...], [bias or None, ...])`` of ``Dense`` layers as torch tensors, the
    arguments of :func:`inference_linear`."""
    return ([layer.kernel.value for layer in layers],
            [None if layer.bias is None else layer.bias.value for layer in layers])


def linear(x, weights, activation=None, low_output=False):
    """``x @ kernel + bias`` for ``weights = (kernel, bias or None)`` from
    :func:`dense_weights`: ``(..., d_in) -> (..., d_out)``, one ``addmm`` (``x`` as rows)
    (a large product under autograd: :class:`_OneDNNLinear`); or for :class:`PackedLinear`
    weights from :func:`inference_linear`, one oneDNN product; for bfloat16 or int8 weights
    (:class:`~transformerkit.kernels.lowprec.LowPrecisionLinear`), their product.

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
# kernel saves (the A/B is in the message of the commit that set this threshold).
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
        gradient ``x^T @ g`` by ``torch.mm`` (MKL's was the faster one for it, measured
        with this class's commit). The same arithmetic as ``addmm``, to round-off."""

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


class PackedLinear(NamedTuple):
    """Weights of :func:`linear` in oneDNN's blocked layout: ``packed`` holds the kernel
    transposed, ``(d_out, d_in)``, as an opaque oneDNN tensor; ``bias`` ``(d_out,)`` or None."""

    packed: object
    bias: object


def inference_linear(kernels, biases=None, transposed=False, precision="float32", packed=True):
    """Weights for :func:`linear` without autograd (inference: the decoder step, which
    multiplies by the same matrices once per step with few rows, and ``Dense`` layers under
    ``torch.no_grad``): ``kernels`` ``(d_in, d_out_i)`` side by side (one product for
    several projections) and their ``biases`` (each None, or all given); ``transposed``: one
    ``(d_out, d_in)`` matrix instead (a tied embedding table).

    ``precision``: ``float32``, ``bfloat16`` or ``int8`` (resolved: :func:`~transformerkit.
    kernels.lowprec.resolve`), a value the caller passes (the decoder's and encoder's
    ``step_weights(precision)``); ``Dense`` layers called under ``torch.no_grad`` take
    float32. ``packed=False`` (float32 and bfloat16): plain tensors for a compiler that
    packs them itself, ``(kernel, bias)`` in float32 and a ``bfloat16-mm``
    :class:`~transformerkit.kernels.lowprec.LowPrecisionLinear` (``addmm`` in bfloat16).
    For float32 weights on a CPU where that pays
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
    if precision not in ("float32", "bfloat16", "int8"):
        raise ValueError(f"inference_linear takes a resolved precision (float32, bfloat16 or "
                         f"int8); got {precision!r}")
    if kernels[0].dtype != torch.float32:
        precision = "float32"
    packing = packed and (precision != "float32" or (kernels[0].device.type == "cpu"
                                                     and kernels[0].dtype == torch.float32
                                                     and _packs_float32()))
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
        if not packed and precision == "bfloat16":
            return lowprec.plain_bfloat16(kernel.t(), bias)
        if not packed and precision == "int8":
            return lowprec.plain_int8(kernel.t(), bias)
        if not packing:
            return kernel.contiguous(), bias
        if precision == "float32":
            packed = PackedLinear(internals.get("onednn_pack")(kernel.t().contiguous(),
                                                               PACK_ROWS), bias)
        else:
            packed = lowprec.pack(kernel.t().contiguous(), bias, precision)
    if all(version is not None for _, version in versions):
        _PACKED.setdefault(kernels[0], {})[key] = (versions, packed)
    return packed


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
    packed kernel wins (``bench/decode_precision.py --kernels``; docs/benchmarks.md). The choice is
    by vendor, not measured at run time, so that a machine always computes the same
    numbers."""
    global _FLOAT32_PACKING
    if _FLOAT32_PACKING is None:
        _FLOAT32_PACKING = (_onednn_available()
                            and precisions.cpu_vendor() != "GenuineIntel")
    return _FLOAT32_PACKING


_FLOAT32_PACKING = None
