"""Streaming corpus readers (text pairs, TSV, JSON lines; gzip), their bad-line counts, the
tokenizer sample and the ``data.train_files`` config entries."""

import gzip
import json
import logging

import numpy as np
import pytest

from transformerkit.config import resolve
from transformerkit.data import sources
from transformerkit.data.sources import CorpusSpec, ReadReport, iter_pairs, reservoir_sample
from transformerkit.data.tokenizers import CharTokenizer, SubwordTokenizer
from transformerkit.training import data_setup, tokenizer_setup


def _write(path, data):
    """Write bytes (``.gz`` names gzip-compressed)."""
    if str(path).endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def _read(spec):
    report = ReadReport(spec.name)
    return list(iter_pairs(spec, report)), report.counts


def test_text_pairs_gzip_bom_crlf_bad_utf8_and_empty_sides(tmp_path):
    src = _write(tmp_path / "s.de.gz", b"\xef\xbb\xbfeins\r\nzw\xffei\n  \ndrei\nvier\n")
    tgt = _write(tmp_path / "t.en", b"one\ntwo\nthree\nthree b\n\n")
    pairs, counts = _read(CorpusSpec("text", (src, tgt)))
    assert pairs == [("eins", "one"), ("drei", "three b")]
    assert (counts["lines"], counts["pairs"], counts["invalid_utf8"], counts["empty_side"]) \
        == (5, 2, 1, 2)
    # the invalid line on the target side is counted as well, and alignment is kept
    pairs, counts = _read(CorpusSpec("text", (tgt, src)))
    assert pairs == [("one", "eins"), ("three b", "drei")] and counts["invalid_utf8"] == 1


def test_text_pairs_with_different_line_counts_are_an_error(tmp_path):
    src, tgt = _write(tmp_path / "s", b"a\nb\nc\n"), _write(tmp_path / "t", b"x\ny\n")
    with pytest.raises(ValueError, match=r"different line counts: .*s and .*t differ from "
                                         r"line 3"):
        _read(CorpusSpec("text", (src, tgt)))


@pytest.mark.parametrize("name", ["pairs.tsv", "pairs.tsv.gz"])
def test_tsv_columns_by_index_or_header_name_in_both_directions(tmp_path, name):
    path = _write(tmp_path / name, b"en\tes\tscore\nHello\tHola\t1\nshort line\n\n"
                                   b"Thanks\tGracias\t2\nonly\t\t3\n")
    by_name = CorpusSpec("tsv", (path,), source_column="es", target_column="en", header=True)
    pairs, counts = _read(by_name)
    assert pairs == [("Hola", "Hello"), ("Gracias", "Thanks")]
    assert (counts["lines"], counts["pairs"], counts["too_few_columns"], counts["blank"],
            counts["empty_side"]) == (5, 2, 1, 1, 1)
    forward, _ = _read(CorpusSpec("tsv", (path,), source_column=0, target_column=1,
                                  header=True))
    assert forward == [("Hello", "Hola"), ("Thanks", "Gracias")]
    # without header: the header line is a pair; column 2 needs 3 columns
    pairs, counts = _read(CorpusSpec("tsv", (path,), source_column=2, target_column=0))
    assert pairs[0] == ("score", "en") and counts["too_few_columns"] == 1


def test_tsv_bad_column_settings_are_clear(tmp_path):
    path = _write(tmp_path / "p.tsv", b"en\tde\nHi\tHallo\n")
    with pytest.raises(ValueError, match="set header: true"):
        CorpusSpec("tsv", (path,), source_column="en", target_column="de")
    with pytest.raises(ValueError, match=r"no column named 'fr'.*\['en', 'de'\]"):
        _read(CorpusSpec("tsv", (path,), source_column="fr", target_column="de", header=True))
    with pytest.raises(ValueError, match="both 1"):
        CorpusSpec("tsv", (path,), source_column=1, target_column=1)


def test_jsonl_keys_bad_json_and_missing_fields_are_counted(tmp_path, caplog):
    lines = [json.dumps({"de": "Hallo", "en": "Hello", "id": 1}), "{not json",
             json.dumps({"de": "Tschüss"}), json.dumps(["de", "en"]),
             json.dumps({"de": 3, "en": "x"}), "", json.dumps({"de": "Ja", "en": "Yes"})]
    path = _write(tmp_path / "p.jsonl.gz", ("\n".join(lines) + "\n").encode())
    spec = CorpusSpec("jsonl", (path,), source_key="en", target_key="de")
    report = ReadReport(spec.name)
    with caplog.at_level(logging.WARNING, logger="transformerkit.data.sources"):
        assert list(iter_pairs(spec, report)) == [("Hello", "Hallo"), ("Yes", "Ja")]
        report.log()
    assert report.as_dict() == {"corpus": path, "lines": 7, "pairs": 2, "blank": 1,
                                "bad_json": 1, "missing_field": 3}
    assert "skipped 4 of 7 lines (1 bad_json, 3 missing_field); 2 pairs kept" in caplog.text


def test_a_corpus_without_usable_pairs_is_one_clear_error(tmp_path):
    path = _write(tmp_path / "p.jsonl", b'{"a": 1}\n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl: no usable pair in 2 lines "
                                         r"\(2 missing_field\); check the format"):
        sources.read_pairs([CorpusSpec("jsonl", (path,))])
    with pytest.raises(FileNotFoundError, match="corpus file not found: .*nope.tsv"):
        sources.read_pairs([CorpusSpec("tsv", (str(tmp_path / "nope.tsv"),))])
    truncated = tmp_path / "cut.tsv.gz"
    truncated.write_bytes(gzip.compress(b"a\tb\n" * 1000)[:-20])
    with pytest.raises(ValueError, match="not a complete gzip file"):
        sources.read_pairs([CorpusSpec("tsv", (str(truncated),))])


def test_reservoir_sample_is_bounded_seeded_and_uniform():
    assert len(reservoir_sample(range(10_000), 100, seed=3)) == 100
    assert sorted(reservoir_sample(range(7), 100, seed=3)) == list(range(7))
    assert reservoir_sample(range(1000), 10, 5) == reservoir_sample(range(1000), 10, 5)
    assert reservoir_sample(range(1000), 10, 5) != reservoir_sample(range(1000), 10, 6)
    n, k, trials = 20, 5, 4000
    counts = np.zeros(n)
    for seed in range(trials):
        sample = reservoir_sample(range(n), k, seed)
        assert len(set(sample)) == k
        counts[sample] += 1
    # each item is kept with probability k / n = 0.25 (binomial sd 0.0068: 5 sd below)
    np.testing.assert_allclose(counts / trials, k / n, atol=0.035)


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_encode_batch_flat_equals_encode_batch(kind):
    texts = ["Ein Hund läuft.", "", "Zwei Hunde </s> laufen <pad>.", "x"]
    tok = (SubwordTokenizer.train(texts * 3, vocab_size=300) if kind == "bpe"
           else CharTokenizer.train(texts))
    for bos, eos in [(False, False), (True, True), (False, True)]:
        ids, lengths = tok.encode_batch_flat(texts, add_bos=bos, add_eos=eos)
        expected = tok.encode_batch(texts, add_bos=bos, add_eos=eos)
        assert lengths.tolist() == [len(e) for e in expected]
        assert ids.tolist() == [i for e in expected for i in e]


def _files_config(entries, **data):
    return resolve({"data": {"dataset": "files", "train_files": entries, **data}}).data


def test_train_files_entries_become_specs(tmp_path):
    data = _files_config(["a.tsv.gz", {"path": "b.jsonl", "source_key": "de"},
                          {"source": "c.de", "target": "c.en"},
                          {"path": "d.txt", "format": "tsv", "source_column": "de"}],
                         header=True, target_column="en")
    specs = data_setup.corpus_specs(data, "train")
    assert [s.format for s in specs] == ["tsv", "jsonl", "text", "tsv"]
    assert (specs[0].source_column, specs[0].target_column, specs[0].header) == (0, "en", True)
    assert (specs[1].source_key, specs[1].target_key) == ("de", "target")
    assert specs[2].paths == ("c.de", "c.en") and specs[3].source_column == "de"
    assert data_setup.corpus_specs(data, "val") is None


@pytest.mark.parametrize("entry, message", [
    ("corpus.csv", r"train_files\[0\]: cannot tell the format of 'corpus.csv'"),
    ({"path": "a.tsv", "column": 1}, r"unknown key\(s\) \['column'\]"),
    ({"path": "a.tsv", "source": "b"}, "either path"),
    ({"source": "a.de"}, "format text needs source and target"),
    ({"path": "a.tsv", "format": "xml"}, "format must be one of"),
    (3, "must be a path or a mapping"),
])
def test_bad_train_files_entries_are_clear(entry, message):
    with pytest.raises(ValueError, match=message):
        data_setup.corpus_specs(_files_config([entry]), "train")


def test_tokenizer_trains_on_a_bounded_sample(tmp_path, monkeypatch):
    lines = [f"satz {i} mit worten" for i in range(500)]
    path = _write(tmp_path / "p.tsv", "".join(f"{s}\t{s.upper()}\n" for s in lines).encode())
    config = resolve({"data": {"dataset": "tsv", "train_tsv": path, "tokenizer": "char",
                               "tokenizer_sample": 40, "cache_dir": str(tmp_path / "c"),
                               "shared_vocab": False, "batch_size": 8},
                      "model": {"max_length": 64}})
    seen = []
    real = tokenizer_setup.make_tokenizer
    monkeypatch.setattr(tokenizer_setup, "make_tokenizer",
                        lambda data, texts: seen.append(list(texts)) or real(data, texts))
    data_setup.prepare_data(config, tmp_path / "run")
    assert [len(texts) for texts in seen] == [40, 40]  # a sample of 40 pairs, each side
    assert set(seen[0]) < set(lines) and [t.lower() for t in seen[1]] == seen[0]
    seen.clear()  # a second run: the tokenizers come from the cache
    data_setup.prepare_data(config, tmp_path / "run2")
    assert seen == []
