"""Every layer against the float64 NumPy reference (tests/support/reference.py) with the same
weights, and multi-head attention against ``keras.layers.MultiHeadAttention``."""

import math

import keras
import numpy as np
import pytest
import reference as ref
import tolerances as tol
from reference import to_numpy

from transformerkit.layers import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    TokenEmbedding,
    scaled_dot_product_attention,
    sinusoidal_table,
)


def _core_roundings(key_dim, keys):
    """The attention core alone (scores, softmax, weighted sum): no projections."""
    return tol.attention_roundings(0, key_dim, keys, value_dim=0)


def _padding(lengths, width):
    """Boolean (batch, width) masks, True at the first ``length`` positions of each row."""
    return np.arange(width)[None, :] < np.asarray(lengths)[:, None]


def _randomized(layer, seed=0):
    ref.randomize_weights(layer, seed=seed)
    return layer


# -- multi-head attention ---------------------------------------------------------------------

ATTENTION_CASES = {
    # name: (num_heads, key_dim, value_dim, output_dim, causal, key_lengths, cross)
    "self": (2, 4, None, None, False, None, False),
    "self_padding": (2, 4, None, None, False, [5, 3, 1], False),
    "causal": (4, 3, None, None, True, None, False),
    "causal_padding": (2, 4, None, None, True, [5, 2, 4], False),
    "key_value_widths_differ": (3, 5, 2, None, False, [5, 4, 5], False),
    "output_dim": (2, 4, 6, 7, False, None, False),
    "cross_padding": (2, 6, 3, None, False, [7, 1, 4], True),
}


@pytest.mark.parametrize("case", ATTENTION_CASES)
@pytest.mark.parametrize("path", ["fused", "explicit", "scores"])
def test_attention_matches_reference(rng, monkeypatch, case, path):
    """Each attention core (the fused kernel, the explicit formula that eager PyTorch takes
    for short keys, the explicit formula returning its weights) against float64 NumPy."""
    from transformerkit.layers import attention

    monkeypatch.setattr(attention, "EXPLICIT_MAX_KEYS", 0 if path == "fused" else 10**6)
    scores = path == "scores"
    heads, key_dim, value_dim, output_dim, causal, key_lengths, cross = ATTENTION_CASES[case]
    query = rng.normal(size=(3, 5, 8)).astype("float32")
    value = rng.normal(size=(3, 7, 10)).astype("float32") if cross else query
    key_mask = None if key_lengths is None else _padding(key_lengths, value.shape[1])
    layer = MultiHeadAttention(heads, key_dim, value_dim=value_dim, output_dim=output_dim)
    layer(query, value)
    _randomized(layer)
    out = layer(query, value, value_mask=key_mask, use_causal_mask=causal,
                return_attention_scores=scores)
    out, weights = out if scores else (out, None)
    expected, expected_weights = ref.multi_head_attention(
        query, value, ref.attention_params(layer), heads, key_mask=key_mask, causal=causal)
    assert out.shape == (3, 5, output_dim or 8)
    width = max(query.shape[-1], value.shape[-1])  # the widest projection's input
    n = tol.attention_roundings(width, key_dim, value.shape[1], value_dim, heads)
    tol.assert_within(to_numpy(out), expected, tol.chain_atol(n, expected))
    if scores:  # the weights are a step of the same chain: its bound holds for them
        tol.assert_within(to_numpy(weights), expected_weights,
                          tol.chain_atol(n, expected_weights))


def test_attention_explicit_mask_and_separate_key(rng):
    query = rng.normal(size=(2, 4, 6)).astype("float32")
    key = rng.normal(size=(2, 5, 6)).astype("float32")
    value = rng.normal(size=(2, 5, 6)).astype("float32")
    explicit = rng.random((2, 4, 5)) < 0.6
    explicit[:, :, 0] = True
    key_mask = _padding([5, 3], 5)
    layer = MultiHeadAttention(2, 3, value_dim=4)
    layer(query, value, key)
    _randomized(layer, seed=1)
    out = layer(query, value, key, value_mask=key_mask, attention_mask=explicit,
                use_causal_mask=True)
    expected, _ = ref.multi_head_attention(query, value, ref.attention_params(layer), 2,
                                           key=key, key_mask=key_mask, causal=True,
                                           attention_mask=explicit)
    n = tol.attention_roundings(6, 3, 5, value_dim=4, num_heads=2)
    tol.assert_within(to_numpy(out), expected, tol.chain_atol(n, expected))


def test_attention_uses_keras_mask_of_inputs(rng):
    """A padding mask carried by the inputs (Keras masking) is honoured like an explicit one."""
    ids = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 2]])
    embedding = TokenEmbedding(12, 8)
    x = embedding(ids)
    layer = MultiHeadAttention(2, 4)
    layer(x, x)
    _randomized(layer)
    expected, _ = ref.multi_head_attention(to_numpy(x), to_numpy(x), ref.attention_params(layer),
                                           2, key_mask=ids != 0)
    n = tol.attention_roundings(8, 4, 5, num_heads=2)
    tol.assert_within(to_numpy(layer(x, x)), expected, tol.chain_atol(n, expected))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("widths", [(4, 4), (4, 3)], ids=["equal", "value_dim_differs"])
def test_attention_matches_keras_multi_head_attention(rng, causal, widths):
    key_dim, value_dim = widths
    if keras.backend.backend() == "jax" and key_dim != value_dim:
        pytest.skip("keras.layers.MultiHeadAttention itself fails on JAX when value_dim differs")
    heads, d_model = 3, 8
    query = rng.normal(size=(2, 5, d_model)).astype("float32")
    # causal: self-attention (keras' causal mask is lower-triangular over query/key index)
    value = query if causal else rng.normal(size=(2, 6, d_model)).astype("float32")
    key_mask = _padding([value.shape[1], 3], value.shape[1])
    ours = MultiHeadAttention(heads, key_dim, value_dim=value_dim)
    ours(query, value)
    _randomized(ours)
    theirs = keras.layers.MultiHeadAttention(heads, key_dim, value_dim=value_dim)
    theirs(query, value)
    p = ref.attention_params(ours)
    for name, dense, width in (("query", theirs.query_dense, key_dim),
                               ("key", theirs.key_dense, key_dim),
                               ("value", theirs.value_dense, value_dim)):
        kernel, bias = p[name]
        dense.kernel.assign(kernel.reshape(d_model, heads, width))  # (d, h*k) -> (d, h, k)
        dense.bias.assign(bias.reshape(heads, width))
    kernel, bias = p["output"]
    theirs.output_dense.kernel.assign(kernel.reshape(heads, value_dim, d_model))
    theirs.output_dense.bias.assign(bias)

    expected = theirs(query, value, attention_mask=np.broadcast_to(
        key_mask[:, None, :], (2, 5, value.shape[1])), use_causal_mask=causal)
    got = ours(query, value, value_mask=key_mask, use_causal_mask=causal)
    n = tol.attention_roundings(d_model, key_dim, value.shape[1], value_dim, heads)
    tol.assert_within(to_numpy(got), to_numpy(expected),  # two float32 layers
                      tol.chain_atol(n, to_numpy(expected), paths=2))


@pytest.mark.parametrize("keys", [6, 70])
def test_attention_core_paths_agree(rng, monkeypatch, keys):
    """Fused kernel and explicit formula give the same numbers (masks and causal flag), at
    a key length where eager PyTorch takes the explicit formula by default and one where
    it takes the kernel."""
    from transformerkit.layers import attention

    q = rng.normal(size=(2, 4, 3, 5)).astype("float32")
    k = rng.normal(size=(2, keys, 3, 5)).astype("float32")
    v = rng.normal(size=(2, keys, 3, 5)).astype("float32")
    mask = rng.random((2, 4, keys)) < 0.5
    mask[0, 1] = False  # an all-masked row
    for kwargs in ({"mask": mask}, {"is_causal": True}, {}):
        default = scaled_dot_product_attention(q, k, v, **kwargs)
        monkeypatch.setattr(attention, "EXPLICIT_MAX_KEYS", 0)
        fused = scaled_dot_product_attention(q, k, v, **kwargs)
        monkeypatch.undo()
        explicit, weights = scaled_dot_product_attention(q, k, v, return_scores=True, **kwargs)
        bound = tol.chain_atol(_core_roundings(5, keys), to_numpy(explicit), paths=2)
        tol.assert_within(to_numpy(fused), to_numpy(explicit), bound)
        tol.assert_within(to_numpy(default), to_numpy(explicit), bound)
        assert weights.shape == (2, 3, 4, keys)


def _torch_shortcuts_on():
    from transformerkit import fastpath

    return keras.backend.backend() == "torch" and fastpath.ENABLED


@pytest.mark.skipif(not _torch_shortcuts_on(), reason="the PyTorch shortcut")
def test_explicit_attention_is_chosen_for_short_keys_on_torch(monkeypatch):
    """Eager PyTorch takes the explicit formula up to EXPLICIT_MAX_KEYS keys and the fused
    kernel above (counted by replacing the kernel); the switch turns the choice off."""
    import torch

    from transformerkit import fastpath
    from transformerkit.layers import attention

    calls = []
    kernel = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or kernel(*a, **k))
    limit = attention.EXPLICIT_MAX_KEYS
    for keys, fused in ((1, False), (limit, False), (limit + 1, True)):
        x = torch.ones(1, keys, 2, 4)
        calls.clear()
        scaled_dot_product_attention(x, x, x, is_causal=True)
        assert bool(calls) == fused, keys
    monkeypatch.setattr(fastpath, "ENABLED", False)
    assert not attention._explicit_is_faster(torch.ones(1, 3, 2, 4))


@pytest.mark.parametrize("length", [1, 3, 4, 7, 11, 15, 16, 21])
def test_softmax_over_short_rows_equals_float64(rng, length):
    """``kernel_softmax.softmax`` (rows of 4-15 entries padded to 16 on CPU PyTorch) against float64
    NumPy, with masked (-1e9) and -inf entries; its gradient equals the plain softmax's."""
    from transformerkit.kernels import softmax as kernel_softmax

    x = rng.normal(size=(3, 5, length)).astype("float32") * 3
    x[0, 1, : length // 2] = -1e9
    x[1, 2, length - 1] = -np.inf
    x[2, 0, :] = -1e9  # every entry masked: uniform
    shifted = x.astype("float64") - x.max(-1, keepdims=True)
    expected = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
    got = kernel_softmax.softmax(keras.ops.convert_to_tensor(x))
    assert tuple(got.shape) == x.shape
    n = length + tol.SOFTMAX_EXTRA  # the row's sum and the element-wise steps
    tol.assert_within(to_numpy(got), expected, tol.chain_atol(n, expected))
    if keras.backend.backend() == "torch":
        import torch

        upstream = torch.as_tensor(rng.normal(size=x.shape).astype("float32"))
        grads = []
        for fn in (kernel_softmax.softmax, lambda t: t.softmax(-1)):
            t = torch.as_tensor(x).requires_grad_()
            (fn(t) * upstream).sum().backward()
            grads.append(t.grad.numpy())
        # p * (g - sum(p g)): the softmax, the row's dot product, the difference, the product
        n = 2 * length + tol.SOFTMAX_EXTRA + 2
        tol.assert_within(grads[0], grads[1], tol.chain_atol(n, grads[1], paths=2))


def test_attention_dropout_only_while_training(rng):
    query = rng.normal(size=(2, 5, 8)).astype("float32")
    layer = MultiHeadAttention(2, 4, dropout=0.5)
    inference = to_numpy(layer(query, query))
    # exact: same kernels (no dropout either way)
    np.testing.assert_array_equal(to_numpy(layer(query, query, training=False)), inference)
    bound = tol.chain_atol(tol.attention_roundings(8, 4, 5, num_heads=2), inference)
    dropped = to_numpy(layer(query, query, training=True))
    # dropout moves outputs by O(0.1), over 1000 times the bound
    assert np.abs(dropped - inference).max() > 1000 * bound


def test_attention_get_config_round_trip():
    layer = MultiHeadAttention(3, 5, value_dim=2, output_dim=7, dropout=0.1, use_bias=False)
    clone = MultiHeadAttention.from_config(layer.get_config())
    for name in ("num_heads", "key_dim", "value_dim", "output_dim", "dropout", "use_bias"):
        assert getattr(clone, name) == getattr(layer, name)


# -- embeddings and positional encodings -------------------------------------------------------

# A fixed table: float64 angles and sines (far below one float32 rounding), the cast to float32.
_TABLE_ROUNDINGS = 2


@pytest.mark.parametrize("d_model", [8, 12, 7])
def test_paper_sinusoidal_table(d_model):
    expected = ref.paper_positional_table(30, d_model)  # float64 sines, cast to float32:
    tol.assert_within(sinusoidal_table(30, d_model, "sinusoidal"), expected,
                      tol.chain_atol(_TABLE_ROUNDINGS, expected))


@pytest.mark.parametrize("d_model", [8, 12, 7])
def test_sinusoidal_split_table_is_marians(d_model):
    expected = ref.marian_positional_table(30, d_model)
    tol.assert_within(sinusoidal_table(30, d_model, "sinusoidal_split"), expected,
                      tol.chain_atol(_TABLE_ROUNDINGS, expected))


@pytest.mark.parametrize("d_model", [8, 12, 7])
def test_t2t_timing_signal_table(d_model):
    expected = ref.t2t_positional_table(30, d_model)
    tol.assert_within(sinusoidal_table(30, d_model, "t2t"), expected,
                      tol.chain_atol(_TABLE_ROUNDINGS, expected))


def test_sinusoidal_kinds_differ_and_start_as_expected():
    paper, t2t = sinusoidal_table(4, 6, "sinusoidal"), sinusoidal_table(4, 6, "t2t")
    # exact: sin(0) = 0 and cos(0) = 1 in every libm
    np.testing.assert_array_equal(paper[0], [0, 1, 0, 1, 0, 1])  # interleaved sin, cos
    np.testing.assert_array_equal(t2t[0], [0, 0, 0, 1, 1, 1])  # sines, then cosines
    # t2t: the last timescale is max_timescale exactly (increment over d/2 - 1 steps);
    # relative bounds: these entries are small, a float32 cast errs relative to the value
    for got, expected in ((t2t[1, 2], math.sin(1e-4)),
                          (paper[1, 4], math.sin(1 / 10000 ** (4 / 6)))):
        tol.assert_within(got, expected, tol.relative(_TABLE_ROUNDINGS) * abs(expected))


@pytest.mark.parametrize("kind", ["sinusoidal", "t2t", "learned"])
def test_positional_encoding_adds_the_table(rng, kind):
    layer = PositionalEncoding(10, 6, kind=kind)
    x = rng.normal(size=(2, 4, 6)).astype("float32")
    out = to_numpy(layer(x))
    table = to_numpy(layer.table)
    if kind != "learned":
        expected = (ref.paper_positional_table(10, 6) if kind == "sinusoidal"
                    else ref.t2t_positional_table(10, 6))
        tol.assert_within(table, expected, tol.chain_atol(_TABLE_ROUNDINGS, expected))
    added = x + table[:4]  # float64: one float32 rounding away from the layer's sum
    tol.assert_within(out, added, tol.chain_atol(1, added))
    added = x[:, :2] + table[5:7]
    tol.assert_within(to_numpy(layer(x[:, :2], start_index=5)), added, tol.chain_atol(1, added))
    start = keras.ops.convert_to_tensor(5, "int32")  # a cache index inside a compiled loop
    tol.assert_within(to_numpy(layer(x[:, :2], start_index=start)), added,
                      tol.chain_atol(1, added))
    assert (len(layer.trainable_weights) == 1) == (kind == "learned")


def test_token_embedding_scales_masks_and_reverses(rng):
    layer = TokenEmbedding(11, 4)
    ids = np.array([[3, 0, 10], [1, 2, 0]])
    out = layer(ids)
    matrix = to_numpy(layer.embeddings)
    # exact: a gather, times sqrt(4) = 2 (a power of two)
    np.testing.assert_array_equal(to_numpy(out), matrix[ids] * 2.0)
    np.testing.assert_array_equal(to_numpy(layer.compute_mask(ids)), ids != 0)
    hidden = rng.normal(size=(2, 3, 4)).astype("float32")
    logits = layer(hidden, reverse=True)
    tol.assert_within(to_numpy(logits), hidden @ matrix.T, tol.product_atol(hidden, matrix.T))
    assert layer.compute_mask(hidden) is None
    unscaled = TokenEmbedding(11, 4, scale=False)
    # exact: a gather copies values
    np.testing.assert_array_equal(to_numpy(unscaled(ids)), to_numpy(unscaled.embeddings)[ids])


def test_token_embedding_loads_pretrained_matrix(rng):
    matrix = rng.normal(size=(7, 3)).astype("float32")
    layer = TokenEmbedding(7, 3, pretrained=matrix, scale=False)
    # exact: the matrix is copied, a gather copies values
    np.testing.assert_array_equal(to_numpy(layer(np.array([[1, 6]]))), matrix[[[1, 6]]])


# -- feed-forward ------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["relu", "gelu", "swish", "gelu_tanh"])
def test_feedforward_matches_reference(rng, activation):
    x = rng.normal(size=(2, 5, 6)).astype("float32")
    layer = FeedForward(6, 10, activation=activation)
    layer(x)
    _randomized(layer)
    expected = ref.feedforward(x, ref.feedforward_params(layer))
    tol.assert_within(to_numpy(layer(x)), expected,
                      tol.chain_atol(tol.feedforward_roundings(6, 10), expected))


def test_gelu_is_the_exact_erf_form():
    x = np.linspace(-3, 3, 13)
    layer = FeedForward(1, 1, activation="gelu")
    layer(np.zeros((1, 1, 1), "float32"))
    layer.inner.kernel.assign(np.ones((1, 1)))
    layer.outer.kernel.assign(np.ones((1, 1)))
    out = to_numpy(layer(x.reshape(1, -1, 1).astype("float32"))).ravel()
    bound = tol.chain_atol(tol.feedforward_roundings(1, 1), ref.gelu(x))  # ~1.4e-6
    tol.assert_within(out, ref.gelu(x), bound)
    # the tanh approximation differs by 4.4e-4 here (300x the bound); make sure we are not
    # using it
    approx = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    assert np.abs(out - approx).max() > 100 * bound


def test_swish_is_x_times_sigmoid_x():
    x = np.linspace(-6, 6, 25)
    layer = FeedForward(1, 1, activation="swish")
    layer(np.zeros((1, 1, 1), "float32"))
    layer.inner.kernel.assign(np.ones((1, 1)))
    layer.outer.kernel.assign(np.ones((1, 1)))
    out = to_numpy(layer(x.reshape(1, -1, 1).astype("float32"))).ravel()
    tol.assert_within(out, ref.swish(x), tol.chain_atol(tol.feedforward_roundings(1, 1),
                                                        ref.swish(x)))


def test_gelu_tanh_is_the_tanh_approximation():
    """gelu_tanh (GPT-2's gelu_new) against the float64 formula, and not the erf form."""
    x = np.linspace(-3, 3, 13)
    layer = FeedForward(1, 1, activation="gelu_tanh")
    layer(np.zeros((1, 1, 1), "float32"))
    layer.inner.kernel.assign(np.ones((1, 1)))
    layer.outer.kernel.assign(np.ones((1, 1)))
    out = to_numpy(layer(x.reshape(1, -1, 1).astype("float32"))).ravel()
    bound = tol.chain_atol(tol.feedforward_roundings(1, 1), ref.gelu_tanh(x))
    tol.assert_within(out, ref.gelu_tanh(x), bound)
    assert np.abs(out - ref.gelu(x)).max() > 100 * bound


# -- encoder and decoder blocks ------------------------------------------------------------


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_matches_reference(rng, norm_position, activation):
    x = rng.normal(size=(3, 6, 8)).astype("float32")
    mask = _padding([6, 2, 4], 6)
    block = EncoderBlock(8, 2, 12, dropout=0.0, norm_position=norm_position,
                         activation=activation, key_dim=3, value_dim=5)
    block(x)
    _randomized(block)
    params = ref.block_params(block)
    assert params["self_attention_norm"]["epsilon"] == 1e-6
    expected = ref.encoder_block(x, params, key_mask=mask)
    n = tol.block_roundings(8, 12, 3, 6, 2, value_dim=5)
    tol.assert_within(to_numpy(block(x, mask=mask)), expected, tol.chain_atol(n, expected))


def test_encoder_block_explicit_attention_mask(rng):
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    explicit = rng.random((2, 5, 5)) < 0.5
    block = EncoderBlock(8, 2, 12, dropout=0.0)
    block(x)
    _randomized(block)
    expected = ref.encoder_block(x, ref.block_params(block), attention_mask=explicit)
    tol.assert_within(to_numpy(block(x, attention_mask=explicit)), expected,
                      tol.chain_atol(tol.block_roundings(8, 12, 4, 5, 2), expected))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_decoder_block_matches_reference(rng, norm_position):
    x = rng.normal(size=(3, 5, 8)).astype("float32")
    context = rng.normal(size=(3, 7, 8)).astype("float32")
    target_mask, context_mask = _padding([5, 3, 1], 5), _padding([7, 2, 5], 7)
    block = DecoderBlock(8, 4, 16, dropout=0.0, norm_position=norm_position, activation="gelu")
    block(x, context)
    _randomized(block)
    out = block(x, context, inputs_mask=target_mask, context_mask=context_mask)
    expected = ref.decoder_block(x, ref.block_params(block), context, target_mask, context_mask)
    n = tol.block_roundings(8, 16, 2, 5, 4, cross_keys=7)
    tol.assert_within(to_numpy(out), expected, tol.chain_atol(n, expected))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_decoder_block_without_cross_attention_matches_reference(rng, norm_position):
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    mask = _padding([6, 4], 6)
    block = DecoderBlock(8, 2, 16, dropout=0.0, norm_position=norm_position,
                         cross_attention=False)
    block(x)
    _randomized(block)
    expected = ref.decoder_block(x, ref.block_params(block), target_mask=mask)
    tol.assert_within(to_numpy(block(x, mask=mask)), expected,
                      tol.chain_atol(tol.block_roundings(8, 16, 4, 6, 2), expected))


def test_block_dropout_only_while_training(rng):
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    block = EncoderBlock(8, 2, 16, dropout=0.3)
    inference = to_numpy(block(x))
    # exact: same kernels (no dropout either way)
    np.testing.assert_array_equal(to_numpy(block(x, training=False)), inference)
    bound = tol.chain_atol(tol.block_roundings(8, 16, 4, 5, 2), inference)
    dropped = to_numpy(block(x, training=True))
    # dropout moves outputs by O(1), over 1000 times the bound
    assert np.abs(dropped - inference).max() > 1000 * bound


# -- cached decoding at layer level -----------------------------------------------------------


def test_attention_cache_equals_full_causal_attention(rng):
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    layer = MultiHeadAttention(2, 4, value_dim=3)
    layer(x, x)
    _randomized(layer)
    full = to_numpy(layer(x, x, use_causal_mask=True))
    cache = (np.zeros((2, 6, 2, 4), "float32"), np.zeros((2, 6, 2, 3), "float32"))
    steps = []
    for i in range(6):
        out, cache = layer(x[:, i:i + 1], x[:, i:i + 1], use_causal_mask=True, cache=cache,
                           cache_index=i)
        steps.append(to_numpy(out))
    n = tol.attention_roundings(8, 4, 6, value_dim=3, num_heads=2)
    tol.assert_within(np.concatenate(steps, axis=1), full, tol.chain_atol(n, full, paths=2))


def test_attention_cache_with_padding_of_the_cached_keys(rng):
    """A ``(batch, cache_len)`` key mask masks padded cache slots; a Keras mask of the new
    positions only (what Keras fills in from the inputs) does not disturb the cache."""
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    key_mask = _padding([5, 2], 5)
    layer = MultiHeadAttention(2, 4)
    layer(x, x)
    _randomized(layer)
    full, _ = ref.multi_head_attention(x, x, ref.attention_params(layer), 2, key_mask=key_mask,
                                       causal=True)
    bound = tol.chain_atol(tol.attention_roundings(8, 4, 5, num_heads=2), full)
    cache = (np.zeros((2, 5, 2, 4), "float32"), np.zeros((2, 5, 2, 4), "float32"))
    for i in range(5):
        out, cache = layer(x[:, i:i + 1], x[:, i:i + 1], key_mask=key_mask,
                           use_causal_mask=True, cache=cache, cache_index=i)
        tol.assert_within(to_numpy(out)[0, 0], full[0, i], bound)
        if i < 2:  # real queries of the padded sequence
            tol.assert_within(to_numpy(out)[1, 0], full[1, i], bound)
    cache = (np.zeros((2, 5, 2, 4), "float32"), np.zeros((2, 5, 2, 4), "float32"))
    for i in range(5):
        step_mask = np.ones((2, 1), bool)
        out, cache = layer(x[:, i:i + 1], x[:, i:i + 1], value_mask=step_mask,
                           use_causal_mask=True, cache=cache, cache_index=i)
    full_unpadded, _ = ref.multi_head_attention(x, x, ref.attention_params(layer), 2,
                                                causal=True)
    tol.assert_within(to_numpy(out)[:, 0], full_unpadded[:, 4],
                      tol.chain_atol(tol.attention_roundings(8, 4, 5, num_heads=2),
                                     full_unpadded))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("cross_attention", [True, False])
def test_decoder_block_cache_equals_full(rng, norm_position, cross_attention):
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    context = rng.normal(size=(2, 4, 8)).astype("float32")
    context_mask = _padding([4, 2], 4)
    block = DecoderBlock(8, 2, 16, dropout=0.0, norm_position=norm_position,
                         cross_attention=cross_attention)
    ctx = context if cross_attention else None
    block(x, ctx)
    _randomized(block)
    full = to_numpy(block(x, ctx, context_mask=context_mask if cross_attention else None))
    cache = block.init_cache(2, 8, context=ctx)
    steps = []
    for i in range(6):
        out, cache = block(x[:, i:i + 1], None, context_mask=context_mask, cache=cache,
                           cache_index=i)
        steps.append(to_numpy(out))
    # the cache holds 8 positions: the longest sums of the cached path run over 8 keys
    n = tol.block_roundings(8, 16, 4, 8, 2, cross_keys=4 if cross_attention else 0)
    tol.assert_within(np.concatenate(steps, axis=1), full, tol.chain_atol(n, full, paths=2))


@pytest.mark.parametrize("kind, timescales, reference", [
    ("t2t", (2.0, 500.0), lambda: ref.t2t_positional_table(12, 8, 2.0, 500.0)),
    ("sinusoidal", (1.0, 100.0), lambda: ref.paper_positional_table(12, 8, base=100.0)),
])
def test_models_pass_their_timescales_to_the_table(kind, timescales, reference):
    """``min_timescale`` / ``max_timescale`` reach every model's position tables, and survive
    the config round trip."""
    from transformerkit.models import GPT, Transformer

    low, high = timescales
    transformer = Transformer(20, 20, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                              max_length=12, positional=kind, min_timescale=low,
                              max_timescale=high)
    gpt = GPT(20, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=12,
              positional=kind, min_timescale=low, max_timescale=high)
    for model in (transformer, gpt, Transformer.from_config(transformer.get_config())):
        model.build(None)
        layers = [model.source_positions, model.target_positions] if hasattr(
            model, "source_positions") else [model.positions]
        for layer in layers:
            tol.assert_within(to_numpy(layer.table), reference(),
                              tol.chain_atol(_TABLE_ROUNDINGS, reference()))


@pytest.mark.parametrize("kwargs, message", [
    (dict(positional="sinusoidal", min_timescale=2.0), "applies to positional='t2t' only"),
    (dict(positional="learned", max_timescale=100.0), "not to learned"),
    (dict(positional="t2t", min_timescale=10.0, max_timescale=5.0), "0 < min_timescale"),
])
def test_timescales_that_would_be_ignored_are_errors(kwargs, message):
    from transformerkit.models import Transformer

    with pytest.raises(ValueError, match=message):
        Transformer(20, 20, num_layers=1, d_model=8, num_heads=2, d_ff=16, **kwargs)


# -- the tolerances still see a mistake ---------------------------------------------------------


def test_tolerances_still_catch_a_wrong_attention_scale(rng, monkeypatch):
    """Planted bug: attention scores scaled by 1/d_k instead of 1/sqrt(d_k) (the fused kernel
    and the explicit formula both take the scale from ``math.sqrt``)."""
    import types

    from transformerkit.layers import attention

    monkeypatch.setattr(attention, "math", types.SimpleNamespace(sqrt=lambda x: x))
    for path in ("fused", "explicit"):
        tol.assert_caught(test_attention_matches_reference, rng, monkeypatch, "self_padding",
                          path)
    tol.assert_caught(test_encoder_block_matches_reference, rng, "pre", "gelu")
