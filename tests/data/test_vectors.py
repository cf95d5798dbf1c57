"""Vectors files (word2vec/GloVe text, BPEmb pieces, gzip) and the tokenizers built over
their tokens: every id is the row of its token's vector."""

import gzip

import numpy as np
import pytest
from vectors_files import write_vectors

from transformerkit.data.tokenizers import SubwordTokenizer, load_tokenizer
from transformerkit.data.vectors import (
    aligned_matrix,
    embedding_files,
    read_vectors,
    vocabulary_tokenizer,
)
from transformerkit.special_tokens import SPECIAL_TOKENS, UNK_ID

WORDS = ["the", "dog", "runs", ".", ",", "a", "cat"]
PIECES = ["<unk>", "<s>", "</s>", "▁the", "▁d", "og", "s", "▁", "▁run", "o", "g", "t", "h",
          "e", "d", "r", "u", "n", "▁c", "at", "a", "c"]


@pytest.mark.parametrize("header", [True, False])
@pytest.mark.parametrize("gz", [False, True])
def test_reads_word2vec_and_glove_formats(tmp_path, header, gz):
    path = tmp_path / ("v.txt.gz" if gz else "v.txt")
    table = write_vectors(path, WORDS, header=header, opener=gzip.open if gz else open)
    vectors = read_vectors(path)
    assert vectors.tokens == WORDS and vectors.dim == 3
    np.testing.assert_array_equal(vectors.matrix, np.stack([table[t] for t in WORDS]))
    assert read_vectors(path, limit=2).tokens == WORDS[:2]


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="vectors file not found"):
        read_vectors(tmp_path / "missing.vec")
    bad = tmp_path / "bad.txt"
    bad.write_text("the 1 2 3\ndog 1 2\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: expected a token and 3 numbers"):
        read_vectors(bad)
    bad.write_text("the 1 2 3\ndog 1 x 3\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: .*'x'"):
        read_vectors(bad)
    bad.write_text("\n\n")
    with pytest.raises(ValueError, match="holds no vectors"):
        read_vectors(bad)
    bad.write_bytes(b"\x00\xff\xfe binary")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_vectors(bad)


def test_repeated_token_keeps_its_first_vector(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a 1 2\nb 3 4\na 5 6\n")
    vectors = read_vectors(path)
    assert vectors.tokens == ["a", "b"]
    np.testing.assert_array_equal(vectors.matrix[0], [1, 2])


def test_word_vocabulary_ids_are_rows(tmp_path):
    table = write_vectors(tmp_path / "w.vec", WORDS)
    vectors = read_vectors(tmp_path / "w.vec")
    backend, kind = vocabulary_tokenizer(vectors)
    assert kind == "words"
    tokenizer = SubwordTokenizer(backend, kind=kind)
    assert [tokenizer.id_to_token(i) for i in range(4)] == list(SPECIAL_TOKENS)
    matrix = aligned_matrix(vectors, tokenizer)
    assert matrix.shape == (4 + len(WORDS), 3) and np.isnan(matrix[:4]).all()
    for token, vector in table.items():
        np.testing.assert_array_equal(matrix[tokenizer.token_to_id(token)], vector)
    # whitespace + punctuation split; an unknown word is <unk>; text spelling "</s>" is text
    ids = tokenizer.encode("the dog, a cow runs.")
    assert [tokenizer.id_to_token(i) for i in ids] == [
        "the", "dog", ",", "a", "<unk>", "runs", "."]
    assert tokenizer.decode(ids) == "the dog , a <unk> runs ."
    assert tokenizer.encode("</s>") == [UNK_ID] * 4


def test_lowercase_matches_lowercased_vectors(tmp_path):
    write_vectors(tmp_path / "w.vec", WORDS)
    backend, _ = vocabulary_tokenizer(read_vectors(tmp_path / "w.vec"), lowercase=True)
    assert backend.encode("The DOG").tokens == ["the", "dog"]


def test_bpemb_pieces_ids_are_rows_and_text_round_trips(tmp_path):
    """BPEmb's files hold <unk>, <s>, </s> among the pieces: they fill rows 3, 1, 2."""
    table = write_vectors(tmp_path / "bpemb.d3-vs22.txt", PIECES, header=False)
    vectors = read_vectors(tmp_path / "bpemb.d3-vs22.txt")
    backend, kind = vocabulary_tokenizer(vectors)
    assert kind == "pieces"
    tokenizer = SubwordTokenizer(backend, kind=kind)
    assert tokenizer.vocab_size == 1 + len(PIECES)  # <pad> is the one new row
    matrix = aligned_matrix(vectors, tokenizer)
    assert np.isnan(matrix[0]).all() and not np.isnan(matrix[1:]).any()
    for token, vector in table.items():
        np.testing.assert_array_equal(matrix[tokenizer.token_to_id(token)], vector)
    for i in range(4, tokenizer.vocab_size):  # every id maps to its own piece's row
        np.testing.assert_array_equal(matrix[i], table[tokenizer.id_to_token(i)])
    assert tokenizer.tokenize("the dogs run") == ["▁the", "▁d", "og", "s", "▁run"]
    text = "the cat runs, the dog"
    assert tokenizer.decode(tokenizer.encode(text)) == text.replace(",", "<unk>")
    # saved and loaded, the ids stay
    tokenizer.save(tmp_path / "t.json")
    assert load_tokenizer(tmp_path / "t.json").encode(text) == tokenizer.encode(text)


def test_token_kind_can_be_forced(tmp_path):
    write_vectors(tmp_path / "w.vec", WORDS)
    _, kind = vocabulary_tokenizer(read_vectors(tmp_path / "w.vec"), tokens="pieces")
    assert kind == "pieces"
    with pytest.raises(ValueError, match="tokens must be one of"):
        vocabulary_tokenizer(read_vectors(tmp_path / "w.vec"), tokens="chars")


def test_embedding_files_config():
    assert embedding_files(None) == {}
    assert embedding_files({"source": "a.vec", "target": {"file": "b.vec", "limit": 5}}) == {
        "source": {"file": "a.vec", "tokens": "auto", "limit": None},
        "target": {"file": "b.vec", "tokens": "auto", "limit": 5}}
    for bad, message in [({"src": "a.vec"}, "unknown key"),
                         ({"shared": "a", "source": "b"}, "not both"),
                         ({"source": {"path": "a"}}, "mapping with file"),
                         ({"source": {"file": "a", "trainable": False}}, "unknown key"),
                         ({"source": {"file": "a", "limit": 0}}, "must be positive"),
                         ({"source": {"file": "a", "tokens": "chars"}}, "tokens must be")]:
        with pytest.raises(ValueError, match=message):
            embedding_files(bad)
