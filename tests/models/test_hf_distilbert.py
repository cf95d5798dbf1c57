"""Importing Hugging Face DistilBERT checkpoints into ``Encoder`` (``converters/bert.py``).

Tiny random ``DistilBertModel`` / ``DistilBertForSequenceClassification`` folders written by
``transformers`` (safetensors): hidden states on a padded batch and mean pooling equal the
``transformers`` outputs on the real tokens for gelu and relu, learned and sinusoidal
positions; the sequence-classification head is not imported (``num_classes`` is refused);
unmappable configs and incomplete weights are named in the error.

Tolerances (``tests/support/tolerances.py``): ours and ``transformers`` are two float32 paths with
the same weights, each within the encoder's chain bound (``hf_checkpoints.hf_atol``:
the embeddings' sum and LayerNorm, the post-norm blocks with their activation, the
pooling). Mutations tried by hand against ``test_hidden_states_equal_transformers``: the
checkpoint's tensors imported in float16 (caught, 6.8x its bound), GELU's tanh
approximation (caught, 2x); a LayerNorm epsilon of 1e-5 for 1e-12 moves these outputs by
less than their bound (the test's ``layer_norm_epsilon == 1e-12`` catches it).
"""

import logging

import numpy as np
import pytest
import tolerances as tol
from hf_checkpoints import hf_atol, padded, to_numpy, write_folder

import transformerkit  # noqa: F401  (picks the backend before keras is imported)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformerkit.converters.hf_io import CheckpointError, read_weights  # noqa: E402
from transformerkit.models import Encoder  # noqa: E402

IDS = padded([[2, 7, 9, 11, 3, 15, 60], [2, 5, 3], [2, 40, 41, 42, 99, 3]])  # pad id 0
REAL = IDS != 0


def tiny_distilbert(folder, model_class="DistilBertModel", **overrides):
    """Save a small random DistilBERT to ``folder``; the eval-mode ``transformers`` model.

    All parameters are redrawn at a larger scale (LayerNorm gains around 1, offsets and
    biases non-zero) so that a swapped or untransposed tensor changes the output; a
    sinusoidal position table is kept as ``transformers`` made it.
    """
    config = transformers.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4,
                                           hidden_dim=64, max_position_embeddings=40,
                                           **overrides)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "position_embeddings" in name and config.sinusoidal_pos_embds:
                continue
            if "norm" in name.lower() and name.endswith("weight"):
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
            else:
                parameter.normal_(0.0, 0.2)
    model.save_pretrained(str(folder))
    assert (folder / "model.safetensors").is_file()
    return model


def hf_hidden(model, ids):
    """Last hidden states ``(batch, length, dim)`` of a ``transformers`` DistilBERT."""
    ids = torch.as_tensor(np.asarray(ids, "int64"))
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=(ids != 0).long())
    return out.last_hidden_state.numpy()


def assert_equal_on_real_tokens(encoder, ours, theirs):
    """Ours within two float32 paths' bound of ``transformers`` on the real tokens."""
    tol.assert_within(to_numpy(ours)[REAL], theirs[REAL], hf_atol(encoder, IDS, theirs[REAL]))


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_hidden_states_equal_transformers(tmp_path, activation):
    hf_model = tiny_distilbert(tmp_path, activation=activation)
    encoder = Encoder.from_pretrained(tmp_path, dropout=0.0)
    assert (encoder.num_layers, encoder.d_model, encoder.num_heads, encoder.d_ff) == \
        (2, 32, 4, 64)
    assert (encoder.activation, encoder.positional, encoder.norm_position) == \
        (activation, "learned", "post")
    assert encoder.type_embedding is None and encoder.final_norm is None
    assert encoder.layer_norm_epsilon == 1e-12
    assert_equal_on_real_tokens(encoder, encoder(IDS), hf_hidden(hf_model, IDS))
    with pytest.raises(ValueError, match="type_vocab_size=0"):
        encoder((IDS, np.zeros_like(IDS)))


def test_mean_pooling_equals_masked_mean_of_transformers(tmp_path):
    hidden = hf_hidden(tiny_distilbert(tmp_path), IDS)
    mask = REAL[..., None].astype("float64")
    expected = (hidden * mask).sum(1) / mask.sum(1)  # (batch, dim)
    encoder = Encoder.from_pretrained(tmp_path, pooling="mean")
    embeddings = to_numpy(encoder(IDS))
    assert embeddings.shape == (3, 32)
    # the mean in float32: the sum over the positions and the division
    tol.assert_within(embeddings, expected,
                      hf_atol(encoder, IDS, hidden[REAL], pooled=IDS.shape[1] + 1))


def reference_sinusoid(length, dim):
    """DistilBERT's table in float64: sin at even, cos at odd columns of pos/10000^(2k/dim)."""
    position = np.arange(length)[:, None]
    angles = position / np.power(10000.0, 2 * (np.arange(dim)[None, :] // 2) / dim)
    return np.where(np.arange(dim)[None, :] % 2 == 0, np.sin(angles), np.cos(angles))


def test_sinusoidal_positions_are_the_stored_fixed_table(tmp_path):
    hf_model = tiny_distilbert(tmp_path, sinusoidal_pos_embds=True)
    stored = read_weights(tmp_path)["embeddings.position_embeddings.weight"]
    # transformers computes the table in float64 and rounds it to float32: u |x|, |x| <= 1
    tol.assert_within(stored, reference_sinusoid(40, 32), tol.U32)
    encoder = Encoder.from_pretrained(tmp_path)
    assert encoder.positional == "sinusoidal"
    assert not encoder.positions.table.trainable
    # exact: the stored values, copied
    np.testing.assert_array_equal(to_numpy(encoder.positions.table), stored)
    assert_equal_on_real_tokens(encoder, encoder(IDS), hf_hidden(hf_model, IDS))


def test_sinusoidal_table_that_was_trained_is_used_as_stored(tmp_path, caplog):
    hf_model = tiny_distilbert(tmp_path / "fresh", sinusoidal_pos_embds=True)
    with torch.no_grad():
        hf_model.embeddings.position_embeddings.weight.add_(0.3)  # as if fine-tuned
    hf_model.save_pretrained(str(tmp_path / "trained"))
    with caplog.at_level(logging.WARNING, logger="transformerkit"):
        encoder = Encoder.from_pretrained(tmp_path / "trained")
    assert "differs from the sinusoidal formula" in caplog.text
    assert_equal_on_real_tokens(encoder, encoder(IDS), hf_hidden(hf_model, IDS))


def test_sequence_classification_folder_loads_its_encoder_only(tmp_path, caplog):
    hf_model = tiny_distilbert(tmp_path, "DistilBertForSequenceClassification", num_labels=3)
    with caplog.at_level(logging.INFO, logger="transformerkit"):
        encoder = Encoder.from_pretrained(tmp_path, pooling="mean")
    assert "classifier, pre_classifier has no Encoder equivalent and is not imported" \
        in caplog.text
    hidden = hf_hidden(hf_model.distilbert, IDS)
    mask = REAL[..., None].astype("float64")
    tol.assert_within(to_numpy(encoder(IDS)), (hidden * mask).sum(1) / mask.sum(1),
                      hf_atol(encoder, IDS, hidden[REAL], pooled=IDS.shape[1] + 1))
    assert_equal_on_real_tokens(encoder, encoder.encode(IDS), hidden)
    with pytest.raises(CheckpointError, match=r"num_classes=3 asks for a classifier, but this "
                       r"DistilBERT checkpoint's head \(classifier, pre_classifier\)"):
        Encoder.from_pretrained(tmp_path, pooling="cls", num_classes=3)


def test_new_classifier_on_a_plain_distilbert_starts_random(tmp_path, caplog):
    tiny_distilbert(tmp_path)
    with caplog.at_level(logging.INFO, logger="transformerkit"):
        model = Encoder.from_pretrained(tmp_path, pooling="cls", num_classes=2)
    assert "DistilBERT pooler" in caplog.text and "DistilBERT classifier" in caplog.text
    assert to_numpy(model(IDS)).shape == (3, 2)


DISTILBERT_CONFIG = {"model_type": "distilbert", "vocab_size": 100, "dim": 32, "n_layers": 1,
                     "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": 40,
                     "activation": "gelu", "sinusoidal_pos_embds": False, "pad_token_id": 0}


@pytest.mark.parametrize("change, message", [
    ({"activation": "gelu_new"}, "activation='gelu_new' cannot be mapped"),
    ({"activation": "silu"}, "activation='silu' cannot be mapped"),
    ({"pad_token_id": 1}, "pad_token_id=1 cannot be mapped"),
    ({"sinusoidal_pos_embds": "yes"}, "sinusoidal_pos_embds='yes'"),
    ({"dim": None}, "missing or non-integer dim"),
    ({"hidden_dim": 64.0}, "missing or non-integer hidden_dim"),
    ({"dim": 30}, "dim 30 is not divisible by n_heads 4"),
])
def test_unmappable_configs_are_refused(tmp_path, change, message):
    folder = write_folder(tmp_path / "model", config={**DISTILBERT_CONFIG, **change},
                          tensors={"x": np.zeros(1, "float32")})
    with pytest.raises(CheckpointError, match=message):
        Encoder.from_pretrained(folder)


def test_incomplete_weights_and_token_types_are_refused(tmp_path):
    tiny_distilbert(tmp_path / "tiny")
    tensors = read_weights(tmp_path / "tiny")
    del tensors["transformer.layer.1.ffn.lin2.bias"]
    folder = write_folder(tmp_path / "partial", config=None, tensors=tensors)
    (folder / "config.json").write_text((tmp_path / "tiny" / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"lack 1 tensor\(s\) a DistilBERT encoder needs: "
                                              r"transformer\.layer\.1\.ffn\.lin2\.bias"):
        Encoder.from_pretrained(folder)
    with pytest.raises(CheckpointError, match="DistilBERT has no token-type embeddings, but "
                                              "the Encoder was built with type_vocab_size=2"):
        Encoder.from_pretrained(tmp_path / "tiny", type_vocab_size=2)
