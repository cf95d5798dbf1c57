"""Masks by invariance: padding and future tokens never change real outputs, gradients to the
future are exactly zero, and rows with nothing to attend to give zeros instead of NaN."""

import keras
import numpy as np
import pytest
import reference as ref
import tolerances as tol
from hypothesis import given, settings
from hypothesis import strategies as st
from keras import ops
from reference import to_numpy

from transformerkit.layers import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    TokenEmbedding,
    attention_mask,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from transformerkit.models import GPT, Encoder, Transformer


def _pad(ids, width):
    ids = np.asarray(ids)
    return np.pad(ids, [(0, 0), (0, width - ids.shape[1])])


@pytest.fixture(scope="module")
def transformer():
    keras.utils.set_random_seed(3)
    model = Transformer(20, 18, num_layers=2, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
                        max_length=16)
    model((np.ones((1, 2), "int32"), np.ones((1, 2), "int32")))
    ref.randomize_weights(model, seed=3)
    return model


@pytest.fixture(scope="module")
def gpt():
    keras.utils.set_random_seed(4)
    model = GPT(15, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_length=16)
    model(np.ones((1, 2), "int32"))
    ref.randomize_weights(model, seed=4)
    return model


@pytest.fixture(scope="module")
def encoder():
    keras.utils.set_random_seed(5)
    model = Encoder(15, num_layers=2, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
                    max_length=16, pooling="mean")
    model(np.ones((1, 2), "int32"))
    ref.randomize_weights(model, seed=5)
    return model


SOURCE = np.array([[4, 5, 6, 7, 0], [8, 9, 0, 0, 0], [3, 0, 0, 0, 0]])
TARGET = np.array([[1, 2, 3, 4], [1, 5, 6, 0], [1, 7, 0, 0]])


def _real(target):
    return np.asarray(target) != 0


def _two_runs(model, expected, source_len=0, target_len=0, extra=0):
    """Bound of two float32 forward passes of ``model`` compared with each other (padded
    and unpadded, batched and alone: other shapes, other kernels), keys up to the given
    lengths; ``extra`` roundings after the model's own (pooling)."""
    n = tol.model_roundings(model, source_len, target_len) + extra
    return tol.chain_atol(n, expected, paths=2)


# -- the helpers ------------------------------------------------------------------------------


def test_padding_mask_is_true_at_real_tokens():
    np.testing.assert_array_equal(to_numpy(padding_mask(np.array([[5, 0, 3, 0]]))),
                                  [[True, False, True, False]])


def test_causal_mask_with_offset():
    np.testing.assert_array_equal(to_numpy(causal_mask(3, 3))[0], np.tril(np.ones((3, 3), bool)))
    # a single query at absolute position 2 sees keys 0..2 of a 5-slot cache
    np.testing.assert_array_equal(to_numpy(causal_mask(1, 5, query_offset=2))[0],
                                  [[True, True, True, False, False]])


def test_attention_mask_combines_padding_causal_and_explicit():
    key_mask = np.array([[True, True, False]])
    explicit = np.array([[[True, False, True], [True, True, True], [True, True, True]]])
    mask = to_numpy(attention_mask(key_mask=key_mask, causal=True, explicit_mask=explicit,
                                   query_len=3, key_len=3))
    np.testing.assert_array_equal(mask[0], [[True, False, False], [True, True, False],
                                            [True, True, False]])
    assert attention_mask() is None


# -- Keras mask propagation ---------------------------------------------------------------


def test_keras_masks_propagate_through_every_layer(rng):
    ids = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 0]])
    x = PositionalEncoding(10, 8)(TokenEmbedding(12, 8)(ids))
    context = TokenEmbedding(12, 8)(np.array([[3, 4, 0], [5, 0, 0]]))
    outputs = {
        "positions": x,
        "attention": MultiHeadAttention(2, 4)(x, context),
        "feedforward": FeedForward(8, 16)(x),
        "encoder_block": EncoderBlock(8, 2, 16)(x),
        "decoder_block": DecoderBlock(8, 2, 16)(x, context),
        "gpt_block": DecoderBlock(8, 2, 16, cross_attention=False)(x),
    }
    for name, output in outputs.items():
        mask = keras.src.backend.get_keras_mask(output)
        assert mask is not None, f"{name} dropped the padding mask"
        np.testing.assert_array_equal(to_numpy(mask), ids != 0, err_msg=name)


def test_functional_stack_of_blocks_masks_padding_in_every_block():
    """Layers composed by Keras (mask carried from block to block) match the reference."""
    ids = keras.Input((None,), dtype="int32")
    embedding, positions = TokenEmbedding(12, 8), PositionalEncoding(10, 8)
    blocks = [EncoderBlock(8, 2, 16, dropout=0.0), EncoderBlock(8, 2, 16, dropout=0.0,
                                                               norm_position="pre")]
    x = positions(embedding(ids))
    for block in blocks:
        x = block(x)
    model = keras.Model(ids, x)
    ref.randomize_weights(model)
    batch = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 10]])
    expected = ref.embed(batch, {"embeddings": to_numpy(embedding.embeddings), "scale": True,
                                 "positions": ref.paper_positional_table(10, 8)})
    for block in blocks:
        expected = ref.encoder_block(expected, ref.block_params(block), key_mask=batch != 0)
    n = 3 + 2 * tol.block_roundings(8, 16, 4, 5, 2)  # embedding and position, two blocks
    tol.assert_within(to_numpy(model(batch))[batch != 0], expected[batch != 0],
                      tol.chain_atol(n, expected[batch != 0]))


# -- padding invariance ----------------------------------------------------------------------


def test_extra_source_padding_changes_nothing(transformer):
    base = to_numpy(transformer((SOURCE, TARGET)))
    for width in (6, 9):
        tol.assert_within(to_numpy(transformer((_pad(SOURCE, width), TARGET))), base,
                          _two_runs(transformer, base, width, TARGET.shape[1]))


def test_extra_target_padding_changes_nothing_at_real_positions(transformer):
    base = to_numpy(transformer((SOURCE, TARGET)))
    longer = to_numpy(transformer((SOURCE, _pad(TARGET, 7))))
    tol.assert_within(longer[:, :4][_real(TARGET)], base[_real(TARGET)],
                      _two_runs(transformer, base, SOURCE.shape[1], 7))


def test_padded_batch_equals_each_sequence_alone(transformer):
    batch = to_numpy(transformer((SOURCE, TARGET)))
    for row in range(len(SOURCE)):
        source = SOURCE[row:row + 1, :max(1, int((SOURCE[row] != 0).sum()))]
        target = TARGET[row:row + 1, :int((TARGET[row] != 0).sum())]
        alone = to_numpy(transformer((source, target)))
        tol.assert_within(batch[row, :target.shape[1]], alone[0],
                          _two_runs(transformer, batch, SOURCE.shape[1], TARGET.shape[1]))


@settings(max_examples=8, deadline=None)
@given(source_lengths=st.lists(st.integers(1, 6), min_size=2, max_size=2),
       extra=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_padding_invariance_random(transformer, source_lengths, extra, seed):
    rng = np.random.default_rng(seed)
    source = np.zeros((2, 6), "int32")
    for row, n in enumerate(source_lengths):
        source[row, :n] = rng.integers(1, 20, n)
    target = rng.integers(1, 18, (2, 4)).astype("int32")
    base = to_numpy(transformer((source, target)))
    tol.assert_within(to_numpy(transformer((_pad(source, 6 + extra), target))), base,
                      _two_runs(transformer, base, 6 + extra, 4))


def test_gpt_extra_padding_changes_nothing(gpt):
    ids = np.array([[3, 4, 5, 6, 0], [7, 8, 0, 0, 0]])
    base = to_numpy(gpt(ids))
    longer = to_numpy(gpt(_pad(ids, 8)))
    tol.assert_within(longer[:, :5][_real(ids)], base[_real(ids)],
                      _two_runs(gpt, base, target_len=8))


@pytest.mark.parametrize("pooling", [None, "mean", "cls"])
def test_encoder_padding_changes_nothing(pooling):
    model = Encoder(15, num_layers=2, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
                    max_length=16, pooling=pooling, norm_position="pre")
    ids = np.array([[3, 4, 5, 6, 0], [7, 8, 0, 0, 0]])
    model(ids)
    ref.randomize_weights(model, seed=6)
    base, longer = to_numpy(model(ids)), to_numpy(model(_pad(ids, 9)))
    # pooling: a mean over at most 9 positions (9 additions, a division) or a tanh
    bound = _two_runs(model, base, target_len=9, extra=10 + tol.ELEMENTWISE_ULPS)
    if pooling is None:
        tol.assert_within(longer[:, :5][_real(ids)], base[_real(ids)], bound)
    else:
        tol.assert_within(longer, base, bound)
    alone = to_numpy(model(ids[1:, :2]))
    tol.assert_within(alone[0] if pooling else alone[0, :2],
                      base[1] if pooling else base[1, :2], bound)


# -- causality ---------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [0, 2, 4])
def test_transformer_future_targets_change_nothing_before(transformer, rng, t):
    source = np.array([[4, 5, 6, 7, 8], [9, 10, 11, 0, 0]])
    target = rng.integers(1, 18, (2, 6))
    changed = target.copy()
    changed[:, t + 1:] = rng.integers(1, 18, (2, 5 - t))
    changed[1, -1] = 0  # a pad among the later tokens must not matter either
    a = to_numpy(transformer((source, target)))
    b = to_numpy(transformer((source, changed)))
    # two runs: ``changed`` has a pad, so a padding mask where ``target`` has the causal flag
    bound = _two_runs(transformer, a, source.shape[1], target.shape[1])
    tol.assert_within(a[:, :t + 1], b[:, :t + 1], bound)
    # the test can see changes: later logits move by O(1), over 100 times the bound
    assert np.abs(a[:, t + 1:] - b[:, t + 1:]).max() > 100 * bound


@pytest.mark.parametrize("t", [0, 3])
def test_gpt_future_tokens_change_nothing_before(gpt, rng, t):
    ids = rng.integers(1, 15, (2, 7))
    changed = ids.copy()
    changed[:, t + 1:] = rng.integers(1, 15, (2, 6 - t))
    a, b = to_numpy(gpt(ids)), to_numpy(gpt(changed))
    bound = _two_runs(gpt, a, target_len=ids.shape[1])
    tol.assert_within(a[:, :t + 1], b[:, :t + 1], bound)
    assert np.abs(a[:, t + 1:] - b[:, t + 1:]).max() > 100 * bound  # as above: O(1) changes


def _gradient_rows(grad):
    """Largest absolute gradient per position: ``(batch, length)``."""
    return np.abs(grad).max(axis=-1)


@pytest.mark.parametrize("t", [0, 2, 5])
def test_gpt_gradient_to_later_positions_is_zero(gpt, grad_of, t):
    ids = np.array([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 0, 0]])
    embedded = to_numpy(gpt._embed(ids, gpt.token_embedding, gpt.positions))
    mask = padding_mask(ids)

    def logit_sum(x):
        hidden = gpt._run_decoder(x, mask, gpt.blocks, gpt.final_norm)
        return ops.sum(gpt.output_projection(hidden)[:, t])

    rows = _gradient_rows(grad_of(logit_sum, embedded))
    assert np.all(rows[:, t + 1:] == 0.0)
    assert np.all(rows[0, :t + 1] > 0.0)
    assert np.all(rows[1, :min(t + 1, 4)] > 0.0)
    assert np.all(rows[1, 4:t] == 0.0)  # padding keys get no gradient either


@pytest.mark.parametrize("t", [0, 3])
def test_transformer_gradient_to_later_targets_and_source_padding_is_zero(transformer, grad_of,
                                                                          t):
    source = np.array([[4, 5, 6, 7, 8], [9, 10, 0, 0, 0]])
    target = np.array([[1, 2, 3, 4, 5], [1, 6, 7, 8, 9]])
    source_mask, target_mask = padding_mask(source), padding_mask(target)
    m = transformer
    source_x = to_numpy(m._embed(source, m.source_embedding, m.source_positions))
    target_x = to_numpy(m._embed(target, m.target_embedding, m.target_positions))
    memory = m.encode(source)

    def from_target(x):
        hidden = m._run_decoder(x, target_mask, m.decoder_blocks, m.decoder_norm, memory,
                                source_mask)
        return ops.sum(m._logits(hidden)[:, t])

    rows = _gradient_rows(grad_of(from_target, target_x))
    assert np.all(rows[:, t + 1:] == 0.0) and np.all(rows[:, :t + 1] > 0.0)

    def from_source(x):
        memory = m._run_encoder(x, source_mask, m.encoder_blocks, m.encoder_norm)
        hidden = m._run_decoder(ops.convert_to_tensor(target_x), target_mask, m.decoder_blocks,
                                m.decoder_norm, memory, source_mask)
        return ops.sum(m._logits(hidden)[:, t])

    rows = _gradient_rows(grad_of(from_source, source_x))
    assert np.all(rows[1, 2:] == 0.0)  # padding positions of the source
    assert np.all(rows[0] > 0.0) and np.all(rows[1, :2] > 0.0)


def test_encoder_gradient_from_real_to_padding_is_zero(encoder, grad_of):
    ids = np.array([[3, 4, 5, 6], [7, 8, 0, 0]])
    mask = padding_mask(ids)
    embedded = to_numpy(encoder.positions(encoder.token_embedding(ids)))

    def real_sum(x):
        hidden = encoder._run_encoder(x, mask, encoder.blocks, encoder.final_norm)
        return ops.sum(hidden * ops.cast(ops.expand_dims(mask, -1), hidden.dtype))

    rows = _gradient_rows(grad_of(real_sum, embedded))
    assert np.all(rows[1, 2:] == 0.0) and np.all(rows[0] > 0) and np.all(rows[1, :2] > 0)


# -- rows with nothing to attend to --------------------------------------------------------------


def test_all_masked_attention_row_gives_zero_not_nan(rng):
    query = rng.normal(size=(2, 3, 8)).astype("float32")
    explicit = np.ones((2, 3, 3), bool)
    explicit[0, 1] = False  # query 1 of the first sequence may attend to nothing
    layer = MultiHeadAttention(2, 4, use_bias=False)
    for return_scores in (False, True):
        out = layer(query, query, attention_mask=explicit,
                    return_attention_scores=return_scores)
        out, scores = out if return_scores else (out, None)
        out = to_numpy(out)
        assert np.all(np.isfinite(out))
        np.testing.assert_array_equal(out[0, 1], 0.0)
        assert np.abs(out[0, 0]).max() > 0 and np.abs(out[1]).min(axis=-1).max() > 0
        if return_scores:
            scores = to_numpy(scores)
            np.testing.assert_array_equal(scores[0, :, 1], 0.0)
            # rows of a float32 softmax over 3 keys (summed here in float64) sum to 1
            tol.assert_within(scores[1].sum(-1), np.ones((2, 3)),
                              tol.chain_atol(3 + tol.SOFTMAX_EXTRA, 1.0))


@pytest.mark.parametrize("return_scores", [False, True], ids=["fused", "explicit"])
def test_attention_core_all_masked_rows_zero_with_finite_gradient(rng, grad_of, return_scores):
    q = rng.normal(size=(1, 2, 1, 4)).astype("float32")
    kv = rng.normal(size=(1, 3, 1, 4)).astype("float32")
    mask = np.array([[[True, False, True], [False, False, False]]])

    def attend(x):
        out = scaled_dot_product_attention(x, kv, kv, mask=mask, return_scores=return_scores)
        return out[0] if return_scores else out

    np.testing.assert_array_equal(to_numpy(attend(q))[0, 1], 0.0)
    grad = grad_of(lambda x: ops.sum(attend(x)), q)
    assert np.all(np.isfinite(grad)) and np.all(grad[0, 1] == 0.0)


def test_all_padding_sequence_in_batch(transformer, grad_of):
    source = np.array([[4, 5, 6], [0, 0, 0]])
    target = np.array([[1, 2, 3], [0, 0, 0]])
    logits = to_numpy(transformer((source, target)))
    assert np.all(np.isfinite(logits))
    alone = to_numpy(transformer((source[:1], target[:1])))
    tol.assert_within(logits[0], alone[0],  # the empty row changes nothing
                      _two_runs(transformer, alone, source.shape[1], target.shape[1]))
    m = transformer
    source_x = to_numpy(m._embed(source, m.source_embedding, m.source_positions))
    source_mask = padding_mask(source)

    def loss(x):
        memory = m._run_encoder(x, source_mask, m.encoder_blocks, m.encoder_norm)
        return ops.sum(m.decode(target, memory, source_mask))

    assert np.all(np.isfinite(grad_of(loss, source_x)))


def test_gpt_and_encoder_all_padding_row_is_finite(gpt, encoder):
    ids = np.array([[3, 4, 5], [0, 0, 0]])
    assert np.all(np.isfinite(to_numpy(gpt(ids))))
    pooled = to_numpy(encoder(ids))
    assert np.all(np.isfinite(pooled))
    np.testing.assert_array_equal(pooled[1], 0.0)  # mean over no real token


# -- the tolerances still see a mistake ---------------------------------------------------------


def test_tolerances_still_catch_a_dropped_padding_mask(transformer, monkeypatch):
    """Planted bug: attention ignores the padding (key) mask, so padded keys are attended.
    (Causal self-attention hides trailing pads anyway: the checks are bidirectional ones.)"""
    from transformerkit.layers import attention

    build_mask = attention._build_mask
    monkeypatch.setattr(attention, "_build_mask", lambda key_mask, *args: build_mask(None, *args))
    tol.assert_caught(test_extra_source_padding_changes_nothing, transformer)
    tol.assert_caught(test_encoder_padding_changes_nothing, "mean")
