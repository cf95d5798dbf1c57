"""``transformerkit export RUN --format huggingface`` of translation runs
(``converters/marian.py``, written by ``export/huggingface.py``): a folder that
``MarianMTModel.from_pretrained`` and ``MarianTokenizer.from_pretrained`` load.

Checked, for (a) imported Marian runs (random ``MarianMTModel`` folders with tiny
SentencePiece vocabularies: one shared vocabulary with tied embeddings, separate ones with a
tied decoder, separate ones with an untied ``lm_head``) and (b) runs trained here with
``data.tokenizer: sentencepiece`` (a shared vocabulary, ``tie_embeddings: all``; separate
ones, ``none`` without ``final_logits_bias``, so the projection's own bias is exported;
separate ``sentencepiece-bpe`` ones, ``decoder``): the folder's tokenizer encodes as the
run's, its logits on a padded batch are the run's (``tolerances``: two float32 paths),
``generate`` (greedy and beam 4, ``length_penalty=0`` against our ``alpha=0``) gives the
run's translations token for token and text for text on two dozen held-out sentences; (a)
also gives back the source folder's tensors and vocabulary exactly, and, with its ``<s>``
row changed as a fine-tune may, exports that row as Marian's pad (its decoder start); the
export imports back to the run's ids and logits (separate vocabularies of different sizes
excepted: the import reads one ``pad_token_id`` for both sides and refuses such a folder in
one line). Options and tokenizers with no ``MarianMTModel`` equivalent are refused by name,
before anything is written.
"""

import json

import marian_runs
import numpy as np
import pytest
import tolerances as tol
from tiny_run import tiny_config

import transformerkit

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("sentencepiece")

import keras  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from transformerkit.cli import main  # noqa: E402
from transformerkit.converters.marian_ids import export_ids  # noqa: E402
from transformerkit.decoding import beam_translate, greedy_translate  # noqa: E402
from transformerkit.export.huggingface import export_translation  # noqa: E402
from transformerkit.models import Transformer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

IMPORTED = {
    "shared": dict(activation_function="swish", scale_embedding=True),
    "separate": dict(activation_function="gelu", scale_embedding=True,
                     share_encoder_decoder_embeddings=False),
    "separate-untied": dict(activation_function="relu", scale_embedding=True,
                            share_encoder_decoder_embeddings=False, tie_word_embeddings=False),
}
MARIAN_OPTIONS = {"positional": "sinusoidal_split", "layer_norm_epsilon": 1e-5}
TRAINED = {
    "shared": dict(activation="swish", tie_embeddings="all", final_logits_bias=True),
    "separate-untied": dict(activation="relu", tie_embeddings="none", scale_embeddings=False),
    "separate-decoder": dict(activation="gelu", tie_embeddings="decoder",
                             final_logits_bias=True),
}
TOKENIZERS = {"separate-decoder": "sentencepiece-bpe"}  # BPE: both sides of vocab_size ids
MAX_NEW = 10
FILES = ["config.json", "generation_config.json", "model.safetensors", "source.spm",
         "target.spm", "tokenizer_config.json", "vocab.json"]


def marian_folder(folder, variant):
    """A random ``MarianMTModel`` folder with SentencePiece vocabularies
    (:func:`marian_runs.marian_folder`), its ``</s>`` bias raised by :func:`_raise_eos`."""
    config = dict(IMPORTED[variant])
    separate = not config.pop("share_encoder_decoder_embeddings", True)
    marian_runs.marian_folder(folder, separate=separate, eos_bias=0.0, **config)
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(folder))
    with torch.no_grad():
        _raise_eos(hf, tokenizer(sample_sources(), padding=True, return_tensors="pt"))
    hf.save_pretrained(str(folder))
    return folder


def sample_sources():
    return marian_runs.multi30k_lines("de", 1000, 24)


def _raise_eos(hf, batch):
    """Raise the bias of ``</s>`` (Marian's 0) by the first of 0, 0.5, 1, ... at which the
    greedy and beam outputs of ``batch`` end at two or more lengths: the comparisons then
    cover outputs that end early and late alike."""
    for step in range(40):
        lengths = []
        for beams in (1, 4):
            out = hf.generate(**batch, max_new_tokens=MAX_NEW, num_beams=beams,
                              length_penalty=0.0, bad_words_ids=[[hf.config.pad_token_id]],
                              early_stopping=True)
            lengths.append({len(_cut(row, hf.config.pad_token_id)) for row in out.numpy()})
        if min(map(len, lengths)) >= 2:
            return
        hf.final_logits_bias[0, 0] += 0.5 * (step > 0)
    raise AssertionError("no bias of </s> gives outputs of varied lengths")


def import_run(folder, out):
    """``transformerkit import FOLDER --out OUT``; returns ``out``."""
    assert main(["import", str(folder), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module", params=sorted(IMPORTED))
def imported(request, tmp_path_factory):
    """``(source folder, run, exported folder)`` of an imported Marian model."""
    root = tmp_path_factory.mktemp(f"imported-{request.param}")
    folder = marian_folder(root / "marian", request.param)
    run_dir = import_run(folder, root / "run")
    assert main(["export", str(run_dir), "--format", "huggingface"]) == 0
    return folder, transformerkit.load(run_dir), run_dir / "huggingface"


@pytest.fixture(scope="module", params=sorted(TRAINED))
def trained(request, tmp_path_factory):
    """``(run, exported folder)`` of a tiny run trained here with SentencePiece."""
    from transformerkit.training.trainer import train

    root = tmp_path_factory.mktemp(f"trained-{request.param}")
    options = TRAINED[request.param]
    config = tiny_config(root, epochs=4, learning_rate=0.01)
    config = config.replace(
        model={**MARIAN_OPTIONS, **options},
        data={"tokenizer": TOKENIZERS.get(request.param, "sentencepiece"), "vocab_size": 40,
              "cache_dir": str(root / "cache"),
              "shared_vocab": options["tie_embeddings"] == "all"})
    train(config, root / "run")
    assert main(["export", str(root / "run"), "--format", "huggingface", "--out",
                 str(root / "hf")]) == 0
    return transformerkit.load(root / "run"), root / "hf"


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def load_export(folder):
    model = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    return model, transformers.MarianTokenizer.from_pretrained(str(folder))


def padded(rows, pad):
    batch = np.full((len(rows), max(map(len, rows))), pad, "int64")
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    return batch


def _cut(row, pad):
    """A row of ``generate``'s output without the decoder start, up to its first ``</s>``
    (Marian's 0) and without padding."""
    out = []
    for token in row[1:]:
        if token == 0:
            break
        if token != pad:
            out.append(int(token))
    return out


def assert_same_model(run, folder, sources, targets, varied=True):
    """The export's tokenizer encodes as the run's; its logits on a padded batch are the
    run's; ``generate`` (greedy, beam 4) gives the run's outputs, ids and texts."""
    hf, hf_tokenizer = load_export(folder)
    ids = export_ids(run.model)
    source_tok, target_tok = run.source_tokenizer, run.target_tokenizer
    pad = hf.config.pad_token_id
    assert hf.config.decoder_start_token_id == pad == run.model.target_vocab_size - 2
    batch = hf_tokenizer(sources, padding=True, return_tensors="np")
    ours_source = [source_tok.encode(t, add_eos=True) for t in sources]
    for row, mask, ours in zip(batch["input_ids"], batch["attention_mask"], ours_source,
                               strict=True):
        assert row[mask == 1].tolist() == ids.to_marian(ours, "source").tolist()
    labels = hf_tokenizer(text_target=targets, padding=True, return_tensors="np")
    ours_target = [target_tok.encode(t, add_bos=True) for t in targets]  # <s> + pieces
    for row, mask, ours in zip(labels["input_ids"], labels["attention_mask"], ours_target,
                               strict=True):
        assert row[mask == 1].tolist()[:-1] == ids.to_marian(ours[1:]).tolist()  # no </s>

    # logits, padded on both sides
    decoder_input = padded([ids.to_marian(t).tolist() for t in ours_target], pad)
    with torch.no_grad():
        theirs = hf(input_ids=torch.as_tensor(batch["input_ids"]),
                    attention_mask=torch.as_tensor(batch["attention_mask"]),
                    decoder_input_ids=torch.as_tensor(decoder_input)).logits.numpy()
    ours_logits = to_numpy(run.model((padded(ours_source, 0).astype("int32"),
                                      padded(ours_target, 0).astype("int32"))))
    ours_logits = ours_logits[..., ids.rows_for_marian("target")]
    real = padded(ours_target, 0) != 0
    roundings = tol.model_roundings(run.model, batch["input_ids"].shape[1],
                                    decoder_input.shape[1])
    others = np.arange(theirs.shape[-1]) != pad  # the pad's -100 has its own bound
    for columns in (others, ~others):
        expected = theirs[real][:, columns]
        tol.assert_within(ours_logits[real][:, columns], expected,
                          tol.chain_atol(roundings, expected, paths=2), "logits")

    # greedy and beam search, token for token and text for text
    source_ids = padded(ours_source, 0).astype("int32")
    for beams in (1, 4):
        search = dict(num_beams=beams, length_penalty=0.0) if beams > 1 else dict(num_beams=1)
        with torch.no_grad():
            out = hf.generate(input_ids=torch.as_tensor(batch["input_ids"]),
                              attention_mask=torch.as_tensor(batch["attention_mask"]),
                              max_new_tokens=MAX_NEW, do_sample=False, **search).numpy()
        expected = [_cut(row, pad) for row in out]
        if beams == 1:
            found = greedy_translate(run.model, source_ids, max_new_tokens=MAX_NEW)
        else:
            found = [h[0].ids for h in beam_translate(run.model, source_ids,
                                                      max_new_tokens=MAX_NEW, beam_size=4,
                                                      alpha=0.0, stopping="early")]
        ours = [ids.to_marian(list(row)).tolist() for row in found]
        assert ours == expected, beams
        assert len({len(row) for row in expected}) > varied  # some end early, at </s>
        # the export's generation_config.json: early_stopping true, no forced </s> (an
        # imported run's own search, from its source folder, may say otherwise)
        texts = run.translate(sources, beam_size=beams, alpha=0.0, max_new_tokens=MAX_NEW,
                              max_len_a=None, max_len_b=None, stopping="early",
                              forced_eos=False)
        # MarianTokenizer looks special ids up in the source table: with separate
        # vocabularies of different sizes it keeps the target's <pad>, so leave it out
        decoded = hf_tokenizer.batch_decode([[t for t in row if t != pad] for row in out],
                                            skip_special_tokens=True)
        with_unk = [1 in row for row in expected]  # transformers leaves <unk> out of texts
        assert [t for t, u in zip(texts, with_unk, strict=True) if not u] == \
            [t for t, u in zip(decoded, with_unk, strict=True) if not u]


def assert_imports_back(run, folder, out, sources):
    """The export, imported again, has the run's ids and gives its logits."""
    again = transformerkit.load(import_run(folder, out))
    for side in ("source_tokenizer", "target_tokenizer"):
        before, after = getattr(run, side), getattr(again, side)
        assert after.vocab_size == before.vocab_size
        for text in sources:
            assert after.encode(text, add_eos=True) == before.encode(text, add_eos=True)
    source = padded([run.source_tokenizer.encode(t, add_eos=True) for t in sources], 0)
    target = padded([run.target_tokenizer.encode(t, add_bos=True) for t in sources], 0)
    columns = np.arange(2, run.model.target_vocab_size)  # not <pad>, <s>: never picked
    inputs = (source.astype("int32"), target.astype("int32"))
    real = target != 0  # the <pad> row, an input at padded positions only, is not exported
    np.testing.assert_array_equal(to_numpy(again.model(inputs))[real][:, columns],
                                  to_numpy(run.model(inputs))[real][:, columns])


def test_imported_run_exports_to_the_source_folder(imported, tmp_path):
    folder, run, export = imported
    separate = (folder / "target_vocab.json").is_file()
    assert sorted(p.name for p in export.iterdir()) == sorted(
        FILES + ["target_vocab.json"] * separate)
    theirs, ours = (load_file(str(f / "model.safetensors")) for f in (folder, export))
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)
    for name in ["vocab.json", "target_vocab.json"][: 1 + separate]:
        assert json.loads((export / name).read_text()) == json.loads((folder / name).read_text())
    for name in ("source.spm", "target.spm"):
        assert (export / name).read_bytes() == (folder / name).read_bytes()
    config = json.loads((export / "config.json").read_text())
    original = json.loads((folder / "config.json").read_text())
    for key in ("vocab_size", "decoder_vocab_size", "pad_token_id", "decoder_start_token_id",
                "eos_token_id", "activation_function", "scale_embedding",
                "share_encoder_decoder_embeddings", "tie_word_embeddings", "d_model"):
        assert config[key] == original[key], key


def test_imported_run_logits_and_translations(imported):
    _, run, export = imported
    sources, targets = sample_sources(), marian_runs.multi30k_lines("en", 1000, 24)
    assert_same_model(run, export, sources, targets)


def test_a_fine_tuned_start_row_is_exported_not_the_pad_row(imported, tmp_path):
    """Fine-tuning may make our ``<pad>`` (0) and ``<s>`` (1) rows differ (they are copies
    of Marian's pad row after the import): Marian's pad row, its decoder start, takes
    ``<s>``'s."""
    _, run, _ = imported
    run = transformerkit.load(run.run_dir)  # a copy to change
    embedding = run.model.target_embedding.embeddings
    values = to_numpy(embedding).copy()
    values[0] = 5.0  # an input at padded positions only
    values[1] = np.random.default_rng(4).normal(0.0, 0.3, values.shape[1])
    embedding.assign(values)
    export_translation(run.model, run.source_tokenizer, run.target_tokenizer, tmp_path / "hf")
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    name = "model.shared.weight" if run.model.tie_embeddings == "all" else \
        "model.decoder.embed_tokens.weight"
    pad = json.loads((tmp_path / "hf" / "config.json").read_text())["pad_token_id"]
    np.testing.assert_array_equal(tensors[name][pad], values[1])
    assert_same_model(run, tmp_path / "hf", sample_sources(),
                      marian_runs.multi30k_lines("en", 1000, 24), varied=False)


def test_trained_run_logits_and_translations(trained):
    run, export = trained
    from tiny_run import ENGLISH, GERMAN

    rng = np.random.default_rng(3)
    picks = [rng.integers(0, 10, rng.integers(1, 7)) for _ in range(24)]
    sources = [" ".join(GERMAN[i] for i in p) for p in picks]
    targets = [" ".join(ENGLISH[i] for i in p) for p in picks]
    assert_same_model(run, export, sources + ["zwei ☃ drei"], targets + ["two ☃ three"])
    separate = run.source_tokenizer is not run.target_tokenizer
    assert (export / "target_vocab.json").is_file() == separate
    config = json.loads((export / "generation_config.json").read_text())
    assert config["bad_words_ids"] == [[config["decoder_start_token_id"]]]


def test_trained_run_imports_back(trained, tmp_path, capsys):
    run, export = trained
    if run.source_tokenizer.vocab_size != run.target_tokenizer.vocab_size:
        # the import reads one pad_token_id for both sides: such a folder is refused
        assert main(["import", str(export), "--out", str(tmp_path / "again")]) != 0
        assert "but the source vocabulary has '<pad>' at id" in capsys.readouterr().err
        return
    assert_imports_back(run, export, tmp_path / "again", ["ein zwei drei", "vier ☃ fuenf"])


def test_existing_folder_needs_force(trained, tmp_path):
    run, export = trained
    with pytest.raises(FileExistsError, match="--force"):
        export_translation(run.model, run.source_tokenizer, run.target_tokenizer, export)
    out = export_translation(run.model, run.source_tokenizer, run.target_tokenizer,
                             tmp_path / "hf")
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == sorted(
        FILES + ["target_vocab.json"] * (run.source_tokenizer is not run.target_tokenizer))
    assert out == str(tmp_path / "hf")
    assert not [p for p in tmp_path.iterdir() if p.name != "hf"]  # no temporary folder left


def _spm_tokenizer():
    from transformerkit.data.sentencepiece_tokenizer import SentencePieceTokenizer

    return SentencePieceTokenizer.train(["ein zwei drei vier", "fuenf sechs sieben"] * 20,
                                        vocab_size=30)


@pytest.mark.parametrize("options,message", [
    ({"positional": "learned"}, "model.positional='learned' has no MarianMTModel"),
    ({"positional": "sinusoidal"}, "model.positional='sinusoidal' has no MarianMTModel"),
    ({"norm_position": "pre"}, "model.norm_position='pre' has no MarianMTModel"),
    ({"layer_norm_epsilon": 1e-6}, "model.layer_norm_epsilon=1e-06 has no MarianMTModel"),
    ({"max_timescale": 1000.0}, "model.max_timescale=1000.0 has no MarianMTModel"),
    ({"activation": "gelu_tanh"}, "model.activation='gelu_tanh' has no MarianMTModel"),
    ({"key_dim": 3}, "model.key_dim=3 / value_dim=3: MarianMTModel's heads are"),
])
def test_options_marian_lacks_are_refused(tmp_path, options, message):
    tokenizer = _spm_tokenizer()
    model = Transformer(tokenizer.vocab_size, tokenizer.vocab_size, num_layers=1, d_model=8,
                        num_heads=2, d_ff=16, max_length=16,
                        **{**MARIAN_OPTIONS, **options})
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        export_translation(model, tokenizer, tokenizer, tmp_path / "hf")
    assert not list(tmp_path.iterdir())


def test_other_tokenizers_and_runs_are_refused(tmp_path):
    from transformerkit.data.tokenizers import SubwordTokenizer

    tokenizer = SubwordTokenizer.train(["ein zwei drei vier"] * 5, vocab_size=30)
    model = Transformer(tokenizer.vocab_size, tokenizer.vocab_size, num_layers=1, d_model=8,
                        num_heads=2, d_ff=16, max_length=16, **MARIAN_OPTIONS)
    with pytest.raises(ValueError, match="data.tokenizer='bpe' .source. has no "
                                         "MarianTokenizer equivalent"):
        export_translation(model, tokenizer, tokenizer, tmp_path / "hf")
    spm = _spm_tokenizer()
    with pytest.raises(ValueError, match=f"the source tokenizer has {spm.vocab_size} ids but "
                                         f"the model's source vocabulary has "
                                         f"{tokenizer.vocab_size}"):
        export_translation(model, spm, spm, tmp_path / "hf")
    assert not list(tmp_path.iterdir())
