"""Whole models: forward passes against the NumPy reference, cached decoding, tied and
frozen embeddings, parameter counts, attention scores, configs."""

import keras
import numpy as np
import pytest
import reference as ref
import tolerances as tol
from reference import to_numpy

from transformerkit.models import GPT, Encoder, Transformer
from transformerkit.training import attach_train_step, masked_cross_entropy, parameter_summary

SOURCE = np.array([[4, 5, 6, 7, 8, 9], [10, 11, 12, 0, 0, 0], [13, 0, 0, 0, 0, 0]])
TARGET = np.array([[1, 2, 3, 4, 5], [1, 6, 7, 0, 0], [1, 8, 9, 10, 0]])


def _built(model, inputs, seed=0):
    model(inputs)
    ref.randomize_weights(model, seed=seed)
    return model


def _encoder_roundings(model, length):
    """``model_roundings`` of an ``Encoder`` plus what it does not count: the type embedding's
    addition, and mean pooling (``length`` additions, a division) or the pooler (a product, a
    tanh); its output projection term covers the classifier."""
    n = tol.model_roundings(model, target_len=length) + (model.type_embedding is not None)
    if model.pooling == "mean":
        n += length + 1
    elif model.pooling == "cls":
        n += model.d_model + 1 + tol.ELEMENTWISE_ULPS
    return n


def _unique_size(variables):
    seen = {id(v): v for v in variables}
    return sum(int(np.prod(v.shape)) for v in seen.values())


# -- forward passes against the reference ------------------------------------------------------

TRANSFORMER_CONFIGS = {
    "paper": dict(norm_position="post", activation="relu", positional="sinusoidal",
                  tie_embeddings="none"),
    "pre_t2t_gelu_tied_all": dict(norm_position="pre", activation="gelu", positional="t2t",
                                  tie_embeddings="all"),
    "learned_tied_decoder_widths": dict(positional="learned", tie_embeddings="decoder",
                                        key_dim=5, value_dim=3, num_decoder_layers=1),
}


@pytest.mark.parametrize("name", TRANSFORMER_CONFIGS)
def test_transformer_forward_matches_reference(name):
    config = TRANSFORMER_CONFIGS[name]
    vocab = (20, 20) if config["tie_embeddings"] == "all" else (20, 16)
    model = _built(Transformer(*vocab, num_layers=2, d_model=12, num_heads=3, d_ff=20,
                               dropout=0.1, max_length=10, **config), (SOURCE, TARGET))
    logits = model((SOURCE, TARGET), training=False)
    assert logits.shape == (3, 5, vocab[1])
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    expected = ref.transformer_forward(ref.transformer_params(model), SOURCE, TARGET)
    n = tol.model_roundings(model, SOURCE.shape[1], TARGET.shape[1])
    tol.assert_within(to_numpy(logits), expected, tol.chain_atol(n, expected))


GPT_CONFIGS = {
    "gpt2_style": dict(),
    "paper_blocks_tied": dict(norm_position="post", activation="relu", positional="sinusoidal",
                              tie_embeddings="all"),
}


@pytest.mark.parametrize("name", GPT_CONFIGS)
def test_gpt_forward_matches_reference(name):
    ids = np.array([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0]])
    model = _built(GPT(14, num_layers=2, d_model=12, num_heads=2, d_ff=20, max_length=8,
                       **GPT_CONFIGS[name]), ids)
    expected = ref.gpt_forward(ref.gpt_params(model), ids)
    n = tol.model_roundings(model, target_len=ids.shape[1])
    tol.assert_within(to_numpy(model(ids)), expected, tol.chain_atol(n, expected))


ENCODER_CONFIGS = {
    "hidden_states": dict(),
    "mean_classifier": dict(pooling="mean", num_classes=3, norm_position="pre"),
    "bert_like": dict(pooling="cls", type_vocab_size=2, embedding_norm=True,
                      scale_embeddings=False, positional="learned", activation="gelu"),
}


@pytest.mark.parametrize("name", ENCODER_CONFIGS)
def test_encoder_forward_matches_reference(name):
    ids = np.array([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0]])
    types = np.array([[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]])
    config = ENCODER_CONFIGS[name]
    inputs = (ids, types) if config.get("type_vocab_size") else ids
    model = _built(Encoder(14, num_layers=2, d_model=12, num_heads=2, d_ff=20, max_length=8,
                           **config), inputs)
    expected = ref.encoder_forward(ref.encoder_params(model), ids,
                                   types if config.get("type_vocab_size") else None)
    got = to_numpy(model(inputs))
    tol.assert_within(got, expected,
                      tol.chain_atol(_encoder_roundings(model, ids.shape[1]), expected))
    if config.get("type_vocab_size"):
        as_dict = model({"token_ids": ids, "token_type_ids": types})
        # exact: same kernels (the same ids and types, packed in a dict)
        np.testing.assert_array_equal(to_numpy(as_dict), got)


def test_transformer_dropout_only_while_training():
    model = _built(Transformer(20, 20, num_layers=1, d_model=12, num_heads=2, d_ff=20,
                               dropout=0.3, max_length=10), (SOURCE, TARGET))
    inference = to_numpy(model((SOURCE, TARGET)))
    # exact: same kernels (no dropout either way)
    np.testing.assert_array_equal(to_numpy(model((SOURCE, TARGET), training=False)),
                                  inference)
    bound = tol.chain_atol(tol.model_roundings(model, SOURCE.shape[1], TARGET.shape[1]),
                           inference)
    dropped = to_numpy(model((SOURCE, TARGET), training=True))
    assert np.abs(dropped - inference).max() > 100 * bound  # dropout moves logits by O(1)


# -- cached decoding ------------------------------------------------------------------------


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_transformer_cached_decoding_equals_full(norm_position):
    target = np.array([[1, 2, 3, 4, 5, 6], [1, 7, 8, 9, 10, 11], [1, 12, 13, 14, 15, 3]])
    model = _built(Transformer(20, 16, num_layers=2, d_model=12, num_heads=3, d_ff=20,
                               dropout=0.0, max_length=10, norm_position=norm_position,
                               value_dim=2), (SOURCE, target))
    full = to_numpy(model((SOURCE, target)))
    memory = model.encode(SOURCE)
    source_mask = SOURCE != 0
    caches = model.init_caches(memory, 6)
    steps = []
    for i in range(6):
        logits, caches = model.decode(target[:, i:i + 1], None, source_mask, caches=caches,
                                      cache_index=i)
        steps.append(to_numpy(logits))
    # two float32 paths; the cached one attends over all 6 cache slots
    bound = tol.chain_atol(tol.model_roundings(model, SOURCE.shape[1], 6), full, paths=2)
    tol.assert_within(np.concatenate(steps, axis=1), full, bound)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_gpt_cached_decoding_equals_full(positional):
    ids = np.array([[3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 1, 2, 3]])
    model = _built(GPT(14, num_layers=2, d_model=12, num_heads=2, d_ff=20, max_length=8,
                       positional=positional), ids)
    full = to_numpy(model(ids))
    caches = model.init_caches(2, 8)
    steps = []
    for i in range(7):
        logits, caches = model(ids[:, i:i + 1], caches=caches, cache_index=i)
        steps.append(to_numpy(logits))
    # two float32 paths; the cached one attends over all 8 cache slots
    bound = tol.chain_atol(tol.model_roundings(model, target_len=8), full, paths=2)
    tol.assert_within(np.concatenate(steps, axis=1), full, bound)
    # a prompt of several tokens at once, then one token at a time
    caches = model.init_caches(2, 8)
    prompt, caches = model(ids[:, :4], caches=caches, cache_index=0)
    tol.assert_within(to_numpy(prompt), full[:, :4], bound)
    step, caches = model(ids[:, 4:5], caches=caches, cache_index=4)
    tol.assert_within(to_numpy(step), full[:, 4:5], bound)


def test_cached_decoding_with_tensor_cache_index():
    """``cache_index`` may be a backend scalar tensor (as in a compiled decoding loop)."""
    ids = np.array([[3, 4, 5, 6], [7, 8, 9, 10]])
    gpt = _built(GPT(14, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8), ids)
    full = to_numpy(gpt(ids))
    bound = tol.chain_atol(tol.model_roundings(gpt, target_len=4), full, paths=2)
    caches = gpt.init_caches(2, 4)
    for i in range(4):
        logits, caches = gpt(ids[:, i:i + 1], caches=caches,
                             cache_index=keras.ops.convert_to_tensor(i, "int32"))
        tol.assert_within(to_numpy(logits)[:, 0], full[:, i], bound)

    target = np.array([[1, 2, 3], [1, 4, 5], [1, 6, 7]])
    model = _built(Transformer(20, 16, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                               max_length=10), (SOURCE, target))
    full = to_numpy(model((SOURCE, target)))
    bound = tol.chain_atol(tol.model_roundings(model, SOURCE.shape[1], 3), full, paths=2)
    caches = model.init_caches(model.encode(SOURCE), 3)
    for i in range(3):
        logits, caches = model.decode(target[:, i:i + 1], None, SOURCE != 0, caches=caches,
                                      cache_index=keras.ops.convert_to_tensor(i, "int32"))
        tol.assert_within(to_numpy(logits)[:, 0], full[:, i], bound)


@pytest.mark.parametrize("first", ["encode", "attention_scores", "init_caches"])
def test_methods_other_than_call_may_come_first(first):
    """A fresh model can start with encode / attention_scores / init_caches, then be called."""
    transformer = Transformer(20, 16, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                              max_length=10)
    encoder = Encoder(14, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8)
    gpt = GPT(14, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8)
    ids = np.array([[3, 4, 5], [6, 7, 0]])
    if first == "encode":
        transformer.encode(SOURCE)
        encoder.encode(ids)
    elif first == "attention_scores":
        transformer.attention_scores(SOURCE, TARGET)
        encoder.attention_scores(ids)
        gpt.attention_scores(ids)
    else:
        transformer.init_caches(keras.ops.zeros((3, 6, 8)), 4)
        gpt.init_caches(2, 4)
    assert transformer((SOURCE, TARGET)).shape == (3, 5, 16)
    assert encoder(ids).shape == (2, 3, 8)
    assert gpt(ids).shape == (2, 3, 14)
    assert parameter_summary(encoder)["total"] == _unique_size(encoder.trainable_weights)


# -- tied and frozen embeddings ----------------------------------------------------------------


def test_tie_all_is_one_variable():
    model = _built(Transformer(20, 20, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                               max_length=10, tie_embeddings="all"), (SOURCE, TARGET))
    assert model.source_embedding is model.target_embedding
    matrices = [v for v in model.weights if v.shape == (20, 8)]
    assert len(matrices) == 1
    assert len(model.weights) == len({id(v) for v in model.weights})
    assert parameter_summary(model)["total"] == _unique_size(model.trainable_weights)
    # the one matrix is the source embedding, the target embedding and the output projection
    before = to_numpy(model((SOURCE, TARGET)))
    matrices[0].assign(to_numpy(matrices[0]) * 0.5)
    after = to_numpy(model((SOURCE, TARGET)))
    expected = ref.transformer_forward(ref.transformer_params(model), SOURCE, TARGET)
    bound = tol.chain_atol(tol.model_roundings(model, SOURCE.shape[1], TARGET.shape[1]),
                           expected)
    tol.assert_within(after, expected, bound)
    assert np.abs(before - after).max() > 100 * bound  # halving the matrix: O(1) changes


def test_tie_decoder_uses_target_embedding_as_projection():
    model = _built(Transformer(20, 17, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                               max_length=10, tie_embeddings="decoder"), (SOURCE, TARGET))
    assert model.output_projection is None
    assert model.source_embedding is not model.target_embedding
    assert [v.shape for v in model.weights].count((17, 8)) == 1
    assert [v.shape for v in model.weights].count((8, 17)) == 0
    untied = Transformer(20, 17, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=10)
    untied.build(None)
    # the untied model has an extra (8, 17) kernel and a 17-wide bias
    assert parameter_summary(untied)["total"] - parameter_summary(model)["total"] == 8 * 17 + 17


def test_gpt_tied_embedding_is_one_variable():
    model = GPT(14, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8,
                tie_embeddings="decoder")
    model.build(None)
    assert model.output_projection is None
    assert [v.shape for v in model.weights].count((14, 8)) == 1
    assert parameter_summary(model)["total"] == _unique_size(model.trainable_weights)


def _expected_transformer_parameters(vocab, d, heads, dk, dv, d_ff, layers, tie, max_length,
                                     learned=False):
    attention = 2 * (d * heads * dk + heads * dk) + d * heads * dv + heads * dv + heads * dv * d + d
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder = layers * (attention + ffn + 2 * norm)
    decoder = layers * (2 * attention + ffn + 3 * norm)
    embeddings = vocab * d * (1 if tie == "all" else 2) + (2 * max_length * d if learned else 0)
    head = 0 if tie != "none" else d * vocab + vocab
    return {"embeddings": embeddings, "encoder": encoder, "decoder": decoder,
            "output_head": head, "total": embeddings + encoder + decoder + head}


@pytest.mark.parametrize("tie", ["none", "decoder", "all"])
def test_parameter_summary_hand_count(tie):
    model = Transformer(30, 30, num_layers=2, d_model=8, num_heads=2, d_ff=12, max_length=10,
                        tie_embeddings=tie, key_dim=3, value_dim=5, positional="learned")
    counts = parameter_summary(model)
    assert counts == _expected_transformer_parameters(30, 8, 2, 3, 5, 12, 2, tie, 10,
                                                      learned=True)
    assert counts["total"] == _unique_size(model.trainable_weights)


def test_parameter_summary_counts_frozen_embeddings_but_not_fixed_tables():
    frozen = Transformer(30, 30, num_layers=1, d_model=8, num_heads=2, d_ff=12, max_length=10,
                         embeddings_trainable=False)
    counts = parameter_summary(frozen)
    assert counts == _expected_transformer_parameters(30, 8, 2, 4, 4, 12, 1, "none", 10)


def test_paper_base_model_has_about_65m_parameters():
    model = Transformer(37000, 37000, num_layers=6, d_model=512, num_heads=8, d_ff=2048,
                        tie_embeddings="all")
    counts = parameter_summary(model)
    assert 60e6 <= counts["total"] <= 66e6
    assert counts == _expected_transformer_parameters(37000, 512, 8, 64, 64, 2048, 6, "all", 256)


LEARNING_RATE = 1e-2


def _train_one_step(model, inputs, labels):
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE),
                  loss=lambda y, p: masked_cross_entropy(y, p))
    attach_train_step(model)
    model.train_on_batch(inputs, labels)


def _trained(after, before):
    """Whether one Adam step moved the weight: its first step is ``lr g / (|g| + eps)``, about
    the learning rate for every entry with a gradient; an untouched weight keeps its bits."""
    return np.abs(to_numpy(after) - before).max() > LEARNING_RATE / 2


def test_frozen_pretrained_transformer_embeddings(rng):
    source_matrix = rng.normal(size=(20, 8)).astype("float32")
    target_matrix = rng.normal(size=(16, 8)).astype("float32")
    model = Transformer(20, 16, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=10,
                        source_embeddings=source_matrix, target_embeddings=target_matrix,
                        embeddings_trainable=False)
    model((SOURCE, TARGET))
    np.testing.assert_array_equal(to_numpy(model.source_embedding.embeddings), source_matrix)
    np.testing.assert_array_equal(to_numpy(model.target_embedding.embeddings), target_matrix)
    frozen_ids = {id(model.source_embedding.embeddings), id(model.target_embedding.embeddings)}
    assert not frozen_ids & {id(v) for v in model.trainable_weights}
    others = {v.path: to_numpy(v) for v in model.trainable_weights}
    _train_one_step(model, (SOURCE, TARGET), np.roll(TARGET, -1, axis=1))
    np.testing.assert_array_equal(to_numpy(model.source_embedding.embeddings), source_matrix)
    np.testing.assert_array_equal(to_numpy(model.target_embedding.embeddings), target_matrix)
    changed = [_trained(v, others[v.path]) for v in model.trainable_weights]
    assert sum(changed) > len(changed) // 2


def test_trainable_pretrained_embeddings_are_loaded_and_train(rng):
    matrix = rng.normal(size=(20, 8)).astype("float32")
    model = Transformer(20, 20, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=10,
                        tie_embeddings="all", source_embeddings=matrix)
    model((SOURCE, TARGET))
    np.testing.assert_array_equal(to_numpy(model.target_embedding.embeddings), matrix)
    _train_one_step(model, (SOURCE, TARGET), np.roll(TARGET, -1, axis=1))
    assert _trained(model.source_embedding.embeddings, matrix)


def test_frozen_pretrained_gpt_and_encoder_embeddings(rng):
    ids = np.array([[3, 4, 5, 6], [7, 8, 0, 0]])
    matrix = rng.normal(size=(14, 8)).astype("float32")
    gpt = GPT(14, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8,
              embeddings=matrix, embeddings_trainable=False)
    gpt(ids)
    np.testing.assert_array_equal(to_numpy(gpt.token_embedding.embeddings), matrix)
    _train_one_step(gpt, ids, np.roll(ids, -1, axis=1))
    np.testing.assert_array_equal(to_numpy(gpt.token_embedding.embeddings), matrix)
    assert parameter_summary(gpt)["embeddings"] >= 14 * 8

    encoder = Encoder(14, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8,
                      embeddings=matrix, embeddings_trainable=False, pooling="mean",
                      num_classes=2)
    encoder(ids)
    np.testing.assert_array_equal(to_numpy(encoder.token_embedding.embeddings), matrix)
    classifier = to_numpy(encoder.classifier.kernel)
    encoder.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    attach_train_step(encoder)
    encoder.train_on_batch(ids, np.array([0, 1]))
    np.testing.assert_array_equal(to_numpy(encoder.token_embedding.embeddings), matrix)
    assert _trained(encoder.classifier.kernel, classifier)


# -- attention scores and configs ----------------------------------------------------------


def test_transformer_attention_scores():
    model = _built(Transformer(20, 16, num_layers=2, d_model=8, num_heads=2, d_ff=16,
                               dropout=0.0, max_length=10), (SOURCE, TARGET))
    scores = model.attention_scores(SOURCE, TARGET)
    assert [len(scores[k]) for k in ("encoder", "decoder_self", "cross")] == [2, 2, 2]
    params = ref.transformer_params(model)
    for name, shape in (("encoder", (3, 2, 6, 6)), ("decoder_self", (3, 2, 5, 5)),
                        ("cross", (3, 2, 5, 6))):
        for layer_scores in scores[name]:
            weights = to_numpy(layer_scores)
            assert weights.shape == shape
            # a float32 softmax's rows (summed here in float64) sum to one
            tol.assert_within(weights.sum(-1), np.ones(shape[:-1]),
                              tol.chain_atol(shape[-1] + tol.SOFTMAX_EXTRA, 1.0))
    cross = to_numpy(scores["cross"][0])
    np.testing.assert_array_equal(cross[1, :, :, 3:], 0.0)  # padding source keys
    future = np.triu(np.ones((5, 5), bool), 1)
    np.testing.assert_array_equal(to_numpy(scores["decoder_self"][1])[:, :, future], 0.0)
    # first encoder layer's weights against the reference
    embedded = ref.embed(SOURCE, params["source_embedding"])
    _, expected = ref.multi_head_attention(embedded, embedded,
                                           params["encoder_blocks"][0]["self_attention"], 2,
                                           key_mask=SOURCE != 0)
    n = 3 + tol.attention_roundings(8, 4, SOURCE.shape[1], num_heads=2)  # embedding, layer
    tol.assert_within(to_numpy(scores["encoder"][0]), expected, tol.chain_atol(n, expected))


def test_gpt_and_encoder_attention_scores():
    ids = np.array([[3, 4, 5, 6], [7, 8, 0, 0]])
    gpt = _built(GPT(14, num_layers=2, d_model=8, num_heads=2, d_ff=16, max_length=8), ids)
    weights = to_numpy(gpt.attention_scores(ids)["self"][0])
    assert weights.shape == (2, 2, 4, 4)
    np.testing.assert_array_equal(np.triu(weights[0, 0], 1), 0.0)
    encoder = _built(Encoder(14, num_layers=2, d_model=8, num_heads=2, d_ff=16, max_length=8),
                     ids)
    weights = to_numpy(encoder.attention_scores(ids)["self"][1])
    assert weights.shape == (2, 2, 4, 4)
    np.testing.assert_array_equal(weights[1, :, :, 2:], 0.0)


@pytest.mark.parametrize("make", [
    lambda: Transformer(20, 16, num_layers=2, d_model=12, num_heads=3, d_ff=20, max_length=10,
                        norm_position="pre", activation="gelu", positional="t2t",
                        tie_embeddings="decoder", key_dim=5, value_dim=3, num_decoder_layers=1,
                        attention_dropout=0.1, layer_norm_epsilon=1e-5,
                        embeddings_trainable=False),
    lambda: GPT(14, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8,
                norm_position="post", positional="sinusoidal", tie_embeddings="all"),
    lambda: Encoder(14, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8,
                    type_vocab_size=2, embedding_norm=True, scale_embeddings=False,
                    pooling="cls", num_classes=4),
], ids=["transformer", "gpt", "encoder"])
def test_get_config_round_trip(make):
    model = make()
    config = model.get_config()
    clone = model.__class__.from_config(config)
    assert clone.get_config() == config
    model.build(None)
    clone.build(None)
    assert [v.path.split("/", 1)[1] for v in clone.weights] == \
        [v.path.split("/", 1)[1] for v in model.weights]
    assert parameter_summary(clone) == parameter_summary(model)


def _softmax64(logits):
    x = np.asarray(logits, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("kind", ["transformer", "gpt", "encoder"])
def test_return_logits_false_gives_the_probabilities(kind):
    """``return_logits=False``: the float64 softmax of the logits, rows summing to 1."""
    rng = np.random.default_rng(0)
    small = dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=8)
    if kind == "transformer":
        model = Transformer(30, 25, **small)
        inputs = (rng.integers(1, 30, (2, 5)), rng.integers(1, 25, (2, 4)))
    elif kind == "gpt":
        model = GPT(30, **small)
        inputs = rng.integers(1, 30, (2, 5))
    else:
        model = Encoder(30, pooling="mean", num_classes=3, **small)
        inputs = rng.integers(1, 30, (2, 5))
    logits = to_numpy(model(inputs))
    probabilities = to_numpy(model(inputs, return_logits=False))
    # the same logits (same kernels), then a float32 softmax over the classes
    softmax = tol.chain_atol(probabilities.shape[-1] + tol.SOFTMAX_EXTRA, 1.0)
    tol.assert_within(probabilities, _softmax64(logits), softmax)
    tol.assert_within(probabilities.sum(-1), np.ones(probabilities.shape[:-1]), softmax)


# -- the tolerances still see a mistake ---------------------------------------------------------


def test_tolerances_still_catch_an_off_by_one_position(monkeypatch):
    """Planted bug: every position reads the row after its own in the positional table."""
    from transformerkit.layers import embeddings

    call = embeddings.PositionalEncoding.call
    monkeypatch.setattr(embeddings.PositionalEncoding, "call",
                        lambda self, x, start_index=0: call(self, x, start_index + 1))
    tol.assert_caught(test_transformer_forward_matches_reference, "paper")
    tol.assert_caught(test_gpt_forward_matches_reference, "gpt2_style")
