"""Inference products in bfloat16 or int8: the weights packed once, everything else float32.

A model decodes at the precision it is given (``Run.translate(precision=...)``, ``translate
--precision``, ``serve --precision``), a value passed down the call chain: the decoding loop's
steps ask the model for its ``step_weights(precision)`` (the encoder's and the decoder's
products packed for it by :func:`transformerkit.kernels.products.inference_linear`, once per
precision: it is part of the cache key) and :func:`transformerkit.kernels.products.linear`
multiplies by them here. Nothing is set process- or context-wide: two calls at two
precisions may run side by side. The embeddings,
activations, attention scores and softmax, LayerNorm, the residual sums, the logits'
log-softmax and the search stay float32; each product takes a float32 input and gives a
float32 output.

- **bfloat16**: the weight rounded to bfloat16 and packed into oneDNN's blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``, the float32 path's kernels; AVX512-BF16 or
  AMX units), the input rounded to bfloat16, the products summed in float32, the output
  rounded to bfloat16 then widened. (The packed kernel, not ``addmm`` on a bfloat16 weight
  copy: faster on most of the decoder's products and emulated where oneDNN refuses
  bfloat16, where ``addmm`` is 24-50x slower: ``bench/decode_precision.py --kernels``.) Where
  oneDNN refuses bfloat16 (no such units, or ``ONEDNN_MAX_CPU_ISA`` below
  ``AVX512_CORE_BF16``), the same roundings are made around a float32 product (a warning
  says so once): the numbers of bfloat16, the speed of float32, never the 50x slower
  bfloat16 loop PyTorch has for such CPUs. Off CPU: ``addmm`` in bfloat16.
- **int8**: dynamic quantization with a scale per input row, as CTranslate2 has it. Each
  output channel of the weight has its own scale, ``max |w| / 127``, and int8 values
  ``round(w / scale)``, packed once (``torch.ops.quantized.linear_prepack``). Each row of
  the input is divided by its largest magnitude ``p`` and quantized to uint8 steps of
  ``2 / levels`` over ``[-1, 1]``; the products are summed in int32
  (``torch.ops.quantized.linear_dynamic``: FBGEMM or oneDNN, VNNI where present) and the
  row's result is multiplied back by ``p``. That kernel takes one scale per call, from its
  input's range: two anchor rows ``[1, 0, ...]`` and ``[-1, 0, ...]`` appended to the scaled
  rows fix that range to exactly ``[-1, 1]``, so a row's result never depends on the other
  rows of the call (with one scale per call, as ``torch.ao``'s dynamic ``Linear`` has it,
  a sentence's translation changed with the batch it was decoded in). The input uses all 8
  bits (255 levels) where the CPU has VNNI (its 8-bit dot products do not saturate) and 7
  bits (127) elsewhere (``reduce_range``). Where these kernels are missing, the same
  arithmetic runs in float32 (a warning says so once).

The private PyTorch functions used are listed in :mod:`transformerkit.internals`.
"""

import warnings
from typing import NamedTuple

from transformerkit import fastpath, internals, precisions

_TINY = 1.1754944e-38  # float32's smallest normal number
PACK_ROWS = 64  # the rows oneDNN's layout is chosen for (any number of rows works with it)
_warned = set()


def resolve(precision):
    """``(precision, why)`` with ``auto`` chosen for this machine
    (:func:`transformerkit.precisions.choose`); bfloat16 and int8 need the PyTorch backend
    with its fast paths on, else a clear ``ValueError``."""
    possible = fastpath.applies()
    chosen, why = precisions.choose(precision, low_precision_possible=possible)
    if chosen != "float32" and not possible:
        raise ValueError(
            f"precision {chosen} runs on the PyTorch backend with its fast paths on "
            f"({_why_not_fast()}); use precision float32 or auto here")
    return chosen, why


def _why_not_fast():
    import keras

    if keras.backend.backend() != "torch":
        return f"the Keras backend is {keras.backend.backend()}"
    return "TRANSFORMERKIT_FAST_PATHS turns them off"


class LowPrecisionLinear(NamedTuple):
    """Weights of :func:`transformerkit.kernels.products.linear` at bfloat16 or int8 (see the
    module docstring): ``kind`` names the kernel (``bfloat16``, ``bfloat16-emulated``,
    ``bfloat16-mm``, ``int8``, ``int8-emulated``), ``weight`` its packed weight, ``bias``
    the bias in the form the kernel takes (or None), ``extra`` the kernel's other argument
    (int8: ``reduce_range``), ``anchor`` int8's two anchor rows (:func:`_int8_rows`)."""

    kind: str
    weight: object
    bias: object
    extra: object = None
    anchor: object = None


def pack(weight, bias, precision):
    """``weight`` ``(d_out, d_in)`` float32 and ``bias`` ``(d_out,)`` or None, packed for
    ``precision`` (``bfloat16`` or ``int8``)."""
    import torch

    with torch.no_grad():
        if precision == "bfloat16":
            return _pack_bfloat16(weight, bias)
        if precision == "int8":
            return _pack_int8(weight, bias)
    raise ValueError(f"no low-precision packing for {precision!r}")


def _pack_bfloat16(weight, bias):
    import torch

    low_bias = None if bias is None else bias.to(torch.bfloat16)
    if weight.device.type != "cpu":
        return LowPrecisionLinear("bfloat16-mm", weight.t().to(torch.bfloat16).contiguous(),
                                  low_bias)
    reorder = internals.get("onednn_pack") if torch.backends.mkldnn.is_available() else None
    if reorder is not None and internals.available("onednn_linear"):
        try:
            return LowPrecisionLinear("bfloat16", reorder(weight.to(torch.bfloat16),
                                                          PACK_ROWS), low_bias)
        except RuntimeError as err:  # oneDNN without bfloat16 instructions (or capped)
            reason = str(err).splitlines()[0]
    else:
        reason = "this PyTorch has no oneDNN linear kernels"
    _warn_once("bfloat16", f"bfloat16 products are emulated at float32 speed ({reason}; "
                           f"{precisions.bfloat16_units()[1]})")
    rounded = weight.to(torch.bfloat16).float().t().contiguous()
    return LowPrecisionLinear("bfloat16-emulated", rounded,
                              None if bias is None else low_bias.float())


def plain_bfloat16(weight, bias):
    """``weight`` ``(d_out, d_in)`` float32 and ``bias`` ``(d_out,)`` or None as plain
    tensors for a compiler that packs them itself (``decoding/aot_step.py``): bfloat16 for
    ``addmm`` (kind ``bfloat16-mm``: the same roundings as the packed kernel's), or on a CPU
    whose oneDNN has no bfloat16 units the ``bfloat16-emulated`` float32 form (a compiled
    bfloat16 ``addmm`` would run PyTorch's slow bfloat16 loop there; a warning says so once)."""
    import torch

    with torch.no_grad():
        low_bias = None if bias is None else bias.to(torch.bfloat16)
        usable, reason = precisions.bfloat16_units()
        if weight.device.type != "cpu" or usable:
            return LowPrecisionLinear("bfloat16-mm", weight.t().to(torch.bfloat16).contiguous(),
                                      low_bias)
        _warn_once("bfloat16", f"bfloat16 products are emulated at float32 speed ({reason})")
        return LowPrecisionLinear("bfloat16-emulated",
                                  weight.to(torch.bfloat16).float().t().contiguous(),
                                  None if bias is None else low_bias.float())


def int8_weights(weight, bfloat16_scales=False):
    """``(values, scales)`` of ``weight`` ``(d_out, d_in)`` float32 quantized per output
    channel: ``scales`` ``(d_out,)`` = ``max |w| / 127`` (1 for an all-zero channel) and
    ``values`` = ``round(w / scale)`` as int8 in ``[-127, 127]`` (round half to even).
    ``bfloat16_scales``: each scale rounded up to the next bfloat16 (a kernel that takes them
    in bfloat16; rounded up, the values still fit), returned as bfloat16."""
    import torch

    peak = weight.abs().amax(1)
    scales = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
    if bfloat16_scales:
        low = scales.to(torch.bfloat16)
        # the next bfloat16 up where rounding went down (positive values: the next bit pattern)
        low = (low.view(torch.int16) + (low.float() < scales).to(torch.int16)).view(torch.bfloat16)
        values = torch.round(weight / low.float()[:, None]).clamp_(-127, 127).to(torch.int8)
        return values, low
    values = torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return values, scales


def plain_int8(weight, bias):
    """``weight`` ``(d_out, d_in)`` float32 and ``bias`` ``(d_out,)`` or None as plain tensors
    for a compiler (``decoding/aot_step.py``): int8 weights, kind ``int8-weights``, each output
    channel's :func:`int8_weights` (``values`` int8 ``(d_out, d_in)``, its ``scales``
    ``(d_out,)`` in bfloat16, in ``extra``), which a package takes in the form of
    :func:`rows_quantized_int8` (or, without its operators, :func:`widen_int8`). Applied as
    they are (:func:`apply`): the input rounded to bfloat16 (not quantized), the products
    summed in float32, multiplied by the channel's scale and rounded to bfloat16, the
    float32 bias added."""
    import torch

    with torch.no_grad():
        values, scales = int8_weights(weight, bfloat16_scales=True)
        return LowPrecisionLinear("int8-weights", values.contiguous(), _float_bias(bias),
                                  scales)


def rows_quantized_int8(weights):
    """``int8-weights`` ``weights`` (:func:`plain_int8`) as the compiled packages multiply
    them: kind ``int8-rows``, the same int8 values and scales (``extra``:
    ``(scales float32 (d_out,), zero points (d_out,), levels)``) by each input row quantized
    on its own scale, as the keras engine's int8 has it (:func:`_int8_rows`): the row divided
    by its largest magnitude ``p``, quantized to uint8 steps of ``2 / levels`` from zero point
    ``(levels + 1) // 2`` (``levels`` 255 where oneDNN may use the CPU's VNNI, else 127:
    :func:`~transformerkit.precisions.onednn_vnni`), the product of
    the dequantized values times ``p``. Written with PyTorch's quantize/dequantize operators
    (``torch.ao``'s decomposed ones), which Inductor's freezing replaces by an int8 product
    with the weight packed once (u8 by s8, int32 sums: oneDNN's, or under ``max_autotune``
    Inductor's own template where it times faster; the speeds against bfloat16 in
    ``bench/results/gpt2_generate_openvino.*`` and ``decode_compiled_search.*``). Where those
    operators are missing: :func:`widen_int8`."""
    import torch

    if not internals.available("quantized_decomposed"):
        return widen_int8(weights)
    levels = activation_levels(not precisions.onednn_vnni())  # oneDNN's kernel, its cap
    scales = weights.extra.float()
    zeros = torch.zeros(scales.shape, dtype=torch.long, device=scales.device)
    return LowPrecisionLinear("int8-rows", weights.weight, weights.bias,
                              (scales, zeros, levels), None)


def rows_quantized_weights(weights):
    """A tree of step weights (``step_weights(precision, packed=False)``) with each
    ``int8-weights`` leaf in the form that quantizes each input row (:func:`rows_quantized_int8`),
    the rest as given: the weights of a compiled package."""
    from torch.utils._pytree import tree_map

    def is_linear(leaf):
        return isinstance(leaf, LowPrecisionLinear)

    return tree_map(lambda leaf: rows_quantized_int8(leaf)
                    if is_linear(leaf) and leaf.kind == "int8-weights" else leaf,
                    weights, is_leaf=is_linear)


def widen_int8(weights):
    """``int8-weights`` ``weights`` (:func:`plain_int8`) with their values as bfloat16 ``(d_in,
    d_out)`` (exact): the same products by the library's bfloat16 kernel, for steps of many
    a package where :func:`rows_quantized_int8`'s operators are missing, which round each sum to
    bfloat16 once more, before its scale. On a CPU without bfloat16 units the values are
    float32 and the product float32, with the same roundings (a compiled bfloat16 product
    would run PyTorch's slow bfloat16 loop there)."""
    import torch

    usable, _ = precisions.bfloat16_units()
    dtype = torch.bfloat16 if usable or weights.weight.device.type != "cpu" else torch.float32
    return weights._replace(weight=weights.weight.t().to(dtype).contiguous())


def _pack_int8(weight, bias):
    import torch

    values, scales = int8_weights(weight)
    reduce_range = not precisions.has_vnni()
    names = ("int8_quantize", "int8_prepack", "int8_linear")
    if weight.device.type == "cpu" and all(internals.available(n) for n in names):
        try:
            with warnings.catch_warnings():  # quantized tensors are deprecated: our one use
                warnings.simplefilter("ignore", UserWarning)
                # values * scale quantizes back to exactly ``values`` (|error| << 1/2)
                quantized = internals.get("int8_quantize")(
                    values.float() * scales[:, None], scales.double(),
                    torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)
                packed = internals.get("int8_prepack")(quantized, None)
            return LowPrecisionLinear("int8", packed, _float_bias(bias), reduce_range,
                                      _unit_anchor(weight))
        except RuntimeError as err:
            reason = str(err).splitlines()[0]
    else:
        reason = ("not on CPU" if weight.device.type != "cpu"
                  else "this PyTorch lacks its quantized linear kernels")
    _warn_once("int8", f"int8 products are emulated in float32 ({reason})")
    dequantized = (values.float() * scales[:, None]).t().contiguous()  # (d_in, d_out)
    return LowPrecisionLinear("int8-emulated", dequantized, _float_bias(bias), reduce_range,
                              _unit_anchor(weight))


def _float_bias(bias):
    return None if bias is None else bias.float().contiguous()


def _unit_anchor(weight):
    """Two rows ``(2, d_in)``, ``[1, 0, ...]`` and ``[-1, 0, ...]``, appended to the scaled
    input of every int8 call so that the kernel's range is exactly ``[-1, 1]``."""
    import torch

    anchor = torch.zeros((2, weight.shape[1]), dtype=torch.float32, device=weight.device)
    anchor[0, 0], anchor[1, 0] = 1.0, -1.0
    return anchor


def activation_levels(reduce_range):
    """The uint8 levels an int8 product quantizes its input to: 127 with ``reduce_range``
    (7 bits), else 255."""
    return 127 if reduce_range else 255


def apply(x, weights, activation=None, low_output=False):
    """``activation(x @ W^T + b)`` for :class:`LowPrecisionLinear` ``weights``; ``x``
    ``(..., d_in)`` float32 (or the bfloat16 output of another product), the result
    ``(..., d_out)`` float32, or bfloat16 where ``low_output`` and the kernel gives it
    (see :func:`transformerkit.kernels.products.linear`). ``activation``: None or ``"relu"``."""
    import torch
    import torch.nn.functional as F

    rows = x.reshape(-1, x.shape[-1])
    kind = weights.kind
    if kind == "bfloat16":  # relu as oneDNN's post-op, before the rounding: the same numbers
        low = rows if rows.dtype == torch.bfloat16 else rows.to(torch.bfloat16)
        y = internals.get("onednn_linear")(low, weights.weight, weights.bias,
                                           activation or "none", [], "")
        y = y if low_output else y.float()
    else:
        rows = rows.float()
        if kind == "bfloat16-emulated":
            low = rows.to(torch.bfloat16).float()
            y = torch.mm(low, weights.weight) if weights.bias is None else \
                torch.addmm(weights.bias, low, weights.weight)
            y = y.to(torch.bfloat16).float()
        elif kind == "bfloat16-mm":
            low = rows.to(torch.bfloat16)
            y = (torch.mm(low, weights.weight) if weights.bias is None
                 else torch.addmm(weights.bias, low, weights.weight)).float()
        elif kind == "int8-weights":
            y = _int8_weights_rows(rows.to(torch.bfloat16), weights)
        elif kind == "int8-rows":
            y = _int8_quantized_rows(rows, weights)
        else:
            y = _int8_rows(rows, weights)
        if activation is not None:  # "relu", the one :func:`products.linear` allows
            y = F.relu(y)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])


def _int8_weights_rows(low, weights):
    """The product of bfloat16 rows ``low`` ``(m, d_in)`` by ``int8-weights`` (int8 values:
    float32 arithmetic, the output rounded once; widened ones from :func:`widen_int8`: ``mm``,
    its sums rounded, then the scales), float32 ``(m, d_out)``."""
    import torch

    if weights.weight.dtype != torch.int8:  # widened: the sums rounded, then scaled
        y = torch.mm(low.to(weights.weight.dtype), weights.weight).to(torch.bfloat16) \
            * weights.extra
    else:
        y = (torch.mm(low.float(), weights.weight.t().float())
             * weights.extra.float()).to(torch.bfloat16)
    y = y.float()
    return y if weights.bias is None else y + weights.bias


def _int8_rows(rows, weights):
    """An int8 product with each row of ``rows`` ``(m, d_in)`` quantized on its own scale:
    the row divided by its largest magnitude ``p`` (so within ``[-1, 1]``), the two anchor
    rows appended (the call's range is then exactly ``[-1, 1]``, whatever the other rows
    hold), the per-tensor kernel's output for the row multiplied back by ``p``."""
    import torch

    # (m, 1), each row's largest magnitude (a row of zeros: any positive divisor)
    peak = rows.abs().amax(1, keepdim=True).clamp_(min=_TINY)
    unit = torch.cat([rows / peak, weights.anchor])
    if weights.kind == "int8":
        y = internals.get("int8_linear")(unit, weights.weight, weights.extra)[:-2]
    else:  # int8-emulated
        y = _int8_emulated(unit, weights)[:-2]
    return y * peak if weights.bias is None else torch.addcmul(weights.bias, y, peak)


def _int8_quantized_rows(rows, weights):
    """The product of float32 ``rows`` ``(m, d_in)`` by ``int8-rows`` weights
    (:func:`rows_quantized_int8`), each row quantized on its own scale, float32 ``(m, d_out)``."""
    import torch
    import torch.nn.functional as F

    ops = torch.ops.quantized_decomposed  # registered where ``available``
    scales, zeros, levels = weights.extra
    step, zero = 2.0 / levels, (levels + 1) // 2
    peak = rows.abs().amax(1, keepdim=True).clamp(min=_TINY)
    quantized = ops.quantize_per_tensor.default(rows / peak, step, zero, 0, levels, torch.uint8)
    unit = ops.dequantize_per_tensor.default(quantized, step, zero, 0, levels, torch.uint8)
    weight = ops.dequantize_per_channel.default(weights.weight, scales, zeros, 0, -128, 127,
                                                torch.int8)
    y = F.linear(unit, weight)
    return y * peak if weights.bias is None else torch.addcmul(weights.bias, y, peak)


def _int8_emulated(rows, weights):
    """The int8 kernel's arithmetic in float32, without the bias: the input quantized to
    uint8 with one scale and zero point (FBGEMM's choice: the range of the values and 0, the
    zero point rounded to a level), the product of the dequantized values."""
    import torch

    levels = activation_levels(weights.extra)
    low = torch.clamp(rows.min(), max=0.0)
    high = torch.clamp(rows.max(), min=0.0)
    scale = (high - low) / levels
    scale = torch.where(scale > 0, scale, torch.full_like(scale, 0.1))
    zero = torch.clamp(torch.round(-low / scale), 0, levels)
    quantized = torch.clamp(torch.round(rows / scale) + zero, 0, levels)
    return torch.mm((quantized - zero) * scale, weights.weight)


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"transformerkit: {message}", RuntimeWarning, stacklevel=4)
