"""Bad arguments and inputs of the layers and models get a clear error, raised where they
enter (the constructor or the call), naming the problem and the value.

Bad values elsewhere: the run config in ``tests/config/test_config.py``, the command line in
``tests/cli/test_parser.py``, the loss and schedule arguments in
``tests/training/test_training_math.py``, random text in ``tests/test_input_fuzz.py``; failures
that are not the caller's input (kills, corrupt files, full disks, NaN losses) in
``tests/training/test_failure_recovery.py``.
"""

import numpy as np
import pytest

from transformerkit.layers import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    TokenEmbedding,
)
from transformerkit.models import GPT, Encoder, Transformer

SMALL = dict(num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=6)


@pytest.fixture(scope="module")
def models():
    transformer = Transformer(10, 12, **SMALL)
    gpt = GPT(10, **SMALL)
    encoder = Encoder(10, type_vocab_size=2, **SMALL)
    return {"transformer": transformer, "gpt": gpt, "encoder": encoder}


def _call(models, kind, ids):
    """Feed ``ids`` where each model takes token ids (source and target for the Transformer)."""
    if kind == "transformer_source":
        return models["transformer"]((ids, np.array([[1, 2]])))
    if kind == "transformer_target":
        return models["transformer"]((np.array([[1, 2]]), ids))
    return models[kind](ids)


ENTRY_POINTS = ["transformer_source", "transformer_target", "gpt", "encoder"]
INPUT_NAME = {"transformer_source": "source_ids", "transformer_target": "target_ids",
              "gpt": "ids", "encoder": "ids"}


@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_float_ids(models, kind):
    with pytest.raises(TypeError, match=rf"{INPUT_NAME[kind]} must be integer .*float32"):
        _call(models, kind, np.array([[1.0, 2.0]], "float32"))


@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_id_outside_vocabulary(models, kind):
    vocab = 12 if kind == "transformer_target" else 10
    with pytest.raises(ValueError, match=rf"{INPUT_NAME[kind]} contains id {vocab}\b.*"
                                         rf"\[0, {vocab}\)"):
        _call(models, kind, np.array([[1, vocab, 2]]))


@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_negative_id(models, kind):
    with pytest.raises(ValueError, match=rf"{INPUT_NAME[kind]} contains id -3\b"):
        _call(models, kind, np.array([[1, -3, 2]]))


@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_too_long(models, kind):
    with pytest.raises(ValueError, match=r"length 7.*max_length=6"):
        _call(models, kind, np.ones((1, 7), "int32"))


@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_wrong_rank(models, kind):
    with pytest.raises(ValueError, match=r"shape \(batch, length\).*\(3,\)"):
        _call(models, kind, np.array([1, 2, 3]))


def test_token_type_id_outside_type_vocabulary(models):
    with pytest.raises(ValueError, match=r"token_type_ids contains id 2\b"):
        models["encoder"]((np.array([[1, 2]]), np.array([[0, 2]])))


def test_encoder_inputs(models):
    plain = Encoder(10, **SMALL)
    with pytest.raises(ValueError, match=r"token_type_ids given, but the model has "
                                         r"type_vocab_size=0"):
        plain((np.array([[1, 2]]), np.array([[0, 1]])))
    with pytest.raises(ValueError, match=r"'token_ids'.*got \['ids'\]"):
        models["encoder"]({"ids": np.array([[1, 2]])})


def test_positional_encoding_too_long():
    layer = PositionalEncoding(4, 6)
    with pytest.raises(ValueError, match=r"length 5.*max_length=4"):
        layer(np.zeros((1, 5, 6), "float32"))
    with pytest.raises(ValueError, match=r"length 5.*max_length=4"):
        layer(np.zeros((1, 2, 6), "float32"), start_index=3)


def test_caches_longer_than_max_length(models):
    with pytest.raises(ValueError, match=r"7.*max_length=6"):
        models["gpt"].init_caches(1, 7)
    memory = models["transformer"].encode(np.array([[1, 2]]))
    with pytest.raises(ValueError, match=r"7.*max_length=6"):
        models["transformer"].init_caches(memory, 7)


# -- constructor arguments ------------------------------------------------------------------

CONSTRUCTORS = {
    "transformer": lambda **kw: Transformer(10, 10, **{**SMALL, **kw}),
    "gpt": lambda **kw: GPT(10, **{**SMALL, **kw}),
    "encoder": lambda **kw: Encoder(10, **{**SMALL, **kw}),
}


@pytest.mark.parametrize("model", CONSTRUCTORS)
def test_d_model_not_divisible_by_heads(model):
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=4"):
        CONSTRUCTORS[model](d_model=10, num_heads=4)
    CONSTRUCTORS[model](d_model=10, num_heads=4, key_dim=3)  # explicit head width is fine


def test_block_d_model_not_divisible_by_heads():
    for block in (EncoderBlock, DecoderBlock):
        with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=4"):
            block(10, 4, 16)


@pytest.mark.parametrize("model", CONSTRUCTORS)
@pytest.mark.parametrize("option, value", [("norm_position", "middle"), ("activation", "tanh"),
                                           ("positional", "rotary")])
def test_unknown_option_values(model, option, value):
    with pytest.raises(ValueError, match=rf"{option} must be one of .*'{value}'"):
        CONSTRUCTORS[model](**{option: value})


@pytest.mark.parametrize("model", CONSTRUCTORS)
@pytest.mark.parametrize("option", ["dropout", "attention_dropout", "activation_dropout"])
@pytest.mark.parametrize("value", [1.0, 1.5, -0.1, float("nan")])
def test_dropout_outside_probabilities(model, option, value):
    with pytest.raises(ValueError, match=rf"{option} is a probability in \[0, 1\), got"):
        CONSTRUCTORS[model](**{option: value})


@pytest.mark.parametrize("model", ["transformer", "gpt"])
def test_unknown_tie_embeddings(model):
    with pytest.raises(ValueError, match=r"tie_embeddings must be one of .*'both'"):
        CONSTRUCTORS[model](tie_embeddings="both")


def test_unknown_pooling():
    with pytest.raises(ValueError, match=r"pooling must be one of .*'max'"):
        Encoder(10, pooling="max", **SMALL)
    with pytest.raises(ValueError, match=r"num_classes needs a pooling"):
        Encoder(10, num_classes=3, **SMALL)


def test_unknown_layer_options():
    with pytest.raises(ValueError, match=r"activation must be one of .*'mish'"):
        FeedForward(8, 16, activation="mish")
    with pytest.raises(ValueError, match=r"activation must be one of .*'mish'"):
        EncoderBlock(8, 2, 16, activation="mish")
    with pytest.raises(ValueError, match=r"norm_position must be one of .*'sandwich'"):
        DecoderBlock(8, 2, 16, norm_position="sandwich")
    with pytest.raises(ValueError, match=r"positional must be one of .*'rotary'"):
        PositionalEncoding(8, 4, kind="rotary")
    with pytest.raises(ValueError, match=r"num_heads and key_dim must be positive"):
        MultiHeadAttention(0, 4)


def test_tie_all_needs_one_vocabulary():
    with pytest.raises(ValueError, match=r"tie_embeddings='all'.*source_vocab_size=10 != "
                                         r"target_vocab_size=12"):
        Transformer(10, 12, tie_embeddings="all", **SMALL)


def test_tie_all_takes_one_pretrained_matrix():
    matrix = np.zeros((10, 8), "float32")
    with pytest.raises(ValueError, match=r"source_embeddings only"):
        Transformer(10, 10, tie_embeddings="all", source_embeddings=matrix,
                    target_embeddings=matrix, **SMALL)


def test_pretrained_matrix_of_wrong_shape():
    with pytest.raises(ValueError, match=r"shape \(10, 4\).*\(10, 8\)"):
        Transformer(10, 10, source_embeddings=np.zeros((10, 4)), **SMALL)
    with pytest.raises(ValueError, match=r"shape \(9, 8\).*\(10, 8\)"):
        TokenEmbedding(10, 8, pretrained=np.zeros((9, 8)))


def test_bad_max_length():
    with pytest.raises(ValueError, match=r"max_length must be positive, got 0"):
        GPT(10, **{**SMALL, "max_length": 0})


def test_transformer_inputs_must_be_a_pair():
    model = Transformer(10, 10, **SMALL)
    with pytest.raises(ValueError, match=r"needs? keys 'source' and 'target'"):
        model({"src": np.array([[1]]), "target": np.array([[1]])})
    with pytest.raises(ValueError, match=r"expects inputs \(source_ids, target_input_ids\)"):
        model(np.array([[1, 2]]))
