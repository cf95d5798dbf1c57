"""Importing Hugging Face Marian (OPUS-MT) checkpoints into ``Transformer``
(``converters/marian.py``), against ``transformers``' ``MarianMTModel`` loaded from
the same folder: small random configs (2+2 layers, d_model 32, 4 heads, d_ff 64) written
with ``save_pretrained``; variants: swish / gelu / relu, scale_embedding on and off, shared
and separate vocabularies, a random ``final_logits_bias`` (EOS raised so outputs end at
different lengths). The file runs on the backend of ``KERAS_BACKEND`` (PyTorch by
default; ``KERAS_BACKEND=jax`` and ``tensorflow`` run it on the others).

Ids: ours are Marian's reordered (:class:`MarianIds`); every comparison maps them.
Tolerances (``tests/support/tolerances.py``): two float32 paths, each within the model's chain
bound. Decoding: greedy and beam 4 equal ``generate`` token for token with
``length_penalty=0`` (ours ``alpha=0``: both rank by the plain log-probability; the GNMT
penalty ``((5+n)/6)^alpha`` and ``n^length_penalty`` differ by definition), ``early_stopping
=True`` (ours ``stopping="early"``), ``forced_eos_token_id=None`` (ours never forces EOS),
and no ``bad_words_ids``: ours never picks ``<pad>`` or ``<s>`` and masks them before the
softmax (the other tokens' probabilities renormalised), ``bad_words_ids`` masks after the
log-softmax (their mass is lost, so beams of different pad mass rank differently: one row in
24 differed); the test checkpoints give the pad a logit bias of -100, so its probability is
zero in float32 on both sides and the two searches are the same search.
"""

import json

import numpy as np
import pytest
import tolerances as tol

import transformerkit  # noqa: F401  (picks the backend before keras is imported)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import keras  # noqa: E402

from transformerkit.converters.hf_io import CheckpointError  # noqa: E402
from transformerkit.converters.marian_ids import MarianIds  # noqa: E402
from transformerkit.decoding import beam_translate, greedy_translate  # noqa: E402
from transformerkit.layers.embeddings import sinusoidal_table  # noqa: E402
from transformerkit.models import Transformer  # noqa: E402

SIZES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
             max_position_embeddings=64, eos_token_id=0, init_std=0.3)
VARIANTS = {
    "swish-scaled-shared": dict(vocab_size=100, pad_token_id=99, decoder_start_token_id=99,
                                activation_function="swish", scale_embedding=True),
    "gelu-unscaled-separate": dict(vocab_size=90, decoder_vocab_size=70, pad_token_id=69,
                                   decoder_start_token_id=69, activation_function="gelu",
                                   scale_embedding=False,
                                   share_encoder_decoder_embeddings=False),
    "relu-scaled-untied": dict(vocab_size=80, decoder_vocab_size=60, pad_token_id=59,
                               decoder_start_token_id=59, activation_function="relu",
                               scale_embedding=True, share_encoder_decoder_embeddings=False,
                               tie_word_embeddings=False),
    # a decoder that starts from another token than the pad (here: </s>)
    "swish-start-eos": dict(vocab_size=100, pad_token_id=99, decoder_start_token_id=0,
                            activation_function="swish", scale_embedding=True),
}
MAX_NEW = 10


def make_folder(path, seed=0, **config):
    torch.manual_seed(seed)
    hf = transformers.MarianMTModel(transformers.MarianConfig(**{**SIZES, **config})).eval()
    with torch.no_grad():
        hf.final_logits_bias.normal_(0.0, 0.5)
        hf.final_logits_bias[0, config.get("eos_token_id", 0)] += 3.0
        hf.final_logits_bias[0, config["pad_token_id"]] = -100.0  # see the module docstring
    hf.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def imported(request, tmp_path_factory):
    """``(config, folder, hf model loaded from it, our model, MarianIds)``."""
    config = {**SIZES, **VARIANTS[request.param]}
    folder = make_folder(tmp_path_factory.mktemp(request.param), **config)
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    return config, folder, hf, Transformer.from_pretrained(folder), MarianIds.from_folder(folder)


def sources(config, rows=24, width=9, seed=1):
    """Random Marian source ids ending in EOS, padded with the pad id (varied lengths)."""
    rng = np.random.default_rng(seed)
    pad, vocab = config["pad_token_id"], config["vocab_size"]
    batch = np.full((rows, width), pad, dtype="int64")
    for row, length in enumerate(rng.integers(2, width + 1, rows)):
        batch[row, : length - 1] = rng.integers(2, min(vocab, pad), length - 1)
        batch[row, length - 1] = 0
    return batch


def test_logits_equal_transformers_with_padding(imported):
    config, _, hf, model, ids = imported
    pad = config["pad_token_id"]
    source = sources(config, rows=4)
    rng = np.random.default_rng(2)
    target = rng.integers(1, min(pad, config.get("decoder_vocab_size", pad)), (4, 6))
    start = config["decoder_start_token_id"]
    target[:, 0] = start  # Marian starts the decoder from its pad id (or another start id)
    with torch.no_grad():
        expected = hf(input_ids=torch.as_tensor(source),
                      attention_mask=torch.as_tensor(source != pad).long(),
                      decoder_input_ids=torch.as_tensor(target)).logits.numpy()
    ours_target = ids.to_ours(target, "target")
    ours_target[:, 0] = 1  # <s>: the copy of Marian's decoder-start row
    logits = keras.ops.convert_to_numpy(model((ids.to_ours(source, "source").astype("int32"),
                                               ours_target.astype("int32"))))
    assert logits.shape[-1] == expected.shape[-1] + 1
    columns = ids.to_ours(np.arange(expected.shape[-1]), "target")
    roundings = tol.model_roundings(model, source.shape[1], target.shape[1])
    # the bound scales with the logits' size: the pad's -100 (its own bound) would make it
    # forty times looser for the others
    others = np.arange(expected.shape[-1]) != pad
    bound = tol.chain_atol(roundings, expected[..., others], paths=2)
    tol.assert_within(logits[..., columns][..., others], expected[..., others], bound, "logits")
    tol.assert_within(logits[..., columns[pad]], expected[..., pad],
                      tol.chain_atol(roundings, expected[..., pad], paths=2), "pad logits")
    start_bound = tol.chain_atol(roundings, expected[..., start], paths=2)
    tol.assert_within(logits[..., 1], expected[..., start], start_bound,
                      "<s>: Marian's start row")


def _cut(row, config):
    out = []
    for token in row[1:]:  # after the decoder start
        if token == config["eos_token_id"]:
            break
        if token != config["pad_token_id"]:
            out.append(int(token))
    return out


def _generate(hf, source, config, beams):
    pad = config["pad_token_id"]
    beam_options = dict(num_beams=beams, length_penalty=0.0, early_stopping=True) \
        if beams > 1 else {}
    with torch.no_grad():
        out = hf.generate(input_ids=torch.as_tensor(source),
                          attention_mask=torch.as_tensor(source != pad).long(),
                          max_new_tokens=MAX_NEW, forced_eos_token_id=None, do_sample=False,
                          **beam_options)
    return [_cut(row, config) for row in out.numpy()]


def test_greedy_and_beam_equal_generate(imported):
    config, _, hf, model, ids = imported
    source = sources(config)
    ours_source = ids.to_ours(source, "source").astype("int32")
    greedy = [ids.to_marian(row).tolist() for row in
              greedy_translate(model, ours_source, max_new_tokens=MAX_NEW)]
    assert greedy == _generate(hf, source, config, 1)
    lengths = {len(row) for row in greedy}
    assert len(lengths) > 1, lengths  # outputs end at different lengths, some at EOS
    beam = [ids.to_marian(hyps[0].ids).tolist() for hyps in
            beam_translate(model, ours_source, max_new_tokens=MAX_NEW, beam_size=4,
                           alpha=0.0, stopping="early")]
    assert beam == _generate(hf, source, config, 4)


def test_marian_position_table_is_transformers():
    """``sinusoidal_split`` against transformers' own table and a float64 formula."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for width in (32, 7):
        layer = MarianSinusoidalPositionalEmbedding(20, width)
        expected = layer.create_weight().numpy()
        ours = sinusoidal_table(20, width, "sinusoidal_split")
        np.testing.assert_allclose(ours, expected, atol=1e-6)
        pos, half = np.arange(20.0)[:, None], (width + 1) // 2
        angles = pos / 10000.0 ** (2 * np.arange(half) / width)
        reference = np.concatenate([np.sin(angles), np.cos(angles[:, : width // 2])], axis=1)
        np.testing.assert_allclose(ours, reference, atol=1e-6)


def test_ids_reorder_to_reserved_layout(imported):
    config, _, _, model, ids = imported
    pad = config["pad_token_id"]
    assert ids.target_rows[:4].tolist() == [pad, config["decoder_start_token_id"], 0, 1]
    assert model.source_vocab_size == config["vocab_size"] + 1
    marian = np.arange(config["vocab_size"])
    assert ids.to_marian(ids.to_ours(marian, "source"), "source").tolist() == marian.tolist()


def test_logits_bias_is_frozen_and_saved(imported, tmp_path):
    _, _, hf, model, ids = imported
    assert not any("final_logits_bias" in w.path for w in model.trainable_weights)
    stored = hf.final_logits_bias.numpy().reshape(-1)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.logits_bias.bias),
                                  stored[ids.target_rows])
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again.logits_bias.bias),
                                  stored[ids.target_rows])


@pytest.mark.parametrize("key, value", [
    ("activation_function", "gelu_new"), ("decoder_attention_heads", 2),
    ("decoder_ffn_dim", 32), ("encoder_layerdrop", 0.1), ("normalize_before", True),
    ("normalize_embedding", True), ("model_type", "bart")])
def test_unmappable_config_names_the_key(tmp_path, key, value):
    folder = make_folder(tmp_path / "f", **VARIANTS["swish-scaled-shared"])
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=key):
        Transformer.from_pretrained(folder)


def test_shared_embeddings_with_untied_head_refused(tmp_path):
    folder = make_folder(tmp_path / "f", **VARIANTS["swish-scaled-shared"])
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="tie_word_embeddings"):
        Transformer.from_pretrained(folder)


# -- CTranslate2: our export of the imported model against CTranslate2's own converter -----

def marian_folder_with_vocabulary(folder, data_dir):
    """A Marian folder with a real vocabulary, as ``MarianTokenizer`` (and so CTranslate2's
    ``TransformersConverter``) needs it: a tiny SentencePiece model trained on 300 Multi30k
    lines (``source.spm`` = ``target.spm``), ``vocab.json`` in Marian's layout (``</s>`` 0,
    ``<unk>`` 1, the pieces, ``<pad>`` last) and a random model of that vocabulary."""
    spm = pytest.importorskip("sentencepiece")
    lines = (data_dir / "multi30k" / "train.de").read_text(encoding="utf-8").splitlines()[:300]
    folder.mkdir(parents=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines),
                                   model_prefix=str(folder / "spm"), vocab_size=120,
                                   model_type="unigram", bos_id=-1, eos_id=-1, unk_id=0,
                                   pad_id=-1, minloglevel=2)
    (folder / "spm.model").rename(folder / "source.spm")
    (folder / "target.spm").write_bytes((folder / "source.spm").read_bytes())
    pieces = [line.split("\t")[0] for line in
              (folder / "spm.vocab").read_text(encoding="utf-8").splitlines()]
    tokens = ["</s>", "<unk>", *[p for p in pieces if p != "<unk>"], "<pad>"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    pad = len(tokens) - 1
    make_folder(folder, **{**SIZES, "vocab_size": len(tokens), "pad_token_id": pad,
                           "decoder_start_token_id": pad, "activation_function": "swish",
                           "scale_embedding": True})
    return folder, tokens, lines


def test_ctranslate2_export_equals_ctranslate2s_own_converter(tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from paths import SHARED_DATA

    from transformerkit.export.ctranslate2 import transformer_spec

    folder, tokens, lines = marian_folder_with_vocabulary(tmp_path / "marian", SHARED_DATA)
    theirs = ctranslate2.converters.TransformersConverter(str(folder)).convert(
        str(tmp_path / "theirs"))
    model = Transformer.from_pretrained(folder)
    ids = MarianIds.from_folder(folder)
    ours_tokens = [tokens[i] for i in ids.target_rows]
    ours_tokens[1] = "<s>"  # the decoder start: its own spelling (one id per string)
    spec = transformer_spec(model, ours_tokens, ours_tokens,
                            {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"})
    spec.validate()
    spec.optimize()
    (tmp_path / "ours").mkdir()
    spec.save(str(tmp_path / "ours"))
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(folder))
    sentences = [tokenizer.convert_ids_to_tokens(tokenizer(line)["input_ids"])
                 for line in lines[:24]]  # pieces + </s>
    for beam in (1, 4):
        options = dict(max_decoding_length=MAX_NEW, beam_size=beam, length_penalty=0.0)
        expected = ctranslate2.Translator(theirs).translate_batch(sentences, **options)
        ours = ctranslate2.Translator(str(tmp_path / "ours")).translate_batch(
            [s[:-1] for s in sentences], **options)  # our export appends </s> itself
        assert [r.hypotheses[0] for r in ours] == [r.hypotheses[0] for r in expected]
        assert len({len(r.hypotheses[0]) for r in expected}) > 1


def test_pytorch_bin_folder_imports_the_same(tmp_path):
    config = {**SIZES, **VARIANTS["swish-scaled-shared"]}
    safetensors_folder = make_folder(tmp_path / "st", **config)
    hf = transformers.MarianMTModel.from_pretrained(str(safetensors_folder))
    (tmp_path / "bin").mkdir()  # the older format, as many OPUS-MT folders on the hub hold
    (tmp_path / "bin" / "config.json").write_bytes((safetensors_folder / "config.json")
                                                   .read_bytes())
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    a, b = (Transformer.from_pretrained(folder) for folder in (safetensors_folder,
                                                                tmp_path / "bin"))
    for x, y in zip(a.weights, b.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(x),
                                      keras.ops.convert_to_numpy(y))


def test_missing_or_misshapen_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = make_folder(tmp_path / "f", **{**SIZES, **VARIANTS["swish-scaled-shared"]})
    tensors = load_file(str(folder / "model.safetensors"))
    name = "model.decoder.layers.1.fc2.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="decoder.layers.1.fc2.weight"):
        Transformer.from_pretrained(folder)
    save_file({**tensors, name: tensors[name][:, :3].copy()}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="decoder.layers.1.fc2 has shape"):
        Transformer.from_pretrained(folder)


def test_a_stored_position_table_is_used_as_stored(tmp_path, caplog):
    """Older checkpoints store ``embed_positions``; a table that is not the sinusoid is used
    as stored (frozen), with a warning."""
    from safetensors.numpy import load_file, save_file

    folder = make_folder(tmp_path / "f", **{**SIZES, **VARIANTS["swish-scaled-shared"]})
    tensors = load_file(str(folder / "model.safetensors"))
    table = sinusoidal_table(SIZES["max_position_embeddings"], SIZES["d_model"],
                             "sinusoidal_split")
    tensors["model.encoder.embed_positions.weight"] = table + 0.5
    save_file(tensors, str(folder / "model.safetensors"))
    with caplog.at_level("WARNING", logger="transformerkit"):
        model = Transformer.from_pretrained(folder)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.source_positions.table),
                                  table + 0.5)
    assert not model.source_positions.table.trainable
    assert "differs from Marian's sinusoid" in caplog.text


def test_overriding_the_architecture_is_refused(tmp_path):
    folder = make_folder(tmp_path / "f", **{**SIZES, **VARIANTS["swish-scaled-shared"]})
    with pytest.raises(CheckpointError, match="final_logits_bias=False"):
        Transformer.from_pretrained(folder, final_logits_bias=False)
    assert Transformer.from_pretrained(folder, dropout=0.0).dropout == 0.0
