"""The on-disk token cache: built once and reused, rebuilt on any change of its inputs,
corrupt or truncated folders detected, batches equal to the in-memory pipeline's, and
``train`` end to end on TSV and JSON-lines corpora."""

import gzip
import json
import logging
import os
import re

import numpy as np
import pytest

from transformerkit.config import resolve
from transformerkit.data import token_cache
from transformerkit.data.pipeline import TranslationBatches, encode_pairs
from transformerkit.data.sources import CorpusSpec, iter_corpora
from transformerkit.data.tokenizers import CharTokenizer, SubwordTokenizer
from transformerkit.run_directory import RunDirectory
from transformerkit.training.data_setup import prepare_data

WORDS = "ein zwei drei vier fuenf sechs sieben acht neun zehn hund katze".split()


def _corpus(tmp_path, n=300, seed=0, name="c.tsv"):
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), rng.integers(1, 9))]
        lines.append(f"{' '.join(words)}\t{' '.join(w.upper() for w in reversed(words))}")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\nbroken line\n", encoding="utf-8")
    return str(path)


def _open(root, path, tok, max_length=12):
    spec = CorpusSpec("tsv", (path,))

    def read():
        reports = []
        return iter_corpora([spec], reports), reports

    parts = {"file": token_cache.file_digest(path, root), "max_length": max_length,
             "tokenizer": repr(tok.vocab_size)}
    return token_cache.open_or_build(root, parts, read, tok, tok, max_length)


@pytest.fixture
def tok():
    return CharTokenizer.train(WORDS + [w.upper() for w in WORDS])


def _mtimes(folder):
    return {name: os.stat(os.path.join(folder, name)).st_mtime_ns
            for name in os.listdir(folder)}


def test_cache_holds_the_encoded_pairs_and_is_reused(tmp_path, tok, monkeypatch):
    path, root = _corpus(tmp_path), tmp_path / "cache"
    monkeypatch.setattr(token_cache, "CHUNK_PAIRS", 64)  # several chunks
    first = _open(root, path, tok)
    assert first.status == "built"
    sources_, targets = zip(*(line.split("\t") for line in
                              open(path, encoding="utf-8").read().splitlines()[:-1]),
                            strict=True)
    reference = encode_pairs(sources_, targets, tok, tok, 12)
    assert len(first) == len(reference) and first.dropped == reference.dropped > 0
    for i in range(len(first)):
        assert first.source[i].tolist() == reference.source[i].tolist()
        assert first.target[i].tolist() == reference.target[i].tolist()
    assert first.source.ids.dtype == np.uint16
    assert first.manifest["read"][0]["too_few_columns"] == 1
    before = _mtimes(first.path)
    again = _open(root, path, tok)
    assert (again.status, again.path) == ("reused", first.path)
    assert _mtimes(again.path) == before  # not rewritten
    assert len([d for d in os.listdir(root) if not d.endswith(".json")]) == 1


def test_changed_input_tokenizer_or_max_length_gives_a_new_cache(tmp_path, tok):
    path, root = _corpus(tmp_path), tmp_path / "cache"
    first = _open(root, path, tok)
    other_max = _open(root, path, tok, max_length=9)
    other_tok = _open(root, path, CharTokenizer.train(WORDS))
    assert len({first.path, other_max.path, other_tok.path}) == 3
    assert other_max.status == other_tok.status == "built" and len(other_max) < len(first)
    stat = os.stat(path)
    _corpus(tmp_path, seed=1)  # new content, same name
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    changed = _open(root, path, tok)
    assert changed.status == "built" and changed.path != first.path
    assert _open(root, path, tok).status == "reused"


def test_a_corpus_edited_to_its_old_size_and_time_gives_a_new_cache(tmp_path, tok,
                                                                     monkeypatch):
    """The corpus' remembered digest follows the file's change time too: an edit of the
    same size with its modification time set back (``cp -p``, ``rsync -a``) is read again
    and keys another cache."""
    import time

    from transformerkit import files

    monkeypatch.setattr(files, "RACY_SECONDS", 0.0)  # remember at once
    root = tmp_path / "cache"
    path = tmp_path / "c.tsv"
    path.write_text("ein zwei\tZWEI EIN\ndrei\tDREI\n", encoding="utf-8")
    first = _open(root, str(path), tok)
    assert os.listdir(root / token_cache.DIGESTS)  # remembered
    stat = os.stat(path)
    time.sleep(0.05)  # past the kernel's clock tick
    path.write_text("ein drei\tDREI EIN\nzwei\tZWEI\n", encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size
    changed = _open(root, str(path), tok)
    assert changed.status == "built" and changed.path != first.path


@pytest.mark.parametrize("damage, reason", [
    ("truncate", "has .* bytes, the manifest says"),
    ("flip", "does not match its sha256"),
    ("manifest", "no manifest.json"),
    ("offsets", "does not match its sha256"),
])
def test_damaged_cache_is_detected_and_rebuilt(tmp_path, tok, caplog, damage, reason):
    path, root = _corpus(tmp_path), tmp_path / "cache"
    built = _open(root, path, tok)
    target = os.path.join(built.path, {"offsets": "source.offsets"}.get(damage, "target.ids"))
    expected = [built.target[i].tolist() for i in range(len(built))]
    del built
    if damage == "truncate":
        os.truncate(target, os.path.getsize(target) - 3)
    elif damage == "manifest":
        os.remove(os.path.join(os.path.dirname(target), token_cache.MANIFEST))
    else:
        with open(target, "r+b") as f:
            f.seek(5)
            byte = f.read(1)
            f.seek(5)
            f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="transformerkit.data.token_cache"):
        rebuilt = _open(root, path, tok)
    assert rebuilt.status == "rebuilt"
    assert "is unusable" in caplog.text and re.search(reason, caplog.text)
    assert [rebuilt.target[i].tolist() for i in range(len(rebuilt))] == expected
    assert _open(root, path, tok).status == "reused"


def test_verify_rejects_a_manifest_of_other_inputs(tmp_path, tok):
    path, root = _corpus(tmp_path), tmp_path / "cache"
    built = _open(root, path, tok)
    with pytest.raises(token_cache.CacheCorrupt, match="other inputs"):
        token_cache.verify(built.path, {"something": "else"})


@pytest.mark.parametrize("options", [dict(tokens_per_batch=40), dict(batch_size=7),
                                     dict(batch_size=5, bucket=False),
                                     dict(tokens_per_batch=48, pad_to_multiple=4,
                                          shuffle=False)])
def test_batches_from_the_cache_equal_the_in_memory_batches(tmp_path, options):
    path = _corpus(tmp_path)
    sources_, targets = zip(*(line.split("\t") for line in
                              open(path, encoding="utf-8").read().splitlines()[:-1]),
                            strict=True)
    tok = SubwordTokenizer.train(list(sources_) + list(targets), vocab_size=80)
    cached = _open(tmp_path / "cache", path, tok)
    reference = encode_pairs(sources_, targets, tok, tok, 12)
    a = TranslationBatches(cached, seed=3, **options)
    b = TranslationBatches(reference, seed=3, **options)
    assert len(a) == len(b) > 3
    for epoch in (0, 1):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        for i in range(len(a)):
            (sa, da), la = a[i]
            (sb, db), lb = b[i]
            for x, y in ((sa, sb), (da, db), (la, lb)):
                assert x.dtype == y.dtype == np.int32
                np.testing.assert_array_equal(x, y)


def _train_config(tmp_path, **data):
    return resolve({
        "model": {"num_layers": 1, "d_model": 16, "num_heads": 2, "d_ff": 32, "dropout": 0.0,
                  "max_length": 40},
        "data": {"tokenizer": "char", "batch_size": 8, "cache_dir": str(tmp_path / "cache"),
                 **data},
        "train": {"epochs": 1, "max_steps": 2, "learning_rate": 0.003, "verbose": 0,
                  "samples": 0, "eval_max_sentences": 2}})


def test_train_end_to_end_on_tsv_and_jsonl_corpora_reuses_the_cache(tmp_path):
    from transformerkit.training.trainer import train

    rows = [("one two", "eins zwei"), ("three", "drei"), ("two one", "zwei eins")] * 8
    tsv = tmp_path / "de_en.tsv.gz"
    tsv.write_bytes(gzip.compress(("id\ten\tde\n" + "".join(
        f"{i}\t{en}\t{de}\n" for i, (en, de) in enumerate(rows)) + "9\tshort\n").encode()))
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text("".join(json.dumps({"en": en, "de": de}) + "\n" for en, de in rows)
                     + "{bad\n", encoding="utf-8")
    config = _train_config(
        tmp_path, dataset="files", header=True, source_column="de", target_column="en",
        train_files=[str(tsv), {"path": str(jsonl), "source_key": "de", "target_key": "en"}],
        val_files=[str(tsv)])
    metrics = train(config, tmp_path / "run")
    assert metrics["steps"] == 2 and metrics["train_pairs"] == 2 * len(rows)
    assert metrics["malformed_train_lines"] == 2
    assert [c["corpus"] for c in metrics["train_corpora"]] == [str(tsv), str(jsonl)]
    assert metrics["train_corpora"][0]["too_few_columns"] == 1
    assert metrics["train_corpora"][1]["bad_json"] == 1
    assert metrics["token_cache"].endswith("(built)") and metrics["val_pairs"] == len(rows)
    data = prepare_data(config, tmp_path / "run", reuse_tokenizers=True)  # as --resume does
    assert data.info["token_cache"] == metrics["token_cache"].replace("built", "reused")
    (source, _), _ = data.train[0]
    german = {data.source_tokenizer.decode(row) for row in source}
    assert german <= {de for _, de in rows}  # de -> en: the source side is German
    assert os.path.isfile(RunDirectory(tmp_path / "run").model)
