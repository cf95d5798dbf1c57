"""The one-position decoder step (``step`` methods beside ``call``) equals the layers' own
cached ``call``: attention, blocks and whole models, including a source of padding only.

The step runs other kernels than the Keras call (oneDNN's packed products, its own
attention), so the two agree within two paths' rounding bound (``tests/support/tolerances.py``)
and decoded ids agree except at a near-tie; products are checked against float64 within
one path's bound; what runs through the same kernels is exact.
"""

import keras
import numpy as np
import pytest
import tolerances as tol
from cpu_families import FAMILIES, inject
from nan_caches import fill_new_caches_with_nan
from near_ties import (
    assert_same_hypotheses_or_near_tie,
    assert_same_ids_or_near_tie,
    next_logits_after,
    score_bound,
)

from transformerkit import fastpath
from transformerkit.decoding.steps import EagerSteps, make_steps
from transformerkit.layers import DecoderBlock, MultiHeadAttention
from transformerkit.models import GPT, Transformer

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the one-position step is the PyTorch-eager shortcut")


def affine_atol(x, kernel, bias=None, paths=1):
    """New bound helper (for tests/support/tolerances.py): ``x @ kernel + bias`` is one dot product
    of length ``d_in + 1``, ``[x, 1] . [kernel; bias]``, so :func:`tol.product_atol` of those."""
    x = np.asarray(x, np.float64)
    if bias is None:
        return tol.product_atol(x, kernel, paths)
    ones = np.ones(x.shape[:-1] + (1,))
    return tol.product_atol(np.concatenate([x, ones], -1),
                            np.concatenate([kernel, np.reshape(bias, (1, -1))], 0), paths)


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def position_major(cache):
    """Keras' ``(rows, len, heads, dim)`` cache pair -> the step's ``(len, rows, heads, dim)``."""
    return tuple(keras.ops.convert_to_tensor(t).transpose(0, 1).contiguous() for t in cache)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("cross_attention", [True, False])
@pytest.mark.parametrize("sums", [False, True], ids=["products", "sums"])
def test_block_step_equals_block_call_with_a_cache(rng, norm_position, cross_attention, sums,
                                                   monkeypatch):
    """Two paths through a block (packed products, the step's attention) and its cached
    keys and values (one projection, after a LayerNorm when pre-norm); the step's attention
    both as eager PyTorch runs it (batched matrix products) and as the compiled step does
    (``sums``: broadcast products summed)."""
    import torch

    from transformerkit.layers import attention

    monkeypatch.setattr(attention, "_one_query_products_as_sums", lambda: sums)
    block = DecoderBlock(d_model=16, num_heads=4, d_ff=32, dropout=0.0,
                         norm_position=norm_position, cross_attention=cross_attention)
    rows, length, source_len = 3, 5, 4
    context = keras.ops.convert_to_tensor(rng.normal(size=(rows, source_len, 16)), "float32")
    context_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    inputs = keras.ops.convert_to_tensor(rng.normal(size=(rows, length, 16)), "float32")
    block(inputs, context if cross_attention else None)  # build
    cache = block.init_cache(rows, length, context if cross_attention else None)
    weights = block.step_weights()
    step_cache = position_major(cache["self"])
    memory = (block.cross_attention_layer.step_memory(context, context_mask,
                                                      weights["cross_attention"])
              if cross_attention else None)
    # the Keras call attends over the whole cache (later positions masked): `length` keys
    roundings = tol.block_roundings(16, 32, 4, length, 4,
                                    cross_keys=source_len if cross_attention else 0)
    key_roundings = tol.layer_norm_roundings(16) * (norm_position == "pre") + 16 + 1
    for index in range(length):
        expected, cache = block(inputs[:, index:index + 1], None, context_mask=context_mask,
                                cache=cache, cache_index=index)
        got = block.step(inputs[:, index], weights, step_cache, index, memory)
        expected = to_numpy(expected[:, 0])
        tol.assert_within(to_numpy(got), expected,
                          tol.chain_atol(roundings, expected, paths=2), f"step {index}")
        keys = to_numpy(cache["self"][0][:, : index + 1])
        tol.assert_within(to_numpy(step_cache[0][: index + 1].transpose(0, 1)), keys,
                          tol.chain_atol(key_roundings, keys, paths=2), f"keys {index}")


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_gpt_block_prefill_equals_block_call_with_a_cache(rng, norm_position):
    """A prompt in one pass (``DecoderBlock.prefill``: the step's products, the fused causal
    attention) equals the block's Keras call with a cache from position 0 at every position,
    and fills the step's position-major cache with the Keras cache's keys and values; the
    positions after the prompt are left as they were; a block with cross-attention refuses."""
    import torch

    block = DecoderBlock(d_model=16, num_heads=4, d_ff=32, dropout=0.0,
                         norm_position=norm_position, cross_attention=False)
    rows, length, max_len = 3, 5, 7
    inputs = keras.ops.convert_to_tensor(rng.normal(size=(rows, length, 16)), "float32")
    block(inputs)  # build
    cache = block.init_cache(rows, max_len)
    expected, cache = block(inputs, cache=cache, cache_index=0)
    weights = block.step_weights()
    step_cache = (torch.full((max_len, rows, 4, 4), 7.0), torch.full((max_len, rows, 4, 4), 7.0))
    got = block.prefill(inputs, weights, step_cache)
    expected = to_numpy(expected)
    # the Keras call attends over the whole cache (later positions masked): max_len keys
    roundings = tol.block_roundings(16, 32, 4, max_len, 4)
    tol.assert_within(to_numpy(got), expected, tol.chain_atol(roundings, expected, paths=2),
                      "prefill")
    key_roundings = tol.layer_norm_roundings(16) * (norm_position == "pre") + 16 + 1
    for t, name in zip(step_cache, ("keys", "values"), strict=True):
        want = to_numpy(cache["self"][0 if name == "keys" else 1][:, :length])
        tol.assert_within(to_numpy(t[:length].transpose(0, 1)), want,
                          tol.chain_atol(key_roundings, want, paths=2), name)
        assert bool((t[length:] == 7.0).all()), f"{name} after the prompt were written"
    with pytest.raises(ValueError, match="cross-attention"):
        DecoderBlock(d_model=16, num_heads=4, d_ff=32, cross_attention=True).prefill(
            inputs, weights, step_cache)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_block_inference_call_equals_its_call(rng, norm_position):
    """The encoder's inference twin (packed products, the weights as a value) equals the
    block's Keras call with a padding mask at every real position, within two paths' bound;
    a sentence of padding only is finite."""
    import torch

    from transformerkit.layers import EncoderBlock

    block = EncoderBlock(d_model=16, num_heads=4, d_ff=32, dropout=0.0,
                         norm_position=norm_position)
    x = keras.ops.convert_to_tensor(rng.normal(size=(3, 5, 16)), "float32")
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    expected = to_numpy(block(x, mask=mask))
    got = to_numpy(block.inference_call(x, block.step_weights(), mask))
    assert np.isfinite(got).all()
    roundings = tol.block_roundings(16, 32, 4, 5, 4)
    real = to_numpy(mask)
    tol.assert_within(got[real], expected[real],
                      tol.chain_atol(roundings, expected[real], paths=2), norm_position)


def test_inference_encode_equals_encode_and_carries_its_precision(rng):
    """``Transformer.inference_encode`` equals ``encode`` at the real positions (float32);
    at int8 the products change: the precision travels in the weights, nothing else sets
    it."""
    import torch

    model = Transformer(source_vocab_size=30, target_vocab_size=30, num_layers=2, d_model=16,
                        num_heads=2, d_ff=32, max_length=12, dropout=0.0)
    ids = np.array([[5, 9, 12, 2, 0, 0], [7, 3, 8, 11, 4, 2]], np.int32)
    expected = to_numpy(model.encode(ids))
    with torch.no_grad():
        got = to_numpy(model.inference_encode(ids, model.step_weights("float32")))
        low = to_numpy(model.inference_encode(ids, model.step_weights("int8")))
    real = ids != 0
    roundings = 2 * tol.block_roundings(16, 32, 8, 6, 2)
    tol.assert_within(got[real], expected[real],
                      tol.chain_atol(roundings, expected[real], paths=2), "float32")
    # int8's bound on whole decodings: tests/decoding/test_precision.py
    assert np.isfinite(low).all() and np.abs(low[real] - got[real]).max() > 0


def test_tolerances_still_catch_a_transposed_weight_in_the_packed_product(monkeypatch):
    """Planted bug: oneDNN's packed copy of every square kernel is transposed (the step's
    attention output projection): the block step moves far beyond its bound."""
    from transformerkit import internals
    from transformerkit.kernels import products

    if not products._onednn_available():
        pytest.skip("this PyTorch has no oneDNN packed products")
    monkeypatch.setattr(products, "_FLOAT32_PACKING", True)  # whatever this CPU's vendor
    pack = internals.get("onednn_pack")

    def transposed_square(weight, rows):
        if weight.shape[0] == weight.shape[1]:
            weight = weight.t().contiguous()
        return pack(weight, rows)

    monkeypatch.setitem(internals._found, "onednn_pack", transposed_square)
    for sums in (False, True):
        tol.assert_caught(test_block_step_equals_block_call_with_a_cache,
                          np.random.default_rng(0), "post", True, sums, monkeypatch)


def test_cross_step_over_a_source_of_padding_only_is_finite_and_equals_call(rng):
    import torch

    attention = MultiHeadAttention(num_heads=2, key_dim=4)
    rows, source_len = 2, 3
    query = keras.ops.convert_to_tensor(rng.normal(size=(rows, 1, 8)), "float32")
    context = keras.ops.convert_to_tensor(rng.normal(size=(rows, source_len, 8)), "float32")
    mask = torch.tensor([[True, True, False], [False, False, False]])
    expected = to_numpy(attention(query, context, value_mask=mask)[:, 0])  # (rows, 8)
    weights = attention.step_weights()
    memory = attention.step_memory(context, mask, weights)
    got = attention.cross_step(query[:, 0], weights, memory)
    assert torch.isfinite(got).all()
    roundings = tol.attention_roundings(8, 4, source_len, num_heads=2)
    tol.assert_within(to_numpy(got), expected, tol.chain_atol(roundings, expected, paths=2))
    # no key at all: the attention output is zero, so the layer gives its output bias; exact:
    # zeros times the output kernel are zeros, plus the bias
    np.testing.assert_array_equal(to_numpy(got[1]), to_numpy(attention.output_dense.bias))


@pytest.mark.parametrize("kind", ["transformer", "marian", "gpt"])
def test_model_step_logits_equal_the_keras_cache_path(monkeypatch, kind):
    """Two paths through the whole model (the Keras cache path attends over all 8 cache
    positions, later ones masked). ``marian``: a Transformer with Marian's options (swish,
    sines-then-cosines positions, unscaled embeddings, a random frozen logits bias)."""
    monkeypatch.setattr(fastpath, "ENABLED", True)  # also when CI turns the shortcuts off
    small = dict(num_layers=2, d_model=16, num_heads=4, d_ff=32, max_length=12, dropout=0.0)
    if kind == "transformer":
        model = Transformer(30, 30, tie_embeddings="decoder", **small)
    elif kind == "marian":
        model = Transformer(30, 30, tie_embeddings="all", activation="swish",
                            positional="sinusoidal_split", scale_embeddings=False,
                            final_logits_bias=True, **small)
        model.build(None)
        model.logits_bias.bias.assign(np.random.default_rng(1).normal(size=30) * 3)
    else:
        model = GPT(30, **small)
    start = (np.array([[5, 6, 7, 0], [8, 9, 0, 0]] if kind != "gpt" else [[1, 4], [1, 5]],
                      "int32"),)
    buffer = np.random.default_rng(0).integers(3, 30, (2, 8)).astype("int32")
    fast, plain = make_steps(model, True), make_steps(model, "keras")
    assert isinstance(fast, EagerSteps) and not isinstance(plain, EagerSteps)
    args = (start[0], 8) if kind != "gpt" else (buffer, 0, 8)
    fast_state, fast_static = fast.start(*args)
    plain_state, plain_static = plain.start(*args)
    roundings = tol.model_roundings(model, start[0].shape[1] if kind != "gpt" else 0, 8)
    with torch_no_grad():
        for index in range(6):
            a, fast_state = fast.step(buffer, index, fast_state, fast_static)
            b, plain_state = plain.step(buffer, index, plain_state, plain_static)
            b = to_numpy(b)
            tol.assert_within(to_numpy(a), b, tol.chain_atol(roundings, b, paths=2),
                              f"step {index}")


@pytest.mark.parametrize("kind", ["transformer", "gpt"])
def test_no_step_reads_a_cache_position_before_writing_it(monkeypatch, kind):
    """The step's caches start unfilled (``new_empty``): filled with NaN instead, greedy and
    beam search (whose reorders copy the filled positions only) give the same ids and
    scores, so no unwritten position is ever read. Exact: the same kernels on the same
    positions."""
    import torch

    from transformerkit.decoding import beam_translate, generate_ids, greedy_translate

    monkeypatch.setattr(fastpath, "ENABLED", True)
    small = dict(num_layers=2, d_model=16, num_heads=4, d_ff=32, max_length=12, dropout=0.0)
    keras.utils.set_random_seed(3)
    if kind == "transformer":
        model = Transformer(30, 30, tie_embeddings="all", **small)
        source = np.array([[5, 6, 7, 2], [8, 9, 2, 0], [11, 2, 0, 0]], "int32")

        def decode():
            hyps = beam_translate(model, source, beam_size=3, n_best=3, max_new_tokens=10)
            return (greedy_translate(model, source, max_new_tokens=10),
                    [[(h.ids, h.score, h.log_prob) for h in found] for found in hyps])
    else:
        model = GPT(30, **small)

        def decode():
            return (generate_ids(model, [[5, 6], [7, 8, 9]], max_new_tokens=8, temperature=0),
                    generate_ids(model, [[5, 6], [7, 8, 9]], max_new_tokens=8, top_k=5, seed=1))

    expected = decode()
    fill_new_caches_with_nan(monkeypatch)
    with torch.no_grad():
        assert decode() == expected


def test_switch_off_uses_the_keras_cache_path(monkeypatch):
    model = GPT(30, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=8)
    monkeypatch.setattr(fastpath, "ENABLED", False)
    assert not isinstance(make_steps(model, True), EagerSteps)


def torch_no_grad():
    import torch

    return torch.no_grad()


# -- Inference weights packed for oneDNN (kernels/products.py: inference_linear) --

@pytest.mark.parametrize("biases", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 130])
def test_inference_linear_equals_the_float64_product(rng, rows, biases):
    """Several kernels side by side, with and without biases, on 2-D and 3-D inputs, and a
    transposed table: oneDNN's packed product (where this PyTorch has it) is x @ K + b."""
    import torch

    from transformerkit.kernels.products import inference_linear, linear

    kernels = [rng.normal(size=(8, width)).astype("float32") for width in (5, 7, 3)]
    bias_values = [rng.normal(size=(k.shape[1],)).astype("float32") for k in kernels]
    x = rng.normal(size=(rows, 8)).astype("float32")
    kernel = np.concatenate(kernels, 1).astype("float64")
    bias = np.concatenate(bias_values).astype("float64") if biases else None
    expected = x.astype("float64") @ kernel + (0.0 if bias is None else bias)
    atol = affine_atol(x, kernel, bias)
    weights = inference_linear([torch.tensor(k) for k in kernels],
                               [torch.tensor(b) for b in bias_values] if biases else None)
    tol.assert_within(linear(torch.tensor(x), weights).numpy(), expected, atol)
    got = linear(torch.tensor(x).reshape(1, rows, 8), weights).numpy()
    tol.assert_within(got, expected[None], atol[None])
    table = rng.normal(size=(11, 8)).astype("float32")  # (d_out, d_in): a tied embedding
    got = linear(torch.tensor(x), inference_linear([torch.tensor(table)], transposed=True))
    tol.assert_within(got.numpy(), x.astype("float64") @ table.T.astype("float64"),
                      tol.product_atol(x, table.T))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(6, 8), (2, 3, 8)])
@pytest.mark.parametrize("transposed_kernel", [False, True])
def test_onednn_training_product_equals_the_float64_product_and_gradients(
        rng, monkeypatch, bias, shape, transposed_kernel):
    """Under autograd a large enough product (the threshold lowered to 0 here) runs through
    ``_OneDNNLinear`` where this PyTorch has oneDNN: x @ K + b and the gradients of x, K and b
    equal the float64 ones; a kernel that is a transposed view (a tied table) takes the same
    path. Below the threshold, and without autograd, it is the plain product. (Operands of
    float32 values, so that float64 products of them are the exact ones.)"""
    import torch

    from transformerkit.kernels import products

    monkeypatch.setattr(products, "ONEDNN_TRAIN_MIN_MACS", 0)

    def float32_values(size):
        return rng.normal(size=size).astype("float32").astype("float64")

    x64 = float32_values(shape)
    k64 = float32_values((8, 5))
    b64 = float32_values((5,))
    g64 = float32_values((*shape[:-1], 5))
    x = torch.tensor(x64, dtype=torch.float32, requires_grad=True)
    if transposed_kernel:
        table = torch.tensor(k64.T, dtype=torch.float32, requires_grad=True)
        kernel = table.t()
    else:
        table = kernel = torch.tensor(k64, dtype=torch.float32, requires_grad=True)
    b = torch.tensor(b64, dtype=torch.float32, requires_grad=True) if bias else None
    y = products.linear(x, (kernel, b))
    if products._onednn_available():
        assert "_OneDNNLinear" in graph_nodes(y)
    (y * torch.tensor(g64, dtype=torch.float32)).sum().backward()
    expected = x64 @ k64 + (b64 if bias else 0.0)
    atol = affine_atol(x64, k64, b64 if bias else None)
    tol.assert_within(y.detach().numpy(), expected, atol)
    rows, grads = x64.reshape(-1, 8), g64.reshape(-1, 5)
    tol.assert_within(x.grad.numpy(), g64 @ k64.T, tol.product_atol(g64, k64.T))
    kernel_grad = table.grad.numpy().T if transposed_kernel else table.grad.numpy()
    tol.assert_within(kernel_grad, rows.T @ grads, tol.product_atol(rows.T, grads))
    if bias:  # a sum over the rows: a product with ones
        tol.assert_within(b.grad.numpy(), grads.sum(0),
                          tol.product_atol(np.ones((1, len(grads))), grads)[0])
    monkeypatch.setattr(products, "ONEDNN_TRAIN_MIN_MACS", 10**9)
    plain = products.linear(x, (kernel, b))
    assert "_OneDNNLinear" not in graph_nodes(plain)
    tol.assert_within(plain.detach().numpy(), expected, atol)


def graph_nodes(tensor):
    """The names of the autograd nodes that ``tensor`` was computed by, ``Backward`` cut off."""
    names, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None:
            names.add(type(node).__name__.removesuffix("Backward"))
            todo.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_inference_weights_are_packed_once_and_follow_every_weight_update(rng, monkeypatch):
    """The packed copy is reused while the weights are unchanged and rebuilt after any
    in-place update (``assign``, an optimizer step), so decoding follows a training model."""
    import torch

    from transformerkit.kernels import products
    from transformerkit.layers import calls

    if not products._onednn_available():
        pytest.skip("this PyTorch has no oneDNN packed products")
    monkeypatch.setattr(products, "_FLOAT32_PACKING", True)  # whatever this CPU's vendor
    dense = keras.layers.Dense(6)
    dense.build((None, 4))
    x = torch.tensor(rng.normal(size=(3, 4)), dtype=torch.float32)
    first = products.inference_linear(*products.kernels_and_biases(dense))
    assert products.inference_linear(*products.kernels_and_biases(dense)) is first
    assert isinstance(first, products.PackedLinear)
    for variable in (dense.kernel, dense.bias):
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
        weights = products.inference_linear(*products.kernels_and_biases(dense))
        assert_affine(to_numpy(products.linear(x, weights)), x.numpy(), dense)
    with torch.no_grad():
        dense.kernel.value.mul_(2.0)  # an optimizer's in-place update
        assert_affine(to_numpy(calls.call_sublayer(dense, x)), x.numpy(), dense)


def assert_affine(got, x, dense):
    """``got`` is ``x @ kernel + bias`` of the ``Dense`` layer's current weights, within one
    float32 product's bound of the float64 one."""
    kernel = to_numpy(dense.kernel).astype("float64")
    bias = to_numpy(dense.bias).astype("float64")
    tol.assert_within(got, x.astype("float64") @ kernel + bias, affine_atol(x, kernel, bias))


def test_dense_without_autograd_equals_dense_with_it(rng):
    """``Dense`` under ``torch.no_grad`` (evaluation, encoding for decoding) takes the packed
    weights; the result equals the autograd path's ``addmm`` within two products' bound
    (relu moves no difference further apart)."""
    import torch

    from transformerkit.layers.calls import call_sublayer

    dense = keras.layers.Dense(9, activation="relu")
    x = torch.tensor(rng.normal(size=(2, 5, 4)), dtype=torch.float32)
    dense(x)
    with_grad = call_sublayer(dense, x)
    with torch.no_grad():
        without = call_sublayer(dense, x)
    assert with_grad.requires_grad and not without.requires_grad
    kernel, bias = to_numpy(dense.kernel), to_numpy(dense.bias)
    tol.assert_within(to_numpy(without), to_numpy(with_grad.detach()),
                      affine_atol(x.numpy(), kernel, bias, paths=2))


def assert_float32_packing(packs):
    """``inference_linear`` packs a float32 ``Dense`` for oneDNN exactly where ``packs`` and
    PyTorch has oneDNN (the choice made afresh)."""
    from transformerkit.kernels import products

    products._FLOAT32_PACKING = None  # the caller's monkeypatch restores it
    dense = keras.layers.Dense(3)
    dense.build((None, 4))
    weights = products.inference_linear(*products.kernels_and_biases(dense))
    expected = packs and products._onednn_available()
    assert products._packs_float32() is expected
    assert isinstance(weights, products.PackedLinear) is expected


@pytest.mark.parametrize("family", list(FAMILIES))
def test_float32_inference_packs_for_onednn_except_on_intel(monkeypatch, family):
    """Float32 inference products, as each CPU family (its vendor injected, whatever the
    host): ``addmm`` (MKL) on Intel CPUs, oneDNN's packed kernel on others; neither where
    PyTorch lacks oneDNN."""
    from transformerkit.kernels import products

    monkeypatch.setattr(products, "_FLOAT32_PACKING", None)
    cpu = inject(monkeypatch, family)
    assert_float32_packing(cpu.vendor != "GenuineIntel")


def test_float32_inference_packs_on_other_and_unknown_vendors(monkeypatch):
    """Another vendor, and none at all (no ``/proc/cpuinfo``: not Linux), pack as AMD's."""
    from transformerkit import precisions
    from transformerkit.kernels import products

    monkeypatch.setattr(products, "_FLOAT32_PACKING", None)
    monkeypatch.setenv("TRANSFORMERKIT_CPU_VENDOR", "HygonGenuine")
    assert_float32_packing(True)
    monkeypatch.setenv("TRANSFORMERKIT_CPU_VENDOR", "")  # empty: no override
    monkeypatch.setattr(precisions, "_cpuinfo_fields", dict)  # and no /proc/cpuinfo
    assert precisions.cpu_vendor() == ""
    assert_float32_packing(True)


def test_decoding_without_onednn_gives_the_same_translations(monkeypatch):
    """The oneDNN-packed step is a shortcut: with it off (``addmm`` on the plain kernels) beam
    search and greedy search give the same hypotheses: other kernels, so scores within two
    paths' bound and the same ids except at a near-tie."""
    import torch

    from transformerkit.decoding import beam_translate, greedy_translate
    from transformerkit.kernels import products

    keras.utils.set_random_seed(3)
    model = Transformer(40, 40, num_layers=2, d_model=16, num_heads=2, d_ff=24, max_length=12,
                        tie_embeddings="all")
    sources = np.array([[5, 9, 14, 7, 2], [11, 6, 2, 0, 0]], dtype="int32")
    model((sources, sources[:, :3]))
    for variable in model.trainable_weights:
        variable.assign(to_numpy(variable) * 3.0)  # sharper distributions: longer outputs

    def decode():
        with torch.no_grad():
            return (greedy_translate(model, sources, max_new_tokens=8),
                    beam_translate(model, sources, max_new_tokens=8, beam_size=3, n_best=3))

    if not products._onednn_available():
        pytest.skip("this PyTorch has no oneDNN packed products")
    monkeypatch.setattr(products, "_FLOAT32_PACKING", True)  # whatever this CPU's vendor
    packed = decode()
    assert all(len(ids) > 2 for ids in packed[0])  # something to compare
    monkeypatch.setattr(products, "_FLOAT32_PACKING", False)
    plain = decode()
    assert_same_ids_or_near_tie(packed[0], plain[0], next_logits_after(model, sources))
    atol = score_bound(model, sources, packed[1] + plain[1])
    for row, (got, expected) in enumerate(zip(packed[1], plain[1], strict=True)):
        assert_same_hypotheses_or_near_tie(got, expected, atol, f"sentence {row}")


def test_packed_inference_weights_follow_the_fused_adam_update(rng):
    """PyTorch's fused Adam kernel writes the weights without bumping their version
    counters; our optimizer bumps them, so a packed copy made before a step is not reused."""
    import torch

    from transformerkit.kernels import products
    from transformerkit.training import Adam

    dense = keras.layers.Dense(5)
    dense.build((None, 3))
    x = torch.tensor(rng.normal(size=(2, 3)), dtype=torch.float32)
    before = products.inference_linear(*products.kernels_and_biases(dense))
    optimizer = Adam(0.5, weight_decay=0.1)
    optimizer.apply([keras.ops.ones(v.shape) for v in dense.trainable_weights],
                    dense.trainable_weights)
    assert optimizer._fused() == fastpath.ENABLED  # off: Keras' update, through assign
    after = products.inference_linear(*products.kernels_and_biases(dense))
    assert after is not before
    assert_affine(to_numpy(products.linear(x, after)), x.numpy(), dense)


def test_the_twins_weights_on_another_backend_are_a_clear_error(monkeypatch):
    """``step_weights`` (what every inference twin reads) names the backend it needs and
    what to call instead, rather than failing deep inside a product on a missing module."""
    model = GPT(30, num_layers=1, d_model=8, num_heads=2, d_ff=16, dropout=0.0, max_length=8)
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(RuntimeError, match=r"GPT\.step_weights: .* PyTorch backend only; "
                                           r"this process runs Keras on 'jax'.*generate_ids"):
        model.step_weights("float32")
