"""SentencePiece: ``data.tokenizer: sentencepiece`` (a ``.model`` file the `sentencepiece`
package reads and encodes alike) and the Marian vocabulary (``source.spm`` + ``target.spm``
+ ``vocab.json``), checked against ``transformers``' ``MarianTokenizer`` on tiny
SentencePiece models trained here on Multi30k lines."""

import io
import json

import numpy as np
import pytest
import sentencepiece
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import SHARED_DATA
from tiny_run import GERMAN as NUMBERS_DE
from tiny_run import tiny_config
from vectors_files import write_vectors

import transformerkit
from transformerkit.config import resolve
from transformerkit.data.marian_vocab import MarianTokenizer, load_marian_tokenizers
from transformerkit.data.sentencepiece_tokenizer import SentencePieceTokenizer
from transformerkit.data.tokenizers import load_hf_tokenizer, load_tokenizer
from transformerkit.run_directory import RunDirectory
from transformerkit.special_tokens import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID
from transformerkit.training.data_setup import prepare_data, reused_tokenizer_files
from transformerkit.training.trainer import train

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

# Held out from the training lines: accents, digits, characters no training line has (a
# snowman, an emoji, CJK), punctuation; and the empty and blank lines.
GERMAN = ["Ein älterer Mann überquert 2 Straßen.", "Zwei Kinder spielen 1987 im Sand!",
          "Ein Hund ☃ rennt über die Wiese 🐕.", "一只狗在草地上奔跑。", "", "   ",
          ">>fra<< Ein Mädchen liest.", "Größe: 3,5 m (ca. 12 Fuß)."]
ENGLISH = ["An older man crosses 2 streets.", "Two children play in the sand in 1987!",
           "A dog ☃ runs across the meadow 🐕.", "Déjà vu: 10 cafés, naïve façade.", "",
           "The unknown ✓ mark."]


def _lines(lang, count=400):
    path = SHARED_DATA / "multi30k" / f"train.{lang}"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path} (set TRANSFORMERKIT_DATA)")
    return path.read_text(encoding="utf-8").splitlines()[:count]


def _spm(lines, vocab_size=300, **options):
    """A SentencePiece model trained by `sentencepiece` itself (its default ids, as the
    OPUS-MT models' ``.spm`` files) -> its bytes."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                             vocab_size=vocab_size, minloglevel=2, **options)
    return model.getvalue()


# ----------------------------------------------------------------------------- from scratch
# Characters of the held-out sentences that 400 Multi30k lines may lack (digits, ß, ...), so
# that only the deliberately unknown ones (☃, 🐕, ✓, CJK) are.
ALPHABET = ["Größe: 0123456789 ß äöü ÄÖÜ éàïçÉ (ca.) ; ! ? - abcdefghijklmnopqrstuvwxyz "
            "ABCDEFGHIJKLMNOPQRSTUVWXYZ"] * 20


@pytest.fixture(scope="module", params=["sentencepiece", "sentencepiece-bpe"])
def trained(request):
    return SentencePieceTokenizer.train(_lines("de") + _lines("en") + ALPHABET + ["", "  "],
                                        kind=request.param, vocab_size=400)


def test_reserved_ids_pieces_and_training_stats(trained):
    assert [trained.id_to_token(i) for i in range(4)] == list(SPECIAL_TOKENS)
    assert (trained.pad_id, trained.bos_id, trained.eos_id, trained.unk_id) == \
        (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    assert trained.vocab_size == 400
    assert trained.training_stats == {"lines": 820, "skipped_empty": 2}


@pytest.mark.parametrize("text", ["Ein älterer Mann überquert 2 Straßen.",
                                  "Two children play in the sand in 1987!",
                                  "Größe: 3,5 m (ca. 12 Fuß).", ""])
def test_round_trip_of_accents_digits_and_the_empty_line(trained, text):
    ids = trained.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert UNK_ID not in ids
    assert trained.decode(ids) == text


def test_unknown_characters_become_unk_and_show_as_sentencepiece_does(trained):
    ids = trained.encode("Ein Hund ☃ rennt")
    assert ids.count(UNK_ID) == 1
    assert trained.decode(ids) == "Ein Hund  ⁇  rennt"  # SentencePiece's unk surface " ⁇ "


def test_special_spellings_in_text_are_plain_text_and_decode_stops_at_eos(trained):
    ids = trained.encode("<s> </s> <pad>")
    assert not {PAD_ID, BOS_ID, EOS_ID} & set(ids)
    hello = trained.encode("Ein Hund")
    assert trained.decode([BOS_ID, *hello, EOS_ID, *trained.encode("rennt"), PAD_ID]) == \
        "Ein Hund"
    assert trained.decode([PAD_ID, BOS_ID]) == ""
    with pytest.raises(ValueError, match="outside the vocabulary"):
        trained.decode([trained.vocab_size])


def test_batch_encodings_equal_one_by_one(trained):
    texts = [t for t in GERMAN if t.strip()]
    assert trained.encode_batch(texts, add_eos=True) == [trained.encode(t, add_eos=True)
                                                         for t in texts]
    ids, lengths = trained.encode_batch_flat(texts, add_bos=True, add_eos=True)
    assert ids.dtype == np.int32 and lengths.tolist() == [len(trained.encode(t)) + 2
                                                          for t in texts]
    assert trained.decode_batch(trained.encode_batch(texts)) == [trained.decode(
        trained.encode(t)) for t in texts]
    assert trained.tokenize("Ein Hund")[0].startswith("▁")


def test_the_saved_model_file_is_sentencepieces_own(trained, tmp_path):
    """Any SentencePiece user reads the file and gets our ids; loading it back gives the
    same tokenizer (kind too)."""
    path = tmp_path / "tokenizer.model"
    trained.save(path)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    texts = GERMAN + ENGLISH
    assert processor.encode(texts) == trained.encode_batch(texts)
    assert [processor.id_to_piece(i) for i in range(4)] == list(SPECIAL_TOKENS)
    assert (processor.pad_id(), processor.bos_id(), processor.eos_id(), processor.unk_id()) \
        == (0, 1, 2, 3)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, SentencePieceTokenizer)
    assert loaded.kind == trained.kind and loaded.vocab_size == trained.vocab_size
    assert loaded.encode_batch(texts) == trained.encode_batch(texts)
    assert not list(tmp_path.glob(".*"))  # atomic write: no temporary file left


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyzäöüßABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!? ",
               max_size=60))
def test_round_trip_is_the_text_with_spaces_normalized(text):
    """Over the characters trained on, any text round-trips to itself with leading,
    trailing and repeated spaces dropped (SentencePiece's nmt_nfkc)."""
    tok = _PROPERTY_TOKENIZER.get("tok") or _PROPERTY_TOKENIZER.setdefault(
        "tok", SentencePieceTokenizer.train(_lines("de") + ALPHABET, vocab_size=300))
    assert tok.decode(tok.encode(text, add_bos=True, add_eos=True)) == " ".join(text.split())


_PROPERTY_TOKENIZER = {}  # trained once for all the examples


def test_lowercase_is_stored_in_the_model():
    tok = SentencePieceTokenizer.train(_lines("en", 200), vocab_size=200, lowercase=True)
    assert tok.lowercase and tok.encode("A DOG") == tok.encode("a dog")
    assert SentencePieceTokenizer(tok.serialized_model).lowercase


def test_training_is_deterministic_and_leaves_no_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = _lines("de", 200)
    first = SentencePieceTokenizer.train(lines, vocab_size=200)
    assert first.serialized_model == SentencePieceTokenizer.train(lines, vocab_size=200) \
        .serialized_model
    assert list(tmp_path.iterdir()) == []


def test_clear_errors(tmp_path):
    lines = _lines("de", 200)
    with pytest.raises(ValueError, match="vocab_size 10: Vocabulary size is smaller"):
        SentencePieceTokenizer.train(lines, vocab_size=10)
    with pytest.raises(ValueError, match="no non-empty text"):
        SentencePieceTokenizer.train(["", " "], vocab_size=100)
    with pytest.raises(ValueError, match="kind must be one of"):
        SentencePieceTokenizer.train(lines, kind="sentencepiece-char")
    foreign = tmp_path / "foreign.model"  # SentencePiece's default ids: unk 0, no pad
    foreign.write_bytes(_spm(lines, 200))
    with pytest.raises(ValueError, match=r"pad/bos/eos/unk ids \(-1, 1, 2, 0\)"):
        load_tokenizer(foreign)
    corrupt = tmp_path / "corrupt.model"
    corrupt.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="corrupt.model is not a SentencePiece model"):
        load_tokenizer(corrupt)
    with pytest.raises(FileNotFoundError, match="nowhere.model"):
        load_tokenizer(tmp_path / "nowhere.model")


# ----------------------------------------------------------------------- Marian vocabulary
def _marian_vocab(*protos, drop_every=40):
    """A ``vocab.json`` as Marian's converter makes it: ``</s>`` 0, ``<unk>`` 1, the
    pieces of the models in order (every ``drop_every``-th left out, as pieces never seen in
    Marian's training data are), ``<pad>`` appended last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for proto in protos:
        processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if processor.is_control(i) or processor.is_unknown(i) or i % drop_every == 0:
                continue
            vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


@pytest.fixture(scope="module", params=["shared", "separate"])
def marian(request, tmp_path_factory):
    """``(ours, transformers')``: a Marian tokenizer folder saved by ``transformers``."""
    transformers = pytest.importorskip("transformers")
    raw = tmp_path_factory.mktemp("raw")
    source, target = _spm(_lines("de")), _spm(_lines("en"), 250)
    (raw / "source.spm").write_bytes(source)
    (raw / "target.spm").write_bytes(target)
    separate = request.param == "separate"
    tables = [_marian_vocab(source), _marian_vocab(target)] if separate else \
        [_marian_vocab(source, target)]
    for name, table in zip(["vocab.json", "target_vocab.json"], tables, strict=False):
        (raw / name).write_text(json.dumps(table))
    hf = transformers.MarianTokenizer(
        str(raw / "source.spm"), str(raw / "target.spm"), str(raw / "vocab.json"),
        target_vocab_file=str(raw / "target_vocab.json") if separate else None,
        separate_vocabs=separate)
    folder = tmp_path_factory.mktemp("marian")
    hf.save_pretrained(folder)
    return load_marian_tokenizers(folder), transformers.MarianTokenizer.from_pretrained(folder)


def test_marian_encoding_equals_transformers(marian):
    (source, target), hf = marian
    for text in GERMAN:
        assert source.encode(text, add_eos=True) == hf(text)["input_ids"], text
    for text in ENGLISH:
        assert target.encode(text, add_eos=True) == hf(text_target=text)["input_ids"], text
    assert hf("Ein Hund ☃")["input_ids"].count(source.unk_id) >= 1  # unknown characters
    assert source.tokenize(">>fra<< Ein") == [">>fra<<", "▁Ein"]
    # The one difference, on purpose: a special token's spelling in text is plain text.
    assert hf("Ein </s> Hund")["input_ids"].count(source.eos_id) == 2
    assert source.encode("Ein </s> Hund", add_eos=True).count(source.eos_id) == 1


def test_marian_decoding_equals_transformers(marian):
    (source, target), hf = marian
    rng = np.random.default_rng(0)
    sequences = [hf(text_target=t)["input_ids"] for t in ENGLISH]
    sequences += [[target.pad_id, *s, target.pad_id] for s in sequences]  # generate's form
    sequences += [list(rng.integers(0, target.vocab_size, 12)) for _ in range(30)]
    for ids in sequences:
        ids = [int(i) for i in ids]
        cut = ids[:ids.index(target.eos_id)] if target.eos_id in ids else ids
        # MarianTokenizer looks its special ids up in the source table, so with separate
        # vocabularies it does not skip the target's <pad>: leave those out for it.
        cut = [i for i in cut if i != target.pad_id]
        assert target.decode(ids) == hf.decode(cut, skip_special_tokens=True), ids
    assert target.decode_batch(sequences[:3]) == [target.decode(s) for s in sequences[:3]]


def test_marian_special_ids_follow_the_vocabulary(marian):
    (source, target), hf = marian
    for side in (source, target):
        assert (side.eos_id, side.unk_id) == (0, 1) == (hf.eos_token_id, hf.unk_token_id)
        assert side.pad_id == side.vocab_size - 1
        assert side.bos_id == side.decoder_start_id == side.pad_id  # no BOS in Marian
        assert side.id_to_token(side.pad_id) == "<pad>"
    assert source.pad_id == hf.pad_token_id and source.vocab_size == hf.vocab_size
    assert target.encode("A dog", add_bos=True)[0] == target.pad_id  # a decoder input
    assert hf.separate_vocabs == (source.vocab != target.vocab)


def test_marian_side_saves_as_one_file_and_loads_back(marian, tmp_path):
    (source, target), _ = marian
    for side in (source, target):
        path = tmp_path / f"{side.side}_tokenizer.json"
        side.save(path)
        loaded = load_tokenizer(path)
        assert isinstance(loaded, MarianTokenizer) and loaded.side == side.side
        assert loaded.vocab == side.vocab and loaded.pad_id == side.pad_id
        assert loaded.encode_batch(GERMAN, add_eos=True) == side.encode_batch(GERMAN,
                                                                               add_eos=True)


def test_marian_renumbered_to_model_ids_encodes_and_decodes_the_same(marian, tmp_path):
    from transformerkit.converters.marian_ids import MarianIds

    (source, target), _ = marian
    for side in (source, target):
        config = {"vocab_size": side.vocab_size, "pad_token_id": side.pad_id,
                  "eos_token_id": side.eos_id, "decoder_start_token_id": side.pad_id}
        ids = MarianIds.from_config(config, unk_id=side.unk_id)
        ours = side.renumbered(ids.source_rows)
        assert (ours.pad_id, ours.bos_id, ours.eos_id, ours.unk_id) == (0, 1, 2, 3)
        assert ours.model_ids and not side.model_ids and ours.vocab_size == side.vocab_size + 1
        assert ours.id_to_token(1) == "<s>" and ours.decoder_start_id == 1
        texts = GERMAN if side is source else ENGLISH
        for text in [*texts, "", "Ein Hund ☃ 42"]:
            raw = side.encode(text, add_eos=True)
            assert ours.encode(text, add_bos=True, add_eos=True) == \
                [1, *ids.to_ours(raw, "source").tolist()], text
            decoder_input = [1, *ids.to_ours(raw, "source").tolist()]
            assert ids.to_marian(decoder_input, "source").tolist() == [side.pad_id, *raw]
            assert ours.decode(decoder_input) == side.decode(raw)
        path = tmp_path / f"{side.side}.json"
        ours.save(path)
        loaded = load_tokenizer(path)
        assert loaded.model_ids and loaded.vocab == ours.vocab and loaded.bos_id == 1
        with pytest.raises(ValueError, match="already renumbered"):
            ours.renumbered(ids.source_rows)
        with pytest.raises(ValueError, match="rows"):
            side.renumbered(ids.source_rows[:-1])


def test_marian_batch_encoding_equals_one_by_one(marian):
    (source, _), _ = marian
    assert source.encode_batch(GERMAN, add_eos=True) == [source.encode(t, add_eos=True)
                                                         for t in GERMAN]
    assert source.encode_batch([]) == []
    ids, lengths = source.encode_batch_flat(GERMAN, add_eos=True)
    assert ids.tolist() == [i for t in GERMAN for i in source.encode(t, add_eos=True)]


def test_marian_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="folder not found"):
        load_marian_tokenizers(tmp_path / "nowhere")
    (tmp_path / "source.spm").write_bytes(_spm(_lines("de", 200), 200))
    with pytest.raises(FileNotFoundError, match="no target.spm, vocab.json"):
        load_marian_tokenizers(tmp_path)
    (tmp_path / "target.spm").write_bytes(b"garbage")
    (tmp_path / "vocab.json").write_text(json.dumps({"</s>": 0, "<unk>": 1, "<pad>": 2}))
    with pytest.raises(ValueError, match="target.spm is not a SentencePiece model"):
        load_marian_tokenizers(tmp_path)
    (tmp_path / "target.spm").write_bytes((tmp_path / "source.spm").read_bytes())
    (tmp_path / "vocab.json").write_text(json.dumps({"</s>": 0, "<unk>": 1, "<pad>": 5}))
    with pytest.raises(ValueError, match=r"ids must be 0 \.\. 2"):
        load_marian_tokenizers(tmp_path)
    (tmp_path / "vocab.json").write_text(json.dumps({"</s>": 0, "<unk>": 1}))
    with pytest.raises(ValueError, match="no pad token '<pad>'"):
        load_marian_tokenizers(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True}))
    with pytest.raises(FileNotFoundError, match="no target_vocab.json"):
        load_marian_tokenizers(tmp_path)
    with pytest.raises(ValueError, match="is a Marian tokenizer folder .*load_marian_tokenizers"):
        load_hf_tokenizer(tmp_path)  # its ids are not those of a model trained here


# ------------------------------------------------------------------------------- in a run
def _config(folder, **data):
    config = tiny_config(folder, epochs=1)
    return config.replace(data={"tokenizer": "sentencepiece", "vocab_size": 40,
                                "cache_dir": str(folder / "cache"), **data})


@pytest.fixture(scope="module")
def spm_run(tmp_path_factory):
    """A tiny translation run with a SentencePiece vocabulary per side."""
    folder = tmp_path_factory.mktemp("spm_run")
    train(_config(folder, shared_vocab=False), folder / "run")
    return folder / "run"


def test_a_run_trains_translates_and_reloads_with_model_files(spm_run):
    names = {p.name for p in spm_run.iterdir()}
    assert {"source_tokenizer.model", "target_tokenizer.model"} <= names
    assert not names & {"tokenizer.json", "source_tokenizer.json", "tokenizer.model"}
    assert RunDirectory(spm_run).tokenizer_paths() == (
        str(spm_run / "source_tokenizer.model"), str(spm_run / "target_tokenizer.model"))
    run = transformerkit.load(spm_run)
    assert isinstance(run.source_tokenizer, SentencePieceTokenizer)
    assert run.source_tokenizer is not run.target_tokenizer
    processor = sentencepiece.SentencePieceProcessor(
        model_file=str(spm_run / "target_tokenizer.model"))
    assert processor.encode("one two three") == run.target_tokenizer.encode("one two three")
    translation = run.translate("ein zwei drei", beam_size=2)
    assert isinstance(translation, str)
    assert run.translate("ein zwei drei", engine="ctranslate2", beam_size=2) == translation
    export = spm_run / "ctranslate2"
    assert {"source_tokenizer.model", "target_tokenizer.model"} <= {
        p.name for p in export.iterdir()}
    metadata = json.loads((export / "transformerkit.json").read_text())
    assert metadata["tokenizers"] == {"source": "source_tokenizer.model",
                                      "target": "target_tokenizer.model"}


def test_a_later_run_reuses_the_model_files(spm_run, tmp_path):
    assert reused_tokenizer_files(str(spm_run)) == [str(spm_run / "source_tokenizer.model"),
                                                   str(spm_run / "target_tokenizer.model")]
    data = prepare_data(_config(tmp_path, tokenizer=str(spm_run)), tmp_path / "again")
    again = tmp_path / "again" / "target_tokenizer.model"
    assert again.read_bytes() == (spm_run / "target_tokenizer.model").read_bytes()
    assert data.target_tokenizer.encode("one") == load_tokenizer(again).encode("one")
    one = prepare_data(_config(tmp_path, tokenizer=str(again)), tmp_path / "one")
    assert one.source_tokenizer.vocab_size == data.target_tokenizer.vocab_size
    assert (tmp_path / "one" / "tokenizer.model").is_file()


def test_a_shared_bpe_vocabulary_replaces_files_of_an_earlier_attempt(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tokenizer.json").write_text("{}")  # left by an attempt with other settings
    (run_dir / "source_tokenizer.model").write_bytes(b"old")
    data = prepare_data(_config(tmp_path, tokenizer="sentencepiece-bpe"), run_dir)
    assert sorted(p.name for p in run_dir.glob("*tokenizer*")) == ["tokenizer.model"]
    assert data.source_tokenizer is data.target_tokenizer or \
        data.source_tokenizer.vocab_size == data.target_tokenizer.vocab_size
    assert data.source_tokenizer.kind == "sentencepiece-bpe"
    assert load_tokenizer(run_dir / "tokenizer.model").vocab_size == 40


def test_a_gpt_refuses_sentencepiece_which_drops_line_breaks(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("First line.\nSecond line.\n" * 20)
    config = resolve({"model": {"type": "gpt", "num_layers": 1, "d_model": 16, "num_heads": 2,
                                "d_ff": 32, "max_length": 16},
                      "data": {"dataset": "text", "text": str(text),
                               "tokenizer": "sentencepiece", "block_size": 16}})
    with pytest.raises(ValueError, match="line breaks into spaces .* use bpe or char"):
        prepare_data(config, tmp_path / "gpt")
    spm_file = tmp_path / "mine.model"
    SentencePieceTokenizer.train(["First line.", "Second line."] * 20,
                                 vocab_size=30).save(spm_file)
    with pytest.raises(ValueError, match="mine.model is a SentencePiece model, which turns"):
        prepare_data(config.replace(data={"tokenizer": str(spm_file)}), tmp_path / "gpt2")
    tok = SentencePieceTokenizer.train(["First line.", "Second line."] * 20, vocab_size=30)
    assert "\n" not in tok.decode(tok.encode("First line.\nSecond line."))  # why


def test_vectors_for_one_side_and_sentencepiece_for_the_other_are_refused(tmp_path):
    """A run keeps its vocabularies in one format: a vectors file's (json) and a
    SentencePiece model (.model) do not mix."""
    write_vectors(tmp_path / "de.vec", NUMBERS_DE, dim=16)
    config = _config(tmp_path, shared_vocab=False).replace(
        model={"d_model": 16, "embeddings": {"source": str(tmp_path / "de.vec")}})
    with pytest.raises(ValueError, match="one format: data.tokenizer: sentencepiece cannot"):
        prepare_data(config, tmp_path / "run")


def test_run_directory_names_the_model_files(tmp_path):
    run = RunDirectory(tmp_path)
    assert run.tokenizer_paths(shared=True, suffix=".model") == (
        str(tmp_path / "tokenizer.model"),) * 2
    assert run.tokenizer_paths() == (str(tmp_path / "source_tokenizer.json"),
                                     str(tmp_path / "target_tokenizer.json"))
    (tmp_path / "tokenizer.model").write_bytes(b"")
    assert run.tokenizer_paths() == (str(tmp_path / "tokenizer.model"),) * 2
    with pytest.raises(ValueError, match="suffix must be one of"):
        run.tokenizer_paths(suffix=".txt")
