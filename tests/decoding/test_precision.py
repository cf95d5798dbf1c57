"""Decoding in bfloat16 and int8 (``kernels/lowprec.py``, ``precisions.py``): each product
against a float64 NumPy reference of the same rounding or quantization, within a bound
derived from the rounding unit; whole decodings within the chain of those bounds of
float32; the packed-weight cache per precision; the choice of ``auto`` and int8's input
range as each CPU family of ``tests/support/cpu_families.py`` (injected, whatever the host); clear
errors.

Bounds (the notation of ``tests/support/tolerances.py``):

- **bfloat16** has an 8-bit significand: unit roundoff ``U16 = 2**-8``. A product rounds its
  input and weight to bfloat16 (the reference makes the same roundings, so they cost
  nothing), sums in float32 (``gamma(k)`` of the rounded terms: :func:`tol.product_atol`)
  and rounds its output to bfloat16 (``U16 |y|``).
- **int8**: the weight's per-channel values and scales are read back and the reference uses
  them exactly; each input row is quantized on its own: divided by its largest magnitude
  ``p`` and put on ``levels`` uint8 steps over ``[-1, 1]``, a step ``dx = 2 p / levels`` of
  the row: rounding moves an element by at most half a step and the zero point, rounded to
  a level, shifts the grid's ends by at most half a step, so each element moves by at most
  one step: ``dx * sum_k |w_k|`` per output, plus float32 rounding of the scaled input, the
  dequantized sums and the scaling back (``gamma(k + 4)``).
- **A decoding** is a chain of products (the longest path through the model, counted by
  :func:`bfloat16_bounds.products_on_longest_path`) with float32 between them: as
  :func:`tol.chain_atol` counts float32 roundings relative to ``max(|result|, 1)``, each
  product counts as three bfloat16 roundings (input, weight, output), or for int8 as one
  error of relative size ``2 / levels`` (the input) plus ``1 / 254`` (the weight).
"""

import json
import os
import subprocess
import sys
import warnings

import bfloat16_bounds as bounds
import keras
import numpy as np
import pytest
import tolerances as tol
from cpu_families import FAMILIES, inject
from near_ties import assert_same_ids_or_near_tie
from paths import ROOT

from transformerkit import precisions

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="bfloat16 and int8 decoding are PyTorch shortcuts")

U16 = 2.0 ** -8


def bfloat16(a):
    """``a`` rounded to bfloat16 (to nearest, ties to even) as float64: float32's top 16
    bits after adding half of the dropped 16 (plus the kept last bit, for ties)."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def gamma16(n):
    return n * U16 / (1 - n * U16)


def bfloat16_product_atol(x, kernel, bias, exact):
    """The bound of a bfloat16 product (module docstring) for rounded operands."""
    terms = np.concatenate([x, np.ones(x.shape[:-1] + (1,))], -1)
    weights = np.concatenate([kernel, np.reshape(bias, (1, -1))], 0)
    return tol.product_atol(terms, weights) * (1 + U16) + U16 * np.abs(exact)


def int8_product_atol(x, dequantized, bias, levels):
    """The bound of an int8 product (module docstring), per row of ``x`` ``(rows, d_in)``;
    ``dequantized`` ``(d_in, d_out)``."""
    step = 2 * np.abs(x).max(-1, keepdims=True) / levels  # (rows, 1)
    magnitude = (np.abs(x) + step) @ np.abs(dequantized) + np.abs(bias)
    return step * np.abs(dequantized).sum(0) + tol.gamma(x.shape[-1] + 4) * magnitude


def torch_tensor(a):
    import torch

    return torch.as_tensor(np.asarray(a, np.float32))


@pytest.fixture
def product(rng):
    """``(x, kernel, bias)``: 6 rows of 48 inputs, 40 outputs, float32 values."""
    x = rng.normal(size=(6, 48)).astype(np.float32)
    kernel = (rng.normal(size=(48, 40)) / 7).astype(np.float32)
    bias = rng.normal(size=40).astype(np.float32)
    return x, kernel, bias


def force_emulation(monkeypatch, precision):
    """Make the packers take their float32 emulations (as where oneDNN refuses bfloat16 or
    the quantized kernels are missing), warning once."""
    from transformerkit import internals
    from transformerkit.kernels import lowprec

    monkeypatch.setattr(lowprec, "_warned", set())
    if precision == "bfloat16":
        real = internals.get("onednn_pack")

        def refuse(weight, rows):
            import torch

            if weight.dtype == torch.bfloat16:  # as PyTorch says under ONEDNN_MAX_CPU_ISA=AVX2
                raise RuntimeError("bf16 path needs the cpu support avx512bw")
            return real(weight, rows)

        monkeypatch.setitem(internals._found, "onednn_pack", refuse)
    else:
        for name in ("int8_quantize", "int8_prepack", "int8_linear"):
            monkeypatch.setitem(internals._found, name, None)


def packed_product(x, kernel, bias, precision):
    from transformerkit.kernels import lowprec

    weights = lowprec.pack(torch_tensor(kernel).t().contiguous(), torch_tensor(bias), precision)
    return weights, lowprec.apply(torch_tensor(x), weights).numpy()


@pytest.mark.parametrize("emulated", [False, True])
def test_bfloat16_product_is_the_rounded_product(product, monkeypatch, emulated):
    """The oneDNN kernel (where this CPU has the units; else it is emulated too) and the
    float32 emulation: within the bound of the rounded operands' exact product."""
    x, kernel, bias = product
    if emulated:
        force_emulation(monkeypatch, "bfloat16")
        with pytest.warns(RuntimeWarning, match="emulated at float32 speed"):
            weights, got = packed_product(x, kernel, bias, "bfloat16")
        assert weights.kind == "bfloat16-emulated"
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a CPU without the units
            weights, got = packed_product(x, kernel, bias, "bfloat16")
    xb, kb, bb = bfloat16(x), bfloat16(kernel), bfloat16(bias)
    exact = xb @ kb + bb
    tol.assert_within(got, exact, bfloat16_product_atol(xb, kb, bb, exact), weights.kind)
    # and the rounding is bfloat16's, not float32's: far from the float32 product somewhere
    assert np.abs(got - (x.astype(np.float64) @ kernel + bias)).max() > 1e3 * tol.U32


@pytest.mark.parametrize("emulated", [False, True])
def test_int8_product_is_the_quantized_product(product, monkeypatch, emulated):
    """Per-channel weights: ``round(w / scale)`` in [-127, 127] with ``scale = max |w| /
    127``, read back from the packed weight; the product within the input's quantization
    bound of the exact product by the dequantized weight."""
    import torch

    from transformerkit.kernels import lowprec

    x, kernel, bias = product
    values, scales = lowprec.int8_weights(torch_tensor(kernel).t().contiguous())
    values, scales = values.numpy().astype(np.float64), scales.numpy().astype(np.float64)
    np.testing.assert_array_equal(np.abs(values).max(1), 127)  # each channel's peak
    assert np.all(np.abs(values * scales[:, None] - kernel.T) <= scales[:, None] / 2 * (1 + 1e-6))
    if emulated:
        force_emulation(monkeypatch, "int8")
        with pytest.warns(RuntimeWarning, match="emulated in float32"):
            weights, got = packed_product(x, kernel, bias, "int8")
        assert weights.kind == "int8-emulated"
    else:
        weights, got = packed_product(x, kernel, bias, "int8")
        assert weights.kind == "int8"
        unpacked, _ = torch.ops.quantized.linear_unpack(weights.weight)
        np.testing.assert_array_equal(unpacked.int_repr().numpy(), values)
        np.testing.assert_array_equal(unpacked.q_per_channel_scales().numpy(),
                                      scales.astype(np.float32))
    dequantized = (values * scales[:, None]).T
    levels = lowprec.activation_levels(weights.extra)
    assert levels == (255 if precisions.has_vnni() else 127)
    exact = x.astype(np.float64) @ dequantized + bias
    tol.assert_within(got, exact, int8_product_atol(x, dequantized, bias, levels),
                      weights.kind)
    # a planted bug: the bias dropped from the reference
    tol.assert_caught(tol.assert_within, got, exact - bias,
                      int8_product_atol(x, dequantized, bias, levels))


@pytest.mark.parametrize("d_in, widened", [(48, False), (48, True), (13, False)])
def test_int8_weights_product_is_the_rounded_product_of_the_quantized_weight(rng, d_in,
                                                                            widened):
    """The compiled engine's int8 weights (``plain_int8``): per-channel int8 values on a
    bfloat16 scale rounded up (so ``|w - value * scale| <= scale / 2`` and the peak still
    fits in 127); applied as they are, the input rounded to bfloat16, float32 sums, the
    output rounded to bfloat16 once (an even and an odd width), or twice where widened
    (:func:`widen_int8`'s bfloat16 product, then the scale: a package's form without the
    quantize operators): within the bound of the exact product of the rounded input by the
    dequantized weight."""
    import torch

    from transformerkit.kernels import lowprec

    x = rng.normal(size=(6, d_in)).astype(np.float32)
    kernel = (rng.normal(size=(d_in, 40)) / 7).astype(np.float32)
    bias = rng.normal(size=40).astype(np.float32)
    weights = lowprec.plain_int8(torch_tensor(kernel).t().contiguous(), torch_tensor(bias))
    values = weights.weight.numpy().astype(np.float64)
    scales = weights.extra.float().numpy().astype(np.float64)
    peak = np.abs(kernel).max(0).astype(np.float64)
    assert np.all(scales >= peak / 127) and np.all(scales <= peak / 127 * (1 + 2 * U16))
    assert np.all(np.abs(values * scales[:, None] - kernel.T) <= scales[:, None] / 2 * (1 + 1e-6))
    if widened:
        weights = lowprec.widen_int8(weights)
        units = precisions.bfloat16_units()[0]  # float32 values where there are none
        assert weights.weight.dtype == (torch.bfloat16 if units else torch.float32)
        assert weights.weight.shape == (d_in, 40)
    got = lowprec.apply(torch_tensor(x), weights).numpy()
    xb, dequantized = bfloat16(x), (values * scales[:, None]).T
    exact = xb @ dequantized + bias
    outputs = 2 if widened else 1  # the roundings of the output
    atol = tol.product_atol(xb, dequantized) * (1 + U16) ** outputs \
        + gamma16(outputs) * np.abs(exact - bias) \
        + 2 * tol.U32 * (np.abs(exact) + np.abs(bias))  # the scale's product, the bias' sum
    tol.assert_within(got, exact, atol, f"{d_in} inputs, widened {widened}")
    # the input is rounded: the float32 input's product is far off somewhere
    assert np.abs(got - (x.astype(np.float64) @ dequantized + bias)).max() > 1e3 * tol.U32


def rows_quantized_product(x, kernel, bias):
    """``(weights, result)``: the compiled engine's int8 weights (``plain_int8``) in their
    many-rows form (``rows_quantized_int8``) and the eager product of ``x`` by them."""
    from transformerkit.kernels import lowprec

    weights = lowprec.plain_int8(torch_tensor(kernel).t().contiguous(), torch_tensor(bias))
    weights = lowprec.rows_quantized_int8(weights)
    return weights, lowprec.apply(torch_tensor(x), weights).numpy()


def test_rows_quantized_int8_product_quantizes_each_row(product):
    """The compiled engine's int8 at many rows (``rows_quantized_int8``): the int8 values and
    scales of ``plain_int8`` by each input row quantized on its own scale (the keras
    engine's int8): within the int8 bound (module docstring) of the exact product by the
    dequantized weight; a row's result is the same alone, in its batch and beside a row
    1000 times larger, within float32 summation (``gamma(k + 4)``: the eager float32
    product of the dequantized values may sum in another order for another row count; a
    scale shared by the call would move the row by up to 1000 steps)."""
    x, kernel, bias = product
    weights, got = rows_quantized_product(x, kernel, bias)
    assert weights.kind == "int8-rows"
    scales, _, levels = weights.extra
    assert levels == (255 if precisions.onednn_vnni() else 127)
    dequantized = (weights.weight.numpy().astype(np.float64)
                   * scales.numpy().astype(np.float64)[:, None]).T
    exact = x.astype(np.float64) @ dequantized + bias
    atol = int8_product_atol(x, dequantized, bias, levels)
    tol.assert_within(got, exact, atol, "int8 rows")
    tol.assert_caught(tol.assert_within, got, exact - bias, atol)  # planted: bias dropped
    step = 2 * np.abs(x).max(-1, keepdims=True) / levels
    sums = tol.gamma(x.shape[1] + 4) * ((np.abs(x) + step) @ np.abs(dequantized) + np.abs(bias))
    alone = np.concatenate([rows_quantized_product(x[i:i + 1], kernel, bias)[1]
                            for i in range(len(x))])
    beside = rows_quantized_product(np.concatenate([x, 1000 * x[:1]]), kernel, bias)[1][:len(x)]
    for other, name in ((alone, "alone"), (beside, "beside a loud row")):
        tol.assert_within(other, got, sums, name)


@pytest.mark.parametrize("bucket", ["small", "large", "encoder"])
def test_compiled_rows_quantized_int8_product_runs_the_int8_kernel(product, tmp_path, bucket):
    """The int8 form compiled as each package is (``torch.export``, AOTInductor with the
    bucket's options): Inductor replaces its quantize/dequantize operators by a packed int8
    product, oneDNN's (``qlinear`` in the package's code) or, where ``max_autotune`` timed
    it faster, its own template's (uint8 rows by int8 weights in the code; a form it does
    not recognise would compile to the float32 product of dequantized values, correct and
    slow), within the same bound of the exact product, for a row count other than the
    example's."""
    import re

    import torch

    from transformerkit import internals
    from transformerkit.decoding import aot_step
    from transformerkit.decoding.aot_packages import compile_program, load
    from transformerkit.kernels import lowprec

    x, kernel, bias = product
    weights, _ = rows_quantized_product(x, kernel, bias)

    class Product(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("values", weights.weight)
            self.register_buffer("scales", weights.extra[0])
            self.register_buffer("zeros", weights.extra[1])
            self.register_buffer("bias", weights.bias)

        def forward(self, rows):
            form = weights._replace(weight=self.values, bias=self.bias,
                                    extra=(self.scales, self.zeros, weights.extra[2]))
            return lowprec.apply(rows, form)

    path = str(tmp_path / "product.pt2")
    with torch.no_grad():
        rows = torch.export.Dim("rows", min=2, max=64)
        program = torch.export.export(Product().eval(), (torch_tensor(x),),
                                      dynamic_shapes=({0: rows},))
        compile_program(program, path, aot_step.ENCODER_CONFIGS if bucket == "encoder"
                        else aot_step.BUCKETS[bucket][1])
    import zipfile

    with zipfile.ZipFile(path) as package:
        code = b"".join(package.read(n) for n in package.namelist() if n.endswith(".cpp"))
    if internals.get("onednn_linear") is not None:  # oneDNN in this PyTorch
        template = re.search(rb"const uint8_t\* \w+, const int8_t\* \w+", code)
        assert b"qlinear" in code or template, bucket
    scales, _, levels = weights.extra
    dequantized = (weights.weight.numpy().astype(np.float64)
                   * scales.numpy().astype(np.float64)[:, None]).T
    four = x[:4]
    got = load(path)([torch_tensor(four)])[0].numpy()
    exact = four.astype(np.float64) @ dequantized + bias
    tol.assert_within(got, exact, int8_product_atol(four, dequantized, bias, levels),
                      "compiled int8 rows")


@pytest.mark.parametrize("emulated", [False, True])
def test_int8_rows_do_not_depend_on_each_other(product, monkeypatch, emulated):
    """Each row is quantized on its own scale: a row's result is the same alone, in its
    batch, and beside a row of values 1000 times larger (which would widen a scale shared by
    the call, as per-tensor dynamic quantization has it): bit for bit with the kernel, whose
    sums are exact integers; within float32 summation (``gamma(k + 4)``) in the emulation,
    whose float32 product may sum in another order for another row count."""
    x, kernel, bias = product
    if emulated:
        force_emulation(monkeypatch, "int8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        weights, batch = packed_product(x, kernel, bias, "int8")
    from transformerkit.kernels import lowprec

    loud = np.concatenate([x, 1000 * x[:1]]).astype(np.float32)
    beside = lowprec.apply(torch_tensor(loud), weights).numpy()[:-1]
    alone = np.concatenate([lowprec.apply(torch_tensor(row[None]), weights).numpy()
                            for row in x])
    if emulated:
        magnitude = np.abs(x) @ np.abs(kernel) * 2 + np.abs(bias)
        atol = tol.gamma(x.shape[1] + 4) * magnitude
        tol.assert_within(beside, batch, atol, "emulated, beside")
        tol.assert_within(alone, batch, atol, "emulated, alone")
    else:
        np.testing.assert_array_equal(beside, batch)
        np.testing.assert_array_equal(alone, batch)
    zeros = lowprec.apply(torch_tensor(np.zeros((2, x.shape[1]))), weights).numpy()
    np.testing.assert_array_equal(zeros, np.broadcast_to(bias.astype(np.float32), zeros.shape))


@pytest.mark.parametrize(("precision", "emulated"), [
    ("float32", False), ("bfloat16", False), ("bfloat16", True), ("int8", False),
    ("int8", True)])
def test_fused_relu_and_bfloat16_outputs_give_the_same_numbers(product, rng, monkeypatch,
                                                                precision, emulated):
    """The decoder step's shortcuts change no number: ``linear(..., activation="relu")`` is
    ``relu(linear(...))`` bit for bit (oneDNN applies it before the output's rounding, which
    ``relu`` commutes with); ``low_output`` returns the bfloat16 kernel's output unwidened
    (bfloat16 only from that kernel, float32 from every other) and the same numbers once
    widened; a bfloat16 input (such an output, fed to the next product) gives what its
    float32 widening gives."""
    import torch

    from transformerkit.kernels import products

    x, kernel, bias = product
    second = (rng.normal(size=(kernel.shape[1], 24)) / 7).astype(np.float32)
    if emulated:
        force_emulation(monkeypatch, precision)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        weights = products.inference_linear([torch_tensor(kernel)], [torch_tensor(bias)],
                                            precision=precision)
        weights2 = products.inference_linear([torch_tensor(second)], precision=precision)
    rows = torch_tensor(x)
    plain = products.linear(rows, weights)
    assert plain.dtype == torch.float32 and (plain < 0).any() and (plain > 0).any()
    np.testing.assert_array_equal(products.linear(rows, weights, activation="relu").numpy(),
                                  torch.relu(plain).numpy())
    low = products.linear(rows, weights, activation="relu", low_output=True)
    # the bfloat16 kernel (emulated where forced, and under an ONEDNN_MAX_CPU_ISA cap)
    unwidened = getattr(weights, "kind", None) == "bfloat16"
    if precision == "bfloat16" and not emulated and precisions.bfloat16_units()[0]:
        assert unwidened  # the CPU's bfloat16 units run it
    assert low.dtype == (torch.bfloat16 if unwidened else torch.float32)
    np.testing.assert_array_equal(low.float().numpy(), torch.relu(plain).numpy())
    np.testing.assert_array_equal(products.linear(low, weights2).numpy(),
                                  products.linear(low.float(), weights2).numpy())
    with pytest.raises(ValueError, match="activation must be None or 'relu'"):
        products.linear(rows, weights, activation="gelu")  # not fused anywhere: a clear error


# -- whole decodings ---------------------------------------------------------------------------

def chain_atol(model, precision, levels, result):
    """A decoding's logits at ``precision`` against float32's (module docstring)."""
    roundings = tol.model_roundings(model, 12, 12)
    if precision == "bfloat16":
        return bounds.decoding_atol(model, result, roundings)
    n = bounds.products_on_longest_path(model)
    unit = 2 / levels + 1 / 254
    magnitude = max(float(np.abs(result).max()), 1.0)
    return n * unit / (1 - n * unit) * magnitude + tol.chain_atol(roundings, result, paths=2)


@pytest.fixture(autouse=True)
def fast_paths(monkeypatch):
    """bfloat16 and int8 are shortcuts: on also where CI turns the shortcuts off."""
    from transformerkit import fastpath

    monkeypatch.setattr(fastpath, "ENABLED", True)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny translation run (number words, characters, one epoch), loaded with
    ``transformerkit.load``: what the API, the command line and the server take."""
    from tiny_run import tiny_config

    import transformerkit
    from transformerkit.training.trainer import train

    folder = tmp_path_factory.mktemp("precision_run")
    train(tiny_config(folder, epochs=1), folder / "run")
    return transformerkit.load(folder / "run")


SHARPEN = 1.5
SOURCES = ["ein zwei drei", "vier fuenf", "sechs sieben acht neun", "zehn eins",
           "drei drei vier", "neun acht sieben sechs fuenf"]


@pytest.fixture(scope="module")
def sharp_model():
    """A random Transformer (2+2 layers) and 8 random sources (4 padded). (Its weights
    scaled up, attention sharpens until a first-order bound no longer holds: x2 already
    leaves it; at x1 the decodings stay within 4-9% of it.)"""
    from transformerkit.models import Transformer

    keras.utils.set_random_seed(3)
    model = Transformer(40, 40, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=16,
                        tie_embeddings="all", dropout=0.0)
    sources = np.random.default_rng(5).integers(4, 40, size=(8, 7)).astype("int32")
    sources[:, -1] = 2  # EOS
    sources[4:, -3:] = [2, 0, 0]  # padded rows
    model((sources, sources[:, :3]))
    return model, sources


def step_logits(model, sources, targets, precision):
    """The decoder steps' logits ``(rows, steps, vocab)`` at ``precision``, teacher-forced on
    ``targets`` (BOS then ids, padded), through the decode loop's own steps."""
    import torch

    from transformerkit.decoding.steps import EagerSteps

    steps = EagerSteps(model, precision)
    with torch.no_grad():
        state, static = steps.start(sources, targets.shape[1])
        return np.stack([steps.step(targets, i, state, static)[0].numpy()
                         for i in range(targets.shape[1])], 1)


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_decoding_stays_within_the_chain_bound_of_float32(sharp_model, precision):
    """Every step's logits (on float32's greedy output) within the chain bound; the greedy
    translations equal float32's except at a near-tie of float32's logits within twice that
    bound (both tokens within it of the best)."""
    from transformerkit.decoding.common import BOS_ID
    from transformerkit.decoding.greedy import greedy_translate
    from transformerkit.decoding.options import SearchOptions
    from transformerkit.kernels import lowprec

    model, sources = sharp_model
    options = SearchOptions(beam_size=1, max_new_tokens=model.max_length - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # bfloat16 emulated on this CPU
        reference = greedy_translate(model, sources, options)
        low = greedy_translate(model, sources, options, precision=precision)
        width = min(max(len(ids) for ids in reference) + 1, model.max_length)
        targets = np.zeros((len(sources), width), np.int64)
    targets[:, 0] = BOS_ID
    for row, ids in enumerate(reference):
        targets[row, 1:len(ids) + 1] = ids[:width - 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = step_logits(model, sources, targets, "float32")
        got = step_logits(model, sources, targets, precision)
    levels = lowprec.activation_levels(not precisions.has_vnni())
    atol = chain_atol(model, precision, levels, expected)
    tol.assert_within(got, expected, atol, precision)
    assert np.abs(got - expected).max() > 0  # the precision did change the products

    def next_logits(row, prefix):
        return expected[row, len(prefix)], 2 * atol

    assert_same_ids_or_near_tie(reference, low, next_logits, precision)
    identical = sum(list(a) == list(b) for a, b in zip(reference, low, strict=True))
    assert identical >= len(sources) // 2, (identical, reference, low)


def test_int8_translations_do_not_depend_on_the_batch(sharp_model):
    """A sentence's int8 translation is the same alone and in a batch whose other sentences
    finish at other steps (greedy and beam 4): its products never share a scale with other
    rows."""
    from transformerkit.decoding import beam_translate, greedy_translate

    model, sources = sharp_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # int8 emulated on this PyTorch
        caps = dict(max_len_a=1.0, max_len_b=0, precision="int8")  # at most the source's length
        for search in (lambda ids: greedy_translate(model, ids, **caps),
                       lambda ids: [h[0].ids for h in beam_translate(
                           model, ids, beam_size=4, **caps)]):
            batch = search(sources)
            assert len({len(ids) for ids in batch}) > 1  # rows leave the batch at other steps
            assert batch == [search(sources[i:i + 1])[0] for i in range(len(sources))]
    # the same logits, bit for bit, teacher-forced (where the ids above could hide a change)
    targets = np.random.default_rng(0).integers(4, 40, size=(len(sources), 6))
    targets[:, 0] = 1  # BOS
    batch = step_logits(model, sources, targets, "int8")
    for i in range(len(sources)):
        np.testing.assert_array_equal(
            step_logits(model, sources[i:i + 1], targets[i:i + 1], "int8")[0], batch[i])


def test_run_translate_takes_a_precision_and_a_run_default(trained_run):
    """``Run.translate(precision=)`` and ``Run.translate_batches``; ``load(precision=)``
    sets the run's default; a bad name is a clear error naming the choices."""
    import transformerkit

    run = trained_run
    for precision in ("float32", "bfloat16", "int8", "auto"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # bfloat16 emulated
            texts = run.translate(SOURCES[:2], beam_size=2, precision=precision)
            batches = list(run.translate_batches(SOURCES[:2], beam_size=1,
                                                 precision=precision))
        assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
        assert sorted(i for indices, _ in batches for i in indices) == [0, 1]
    with pytest.raises(ValueError, match="precision must be one of 'float32', 'bfloat16', "
                                         "'int8', 'auto'; got 'fp16'"):
        run.translate("ein", precision="fp16")
    with pytest.raises(ValueError, match="precision must be one of"):
        transformerkit.load(run.run_dir, precision="half")
    int8_run = transformerkit.load(run.run_dir, precision="int8")
    assert int8_run.precision == "int8"
    assert int8_run.translate(SOURCES, beam_size=1) == run.translate(SOURCES, beam_size=1,
                                                                      precision="int8")
    with pytest.raises(ValueError, match="precision int8 applies to the keras engine"):
        int8_run.translate("ein", engine="ctranslate2")


def test_two_decodings_at_two_precisions_interleave(trained_run):
    """The precision is a value each call carries, not a setting: batches of an int8 and a
    float32 ``translate_batches`` taken in turn are each what that call gives alone."""
    int8_alone = list(trained_run.translate_batches(SOURCES, beam_size=1, batch_size=2,
                                                    precision="int8"))
    float32_alone = list(trained_run.translate_batches(SOURCES, beam_size=1, batch_size=2))
    low = trained_run.translate_batches(SOURCES, beam_size=1, batch_size=2, precision="int8")
    plain = trained_run.translate_batches(SOURCES, beam_size=1, batch_size=2)
    taken = [(next(low), next(plain)) for _ in range(len(int8_alone))]
    assert [pair[0] for pair in taken] == int8_alone
    assert [pair[1] for pair in taken] == float32_alone


def test_packed_weights_are_cached_per_precision_until_the_weights_change(trained_run,
                                                                         monkeypatch):
    """One packing per (weights, precision); a changed weight (``assign``) is repacked and
    the product follows it."""
    import torch

    from transformerkit.kernels import products
    from transformerkit.kernels.products import inference_linear, kernels_and_biases, linear

    # float32 packs on any vendor's CPU here (on Intel's it is left to ``addmm``)
    monkeypatch.setattr(products, "_FLOAT32_PACKING", products._onednn_available())
    precisions = ("float32", "bfloat16", "int8") if products._onednn_available() \
        else ("bfloat16", "int8")
    dense = trained_run.model.decoder_blocks[0].feedforward.inner
    x = torch.ones((2, dense.kernel.shape[0]))
    with torch.no_grad():
        packs = {}
        for precision in precisions:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                first = inference_linear(*kernels_and_biases(dense), precision=precision)
                assert inference_linear(*kernels_and_biases(dense),
                                        precision=precision) is first
                packs[precision] = first
        assert len({id(p) for p in packs.values()}) == len(precisions)
        old = dense.kernel.numpy()
        try:
            dense.kernel.assign(old * 2)
            repacked = inference_linear(*kernels_and_biases(dense), precision="int8")
            assert repacked is not packs["int8"]
            doubled = linear(x, repacked).numpy()
            bias = dense.bias.numpy()
            np.testing.assert_allclose(doubled - bias, 2 * (linear(x, packs["int8"]).numpy()
                                                            - bias), rtol=0.05, atol=1e-3)
        finally:
            dense.kernel.assign(old)


def test_generation_takes_a_precision():
    """A GPT's sampling loop at the precision it is given (``stream_ids(precision=)``, as
    ``Run.generate_stream``): an int8 and a float32 stream taken in turn each give what
    they give alone, and float32's is the default's."""
    from transformerkit.decoding.streaming import stream_ids
    from transformerkit.models import GPT

    keras.utils.set_random_seed(3)
    model = GPT(vocab_size=20, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=16)
    prompt = [1, 5, 7]

    def joined(stream):
        return [i for ids in stream for i in ids]

    reference = joined(stream_ids(model, prompt, 8, temperature=0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # int8 emulated on this PyTorch
        int8_alone = joined(stream_ids(model, prompt, 8, temperature=0.0, precision="int8"))
        low = stream_ids(model, prompt, 8, temperature=0.0, precision="int8")
        plain = stream_ids(model, prompt, 8, temperature=0.0, precision="float32")
        pairs = [(next(low), next(plain)) for _ in range(8)]
    assert [i for a, _ in pairs for i in a] == int8_alone and len(int8_alone) == 8
    assert [i for _, b in pairs for i in b] == reference


# -- auto, the CPU families, and what cannot run ----------------------------------------------

# oneDNN's caps -> whether the bfloat16 instructions stay on under it (oneDNN's "CPU dispatcher
# control": they begin at AVX512_CORE_BF16); None: no cap
CAP_KEEPS_BFLOAT16 = {None: True, "AVX2": False, "AVX512_CORE": False,
                      "AVX512_CORE_BF16": True, "AVX512_CORE_AMX": True}


def set_onednn_cap(monkeypatch, cap):
    """``ONEDNN_MAX_CPU_ISA=cap`` for the test (None: unset, also where the suite runs
    capped)."""
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)


@pytest.mark.parametrize(("flags", "cap", "usable"), [
    ({"avx2", "avx512f"}, None, False),
    ({"avx512f", "avx512_bf16"}, None, True),
    ({"avx512f", "amx_bf16", "avx512_bf16"}, "AVX512_CORE_AMX", True),
    ({"avx512f", "avx512_bf16"}, "AVX512_CORE_BF16", True),
    ({"avx512f", "avx512_bf16"}, "AVX512_CORE", False),
    ({"avx512f", "avx512_bf16"}, "AVX2", False),
])
def test_bfloat16_units_from_flags_and_the_onednn_cap(flags, cap, usable, monkeypatch):
    # a cap of None reads the environment, which is capped when the suite runs under a cap
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    assert precisions.bfloat16_units(frozenset(flags), cap)[0] is usable


@pytest.mark.parametrize("cap", list(CAP_KEEPS_BFLOAT16))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_and_bfloat16_units_for_each_cpu_family(monkeypatch, family, cap):
    """As each CPU family (``TRANSFORMERKIT_CPU_FLAGS``/``VENDOR``, whatever the host):
    bfloat16 units are usable where the family has them and the cap keeps oneDNN's bfloat16
    instructions; ``auto`` then picks bfloat16, else float32, and its reason names what
    decided: the units, the cap, or their absence."""
    cpu = inject(monkeypatch, family)
    set_onednn_cap(monkeypatch, cap)
    assert precisions.cpu_flags() == cpu.flags and precisions.cpu_vendor() == cpu.vendor
    usable = cpu.has("bfloat16") and CAP_KEEPS_BFLOAT16[cap]
    assert precisions.bfloat16_units()[0] is usable
    chosen, why = precisions.choose("auto")
    assert chosen == ("bfloat16" if usable else "float32"), why
    if not cpu.has("bfloat16"):
        assert "no bfloat16 units" in why
    elif not usable:
        assert f"ONEDNN_MAX_CPU_ISA={cap}" in why
    else:
        assert all(unit in why for unit in {"avx512_bf16", "amx_bf16"} & cpu.flags), why
    assert precisions.choose("auto", low_precision_possible=False)[0] == "float32"
    assert precisions.choose("bfloat16") == ("bfloat16", "asked for")


@pytest.mark.parametrize("cap", list(CAP_KEEPS_BFLOAT16))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_int8_input_range_for_each_cpu_family(monkeypatch, family, cap):
    """int8 quantizes its input to 255 levels where the family has VNNI (8-bit dot products
    that do not saturate) and to 127 elsewhere; the oneDNN cap changes nothing: PyTorch's
    x86 quantized linear products are FBGEMM's, which oneDNN's cap does not reach. Packed
    here (emulated where the kernels are missing), so the packed weight carries it."""
    from transformerkit.kernels import lowprec

    cpu = inject(monkeypatch, family)
    set_onednn_cap(monkeypatch, cap)
    assert precisions.has_vnni() is cpu.has("vnni")
    kernel = torch_tensor(np.arange(12, dtype=np.float32).reshape(3, 4) - 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # int8 emulated on this PyTorch
        weights = lowprec.pack(kernel, None, "int8")
    assert lowprec.activation_levels(weights.extra) == (255 if cpu.has("vnni") else 127)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_unpacked_bfloat16_weights_for_each_cpu_family(monkeypatch, family):
    """The compiled step's bfloat16 weights (``inference_linear(..., packed=False)``, which
    the compiler packs itself): plain bfloat16 for ``addmm`` where the family has bfloat16
    units, else float32 holding the bfloat16-rounded values (a compiled bfloat16 ``addmm``
    would run PyTorch's slow loop there), with a warning; the same numbers either way.
    int8's are int8 values and bfloat16 scales on every family; for many rows the same
    values with each input row quantized to the family's levels (255 with VNNI, else 127),
    or where those operators are missing widened to bfloat16 values where it has the units,
    else to float32 ones."""
    import torch

    from transformerkit import internals
    from transformerkit.kernels import lowprec, products

    cpu = inject(monkeypatch, family)
    set_onednn_cap(monkeypatch, None)
    monkeypatch.setattr(lowprec, "_warned", set())
    kernel = torch_tensor((np.arange(12, dtype=np.float32).reshape(3, 4) - 5) / 3)
    bias = torch_tensor(np.array([0.1, -0.2, 0.3, 0.7], np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weights = products.inference_linear([kernel], [bias], precision="bfloat16",
                                            packed=False)
    if cpu.has("bfloat16"):
        assert weights.kind == "bfloat16-mm" and weights.weight.dtype == torch.bfloat16
        assert not caught
    else:
        assert weights.kind == "bfloat16-emulated" and weights.weight.dtype == torch.float32
        assert any("emulated at float32 speed" in str(w.message) for w in caught)
    np.testing.assert_array_equal(weights.weight.float().numpy(),
                                  kernel.to(torch.bfloat16).float().numpy())
    np.testing.assert_array_equal(weights.bias.float().numpy(),
                                  bias.to(torch.bfloat16).float().numpy())
    weights = products.inference_linear([kernel], [bias], precision="int8", packed=False)
    assert weights.kind == "int8-weights" and weights.weight.dtype == torch.int8
    assert weights.extra.dtype == torch.bfloat16 and weights.weight.shape == (4, 3)
    many = lowprec.rows_quantized_int8(weights)
    assert many.kind == "int8-rows" and many.weight is weights.weight
    scales, zeros, levels = many.extra
    assert levels == (255 if cpu.has("vnni") else 127)
    np.testing.assert_array_equal(scales.numpy(), weights.extra.float().numpy())
    for cap, vnni in (("AVX2", False), ("AVX512_CORE", False), ("AVX512_CORE_VNNI", True)):
        set_onednn_cap(monkeypatch, cap)  # oneDNN's kernels below VNNI saturate 8 bits
        capped = lowprec.rows_quantized_int8(weights).extra[2]
        assert capped == (255 if vnni and cpu.has("vnni") else 127), cap
    set_onednn_cap(monkeypatch, None)
    assert zeros.dtype == torch.long and not zeros.any()
    monkeypatch.setitem(internals._found, "quantized_decomposed", None)  # the fallback:
    widened = lowprec.rows_quantized_int8(weights)  # float32 values without bfloat16 units
    assert widened.kind == "int8-weights"
    assert widened.weight.dtype == (torch.bfloat16 if cpu.has("bfloat16") else torch.float32)
    np.testing.assert_array_equal(widened.weight.float().numpy(),
                                  weights.weight.t().float().numpy())


def test_the_families_tell_the_decisions_apart():
    """The family tests can fail: each decision differs between two families, so a
    decision read from the host instead of the injected family, one value for all, misses
    some family's expectation (a planted bug: the override ignored)."""
    cpus = FAMILIES.values()
    for capability in ("bfloat16", "vnni"):
        assert len({cpu.has(capability) for cpu in cpus}) == 2, capability
    assert len({cpu.vendor == "GenuineIntel" for cpu in cpus}) == 2
    assert {"avx512_bf16", "amx_bf16"} <= set().union(*(cpu.flags for cpu in cpus))


def test_a_decision_that_ignores_the_override_is_caught(monkeypatch):
    """The planted bug itself: with the override ignored (the host's flags read), the
    decisions of some family differ from that family's expectations."""
    monkeypatch.setattr(precisions, "CPU_OVERRIDES", {})
    set_onednn_cap(monkeypatch, None)
    missed = []
    for cpu in FAMILIES.values():
        inject(monkeypatch, cpu)
        if (precisions.bfloat16_units()[0], precisions.has_vnni(),
                precisions.cpu_vendor()) != (cpu.has("bfloat16"), cpu.has("vnni"), cpu.vendor):
            missed.append(cpu.name)
    assert missed


def test_which_cpu_families_a_cpu_can_run():
    """By capability, not by flag: an AVX512-BF16 CPU without AMX (an AMD EPYC) runs every
    family, AMX's bfloat16 on its AVX512-BF16 units; a Cascade Lake Xeon (VNNI, no bfloat16
    units) runs the families without bfloat16 units; an AVX2 CPU the AVX2 family only."""
    from cpu_families import host_can_run, missing

    epyc = FAMILIES["epyc-avx512bf16"].flags | {"avx512cd", "avx512_vbmi2", "avx_vnni"}
    cascade_lake = FAMILIES["xeon-avx512-vnni"].flags | {"avx512cd", "avx512dq"}
    runs = {name: [n for n, cpu in FAMILIES.items() if host_can_run(cpu, flags)]
            for name, flags in (("epyc", epyc), ("cascade lake", cascade_lake),
                                ("avx2", frozenset({"avx2", "fma", "sse4_2"})))}
    assert runs == {"epyc": list(FAMILIES),
                    "cascade lake": ["xeon-avx512-vnni", "avx2"], "avx2": ["avx2"]}
    assert missing(FAMILIES["xeon-amx"], cascade_lake) == ["bfloat16"]
    assert missing(FAMILIES["xeon-amx"], frozenset({"avx2"})) == ["avx512", "bfloat16", "vnni"]


def test_cpu_families_script_prints_what_make_runs():
    """``python tests/support/cpu_families.py``: ``--env`` assignments that ``env`` takes and that
    make a process see the family; ``--runnable`` and ``--skipped`` part the families."""
    script = str(ROOT / "tests" / "support" / "cpu_families.py")

    def printed(*args):
        return subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                              check=True, timeout=60).stdout.splitlines()

    code = ("from transformerkit import precisions; "
            "print(','.join(sorted(precisions.cpu_flags())), precisions.cpu_vendor())")
    for name, cpu in FAMILIES.items():
        (assignments,) = printed("--env", name)
        env = dict(a.split("=", 1) for a in assignments.split())
        assert run_python(code, **env).stdout.split() == [",".join(sorted(cpu.flags)),
                                                          cpu.vendor]
    runnable = printed("--runnable")
    skipped = [line.partition(": ")[0] for line in printed("--skipped")]
    assert sorted(runnable + skipped) == sorted(FAMILIES)


def test_onednn_cap_reads_the_environment(monkeypatch):
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert precisions.onednn_cap() == "AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    assert precisions.onednn_cap() is None


def run_python(code, **env):
    environment = dict(os.environ, PYTHONPATH=str(ROOT / "src"), KERAS_BACKEND="torch",
                       **{"TRANSFORMERKIT_FAST_PATHS": "1", **env})  # on unless env says
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# ``auto`` decided as the CPU family AUTO_AS (its flags and vendor set around the one call),
# the products on the process's own flags (the host's, or a family it can run: int8's input
# range must be the one its kernels take)
CAPPED = """
import json, os, warnings
import numpy as np
import transformerkit, keras, torch
from transformerkit.kernels import lowprec
rng = np.random.default_rng(0)
x = rng.normal(size=(4, 32)).astype(np.float32)
k = (rng.normal(size=(32, 24)) / 6).astype(np.float32)
b = rng.normal(size=24).astype(np.float32)
auto_as = json.loads(os.environ["AUTO_AS"])
own = {name: os.environ.get(name, "") for name in auto_as}  # "": no override
os.environ.update(auto_as)
out = {"auto": lowprec.resolve("auto")}
os.environ.update(own)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for p in ("bfloat16", "int8"):
        w = lowprec.pack(torch.tensor(k).t().contiguous(), torch.tensor(b), p)
        out[p] = [w.kind, lowprec.apply(torch.tensor(x), w).tolist(), w.extra]
out["warnings"] = [str(w.message) for w in caught]
out["x"], out["k"], out["b"] = x.tolist(), k.tolist(), b.tolist()
print(json.dumps(out))
"""


def test_avx2_cap_decodes_correctly_and_auto_picks_float32():
    """Under ``ONEDNN_MAX_CPU_ISA=AVX2`` (kernels of a CPU family without bfloat16 units),
    on any host: auto, decided as a CPU with bfloat16 units (``xeon-amx``), is float32
    because of the cap, and says so; bfloat16 still computes its roundings (emulated, with a
    warning where oneDNN refuses) within its bound; int8 within its bound."""
    from transformerkit.kernels import lowprec

    auto_as = json.dumps(FAMILIES["xeon-amx"].env())
    out = json.loads(run_python(CAPPED, ONEDNN_MAX_CPU_ISA="AVX2",
                                AUTO_AS=auto_as).stdout.splitlines()[-1])
    assert out["auto"][0] == "float32"
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in out["auto"][1], out["auto"]
    x, k, b = (np.asarray(out[n], np.float64) for n in ("x", "k", "b"))
    kind, got, _ = out["bfloat16"]
    assert kind in ("bfloat16", "bfloat16-emulated")
    if kind == "bfloat16-emulated":
        assert any("emulated at float32 speed" in w for w in out["warnings"])
    xb, kb, bb = bfloat16(x), bfloat16(k), bfloat16(b)
    exact = xb @ kb + bb
    tol.assert_within(got, exact, bfloat16_product_atol(xb, kb, bb, exact), "capped bf16")
    kind, got, reduce_range = out["int8"]
    values, scales = (t.numpy().astype(np.float64) for t in
                      lowprec.int8_weights(torch_tensor(k).t().contiguous()))
    dequantized = (values * scales[:, None]).T
    tol.assert_within(got, x @ dequantized + b,
                      int8_product_atol(x, dequantized, b,
                                        lowprec.activation_levels(reduce_range)), kind)


def test_low_precision_without_the_fast_paths_is_refused_and_auto_is_float32():
    code = ("from transformerkit.kernels import lowprec\n"
            "print(lowprec.resolve('auto')[0])\n"
            "try:\n    lowprec.resolve('bfloat16')\n"
            "except ValueError as err:\n    print(err)\n")
    out = run_python(code, TRANSFORMERKIT_FAST_PATHS="0").stdout.splitlines()
    assert out[-2] == "float32"
    assert "precision bfloat16 runs on the PyTorch backend with its fast paths on" in out[-1]
    assert "TRANSFORMERKIT_FAST_PATHS" in out[-1]


def test_serving_loads_runs_at_a_precision(trained_run, capsys):
    """``serve --precision``: every run is loaded (and warmed up) at it; CTranslate2 with
    bfloat16 or int8 is refused before anything starts."""
    from transformerkit import cli
    from transformerkit.decoding.options import RuntimeOptions
    from transformerkit.serving.server import load_runs

    runs = load_runs([trained_run.run_dir], RuntimeOptions(precision="int8"))
    (run,) = runs.values()
    assert run.precision == "int8" and run.runtime.precision == "int8"
    assert cli.main(["serve", str(trained_run.run_dir), "--engine", "ctranslate2",
                     "--precision", "bfloat16"]) == 2
    assert "precision bfloat16 applies to the keras engine" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's one-line error naming the choices
        cli.main(["serve", str(trained_run.run_dir), "--precision", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


def test_command_line_precision(trained_run, capsys, monkeypatch):
    """``translate --precision`` prints what ``Run.translate(precision=)`` returns; a bad
    value is argparse's one-line error naming the choices; bfloat16 with CTranslate2 is a
    one-line error too."""
    from transformerkit import cli

    monkeypatch.setenv("TRANSFORMERKIT_MALLOC", "system")  # not this process's malloc
    capsys.readouterr()
    assert cli.main(["translate", str(trained_run.run_dir), "--precision", "int8", "--beam",
                     "1", *SOURCES[:2]]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == trained_run.translate(SOURCES[:2], beam_size=1, precision="int8")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", str(trained_run.run_dir), "--precision", "fp16", "ein"])
    assert exit_info.value.code == 2
    assert "argument --precision: invalid choice: 'fp16' (choose from float32, bfloat16, " \
           "int8, auto)" in capsys.readouterr().err.replace("'float32', 'bfloat16', 'int8', "
                                                             "'auto'", "float32, bfloat16, "
                                                                       "int8, auto")
    status = cli.main(["translate", str(trained_run.run_dir), "--precision", "bfloat16",
                       "--engine", "ctranslate2", "ein"])
    err = capsys.readouterr().err
    assert status == 2 and "precision bfloat16 applies to the keras engine" in err


def test_the_cpu_vendor_and_flags_are_those_of_the_first_cpu(monkeypatch):
    """``precisions.cpu_vendor`` / ``cpu_flags`` read the first processor's block of
    ``/proc/cpuinfo`` where no override is set (an empty one is none), checked against a
    parse of it here."""
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo here")
    for name in precisions.CPU_OVERRIDES.values():
        monkeypatch.setenv(name, "")
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        first = f.read().strip().split("\n\n")[0]
    fields = {key.strip(): value.strip() for key, _, value in
              (line.partition(":") for line in first.splitlines())}
    assert precisions.cpu_vendor() == fields.get("vendor_id", "")
    assert precisions.cpu_flags() == frozenset(fields.get("flags", "").split())


def test_the_overrides_replace_the_vendor_and_flags(monkeypatch):
    """``TRANSFORMERKIT_CPU_FLAGS`` (spaces or commas) and ``TRANSFORMERKIT_CPU_VENDOR``
    replace the fields, read at each call (no cache to clear)."""
    monkeypatch.setenv("TRANSFORMERKIT_CPU_FLAGS", " avx2, fma  avx512_bf16,,")
    monkeypatch.setenv("TRANSFORMERKIT_CPU_VENDOR", "HygonGenuine")
    assert precisions.cpu_flags() == {"avx2", "fma", "avx512_bf16"}
    assert precisions.cpu_vendor() == "HygonGenuine"
    monkeypatch.setenv("TRANSFORMERKIT_CPU_FLAGS", "avx2")
    assert precisions.cpu_flags() == {"avx2"} and not precisions.bfloat16_units()[0]
