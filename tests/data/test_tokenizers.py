"""Tokenizers: reserved ids, exact round trips, empty lines, save/load, clear errors."""

import json
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import SHARED_DATA

from transformerkit.data.tokenizers import (
    BOS,
    EOS,
    PAD,
    UNK,
    CharTokenizer,
    SubwordTokenizer,
    load_hf_tokenizer,
    load_tokenizer,
)

DATA = SHARED_DATA
KINDS = ("bpe", "wordpiece", "unigram")

# Held-out sentences: accents (de, fr, cs), emoji, CJK, punctuation, a double space.
SAMPLES = [
    "Ein älterer Mann mit Brille überquert die Straße.",
    "Un garçon à vélo près d'une rivière, très âgé !",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Ein Hund 🐕 rennt über die Wiese 🙂",
    "一只狗在草地上奔跑。",
    "Zwei Kinder (ein Junge und ein Mädchen) spielen  im Sand.",
]
EMPTY_LINES = ["", "   ", "\t", ""]


def _corpus_lines(n_per_language=700):
    lines = []
    for lang in ("de", "fr", "cs", "en"):
        path = DATA / "multi30k" / f"train.{lang}"
        if not path.is_file():
            pytest.skip(f"shared data not found at {path} (set TRANSFORMERKIT_DATA)")
        lines += path.read_text(encoding="utf-8").splitlines()[:n_per_language]
    return lines


@pytest.fixture(scope="module")
def corpus():
    # The samples' characters must be seen in training for wordpiece/unigram (no byte
    # fallback); the samples themselves are never in the training text.
    alphabet_lines = ["".join(sorted(set(s))) for s in SAMPLES] * 5
    return _corpus_lines() + alphabet_lines + EMPTY_LINES


@pytest.fixture(scope="module", params=KINDS)
def trained(request, corpus):
    return SubwordTokenizer.train(corpus, kind=request.param, vocab_size=600, min_frequency=2)


def test_reserved_ids_and_empty_lines_are_skipped_and_counted(trained, corpus):
    assert [trained.id_to_token(i) for i in range(4)] == [PAD, BOS, EOS, UNK]
    assert (trained.pad_id, trained.bos_id, trained.eos_id, trained.unk_id) == (0, 1, 2, 3)
    assert [trained.token_to_id(t) for t in (PAD, BOS, EOS, UNK)] == [0, 1, 2, 3]
    assert trained.training_stats == {"lines": len(corpus) - len(EMPTY_LINES),
                                      "skipped_empty": len(EMPTY_LINES)}
    assert 100 < trained.vocab_size <= 600


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_is_exact_for_accents_emoji_cjk(trained, text):
    ids = trained.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and 1 not in ids[1:-1] and 2 not in ids[1:-1]
    assert trained.unk_id not in ids
    assert trained.decode(ids) == text
    assert trained.decode(trained.encode(text)) == text


def test_tokenize_matches_encode_and_ids_round_trip(trained):
    text = SAMPLES[0]
    pieces = trained.tokenize(text)
    assert len(pieces) > 3
    assert [trained.token_to_id(p) for p in pieces] == trained.encode(text)
    assert [trained.id_to_token(i) for i in trained.encode(text)] == pieces
    assert trained.token_to_id("no-such-token-in-any-vocab") is None
    with pytest.raises(ValueError, match="99999"):
        trained.id_to_token(99999)


def test_decode_stops_at_first_eos_and_drops_pad_and_bos(trained):
    a, b = trained.encode(SAMPLES[0]), trained.encode(SAMPLES[1])
    assert trained.decode([1] + a + [2] + b + [2, 0, 0]) == SAMPLES[0]
    assert trained.decode([0, 1] + a[:2] + [0] + a[2:]) == SAMPLES[0]
    batch = np.zeros((2, len(a) + len(b) + 2), dtype="int32")
    batch[0, :len(a) + 2] = [1, *a, 2]
    batch[1, :len(b) + 1] = [1, *b]
    assert trained.decode_batch(batch) == [SAMPLES[0], SAMPLES[1]]


def test_encode_batch_equals_encode(trained):
    texts = SAMPLES + ["", "x"]
    assert trained.encode_batch(texts, add_eos=True) == [trained.encode(t, add_eos=True)
                                                         for t in texts]


def test_special_token_spelling_in_text_is_plain_text(trained):
    ids = trained.encode("ein <s> und </s> oder <pad>")
    assert not {0, 1, 2} & set(ids)


def test_save_load_gives_identical_tokenizer(trained, corpus, tmp_path):
    path = tmp_path / "sub" / "tok.json"
    trained.save(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["tok.json"]  # no temp files
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["transformerkit"]["kind"] == trained.kind
    for loaded in (SubwordTokenizer.load(path), load_tokenizer(path)):
        assert isinstance(loaded, SubwordTokenizer)
        assert (loaded.kind, loaded.lowercase, loaded.vocab_size) == (
            trained.kind, False, trained.vocab_size)
        texts = corpus[:300] + SAMPLES + ["a <s> b"]
        assert loaded.encode_batch(texts, add_bos=True) == trained.encode_batch(texts,
                                                                                add_bos=True)
        assert loaded.decode_batch(trained.encode_batch(SAMPLES)) == SAMPLES


def test_lowercase_and_nfkc_are_applied_and_saved(tmp_path):
    texts = ["Ein Mann fährt FAHRRAD.", "Die Straße ist nass."] * 20
    tok = SubwordTokenizer.train(texts, kind="bpe", vocab_size=300, lowercase=True)
    assert tok.decode(tok.encode("Ein MANN fährt")) == "ein mann fährt"
    assert tok.decode(tok.encode("ﬁnden")) == "finden"  # NFKC: ligature fi -> f, i
    tok.save(tmp_path / "t.json")
    loaded = load_tokenizer(tmp_path / "t.json")
    assert loaded.lowercase is True
    assert loaded.encode("Ein MANN") == tok.encode("ein mann")


def test_byte_level_bpe_round_trips_unseen_characters_without_unk():
    tok = SubwordTokenizer.train(["plain ascii text only"] * 10, kind="bpe", vocab_size=300)
    text = "Ωμέγα ☃ 𝄞 Ünïcödé 日本語 \x01 tab\there"
    ids = tok.encode(text)
    assert tok.unk_id not in ids
    assert tok.decode(ids) == text


@pytest.mark.parametrize("kind", ("wordpiece", "unigram"))
def test_unseen_characters_become_unk(kind):
    tok = SubwordTokenizer.train(["abc abd abe"] * 10, kind=kind, vocab_size=50,
                                 min_frequency=1)
    assert tok.unk_id in tok.encode("abc Ω")


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(max_codepoint=0x2FFFF, exclude_categories=("Cs", "Cn", "Co")),
               max_size=40))
def test_byte_level_bpe_round_trip_property(text):
    tok = _tiny_bpe()
    # "Modulo normalization": the library's own NFKC (its Unicode version may be newer than
    # Python's unicodedata), which for most text equals Python's.
    expected = tok.backend_tokenizer.normalizer.normalize_str(text)
    assert tok.decode(tok.encode(text, add_bos=True, add_eos=True)) == expected


def test_normalization_is_nfkc():
    normalizer = _tiny_bpe().backend_tokenizer.normalizer
    for text in ("ﬁ Ⅻ ½ Å", "e\u0301", "ＡＢＣ"):
        assert normalizer.normalize_str(text) == unicodedata.normalize("NFKC", text)


_TINY = {}


def _tiny_bpe():
    if "bpe" not in _TINY:
        _TINY["bpe"] = SubwordTokenizer.train(["the cat sat on the mat", "über alles"] * 20,
                                              kind="bpe", vocab_size=300)
    return _TINY["bpe"]


def test_train_rejects_bad_arguments():
    with pytest.raises(ValueError, match="sentencepiece"):
        SubwordTokenizer.train(["a b"], kind="sentencepiece")
    with pytest.raises(ValueError, match="vocab_size"):
        SubwordTokenizer.train(["a b"], vocab_size=4)
    with pytest.raises(ValueError, match="no non-empty text"):
        SubwordTokenizer.train(["", "  "])
    with pytest.raises(TypeError, match="iterable of strings"):
        SubwordTokenizer.train("one long string")
    with pytest.raises(TypeError, match="int"):
        SubwordTokenizer.train(["ok", 5])


def test_missing_and_corrupt_files_raise_errors_naming_the_path(tmp_path):
    missing = tmp_path / "nope.json"
    for load in (SubwordTokenizer.load, CharTokenizer.load, load_tokenizer):
        with pytest.raises(FileNotFoundError, match="nope.json"):
            load(missing)
    truncated = tmp_path / "truncated.json"
    _tiny_bpe().save(truncated)
    truncated.write_text(truncated.read_text(encoding="utf-8")[:200], encoding="utf-8")
    for load in (SubwordTokenizer.load, load_tokenizer):
        with pytest.raises(ValueError, match="truncated.json"):
            load(truncated)
    bad_model = tmp_path / "bad_model.json"
    bad_model.write_text(json.dumps({"model": {"type": "NoSuchModel"}}), encoding="utf-8")
    with pytest.raises(ValueError, match="bad_model.json.*corrupt"):
        load_tokenizer(bad_model)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}), encoding="utf-8")
    with pytest.raises(ValueError, match="other.json"):
        load_tokenizer(other)
    with pytest.raises(ValueError, match="other.json"):
        CharTokenizer.load(other)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="binary.json"):
        load_tokenizer(binary)


# ----------------------------------------------------------------------------- char level
def test_char_tokenizer_on_shakespeare_round_trips_and_saves(tmp_path):
    path = DATA / "tinyshakespeare" / "input.txt"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path}")
    text = path.read_text(encoding="utf-8")
    tok = CharTokenizer.train([text])
    assert tok.vocab_size == 4 + 65  # the README: 65 distinct characters
    assert [tok.id_to_token(i) for i in range(4)] == [PAD, BOS, EOS, UNK]
    ids = tok.encode(text[:5000], add_bos=True, add_eos=True)
    assert min(ids[1:-1]) >= 4 and (ids[0], ids[-1]) == (1, 2)
    assert tok.decode(ids) == text[:5000]
    tok.save(tmp_path / "char.json")
    loaded = load_tokenizer(tmp_path / "char.json")
    assert isinstance(loaded, CharTokenizer)
    assert loaded.encode(text[:2000]) == tok.encode(text[:2000])


def test_char_tokenizer_unknown_chars_specials_and_empty_lines():
    tok = CharTokenizer.train(["hello", "", "  ", "world"])
    assert tok.training_stats == {"lines": 2, "skipped_empty": 2}
    assert tok.vocab_size == 4 + len(set("helloworld"))
    assert tok.encode("hé") == [tok.token_to_id("h"), 3]
    assert tok.tokenize("hé") == ["h", UNK]
    assert tok.decode(tok.encode("hé")) == "h<unk>"
    assert tok.decode([1, *tok.encode("hold"), 2, *tok.encode("xx"), 0]) == "hold"
    assert tok.encode_batch(["he", "lo"], add_eos=True) == [tok.encode("he", add_eos=True),
                                                            tok.encode("lo", add_eos=True)]
    with pytest.raises(ValueError, match="outside"):
        tok.id_to_token(tok.vocab_size)


# ------------------------------------------------------------------------ Hugging Face folder
def _bert_like_folder(folder, specials=("[PAD]", "[UNK]", "[CLS]", "[SEP]")):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate([*specials, "hello", "world", "##s", "!"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}))
    return folder


def test_load_hf_tokenizer_folder(tmp_path):
    tok = load_hf_tokenizer(_bert_like_folder(tmp_path / "bert"))
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    ids = tok.encode("hello worlds!", add_bos=True, add_eos=True)
    assert ids == [2, 4, 5, 6, 7, 3]
    assert tok.decode(ids + [4]) == "hello worlds!"
    tok.save(tmp_path / "saved.json")
    assert load_tokenizer(tmp_path / "saved.json").encode("hello worlds") == [4, 5, 6]


def test_load_hf_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing_folder"):
        load_hf_tokenizer(tmp_path / "missing_folder")
    with pytest.raises(ValueError, match="pad_id=1"):
        load_hf_tokenizer(_bert_like_folder(tmp_path / "odd", ("[UNK]", "[PAD]", "[CLS]", "[SEP]")))
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"transformerkit\[hf\]"):
            load_hf_tokenizer(slow)
