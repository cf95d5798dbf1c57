"""Corpora: Multi30k from the shared data and via a (fake) download, text/TSV readers."""

import gzip
import io
import logging
import urllib.error

import pytest
from paths import SHARED_DATA

from transformerkit.data import corpora
from transformerkit.data.corpora import (
    MULTI30K_COMMIT,
    ChecksumError,
    load_multi30k,
    load_ted_hrlr,
    load_text,
    read_lines,
    read_parallel,
    read_tsv,
    resolve_data_dir,
)

SHARED = SHARED_DATA


@pytest.fixture
def shared_data(monkeypatch):
    """Point TRANSFORMERKIT_DATA at the shared data; forbid any download."""
    if not (SHARED / "multi30k" / "train.en").is_file():
        pytest.skip(f"shared data not found at {SHARED}")
    monkeypatch.setenv("TRANSFORMERKIT_DATA", str(SHARED))
    monkeypatch.setattr(corpora, "_urlopen", _no_network)
    return SHARED


def _no_network(url, timeout=None):
    raise AssertionError(f"unexpected download of {url}")


class FakeOpener:
    """Serves ``data/task1/raw/{name}.{lang}.gz`` from the shared plain files, gzipped."""

    def __init__(self, corrupt=False, not_gzip=False):
        self.urls, self.corrupt, self.not_gzip = [], corrupt, not_gzip

    def __call__(self, url, timeout=None):
        self.urls.append(url)
        name, lang, _ = url.rsplit("/", 1)[1].split(".")
        local = {"test_2016_flickr": "test2016"}.get(name, name)
        data = (SHARED / "multi30k" / f"{local}.{lang}").read_bytes()
        if self.corrupt:
            data = data[:100] + b"X" + data[101:]
        return io.BytesIO(data if self.not_gzip else gzip.compress(data))


# ---------------------------------------------------------------------------- Multi30k
@pytest.mark.parametrize("split, count", [("train", 29000), ("val", 1014), ("test2016", 1000)])
def test_multi30k_splits_have_the_documented_line_counts(shared_data, split, count):
    sources, targets = load_multi30k(split, "de", "en")
    assert len(sources) == len(targets) == count
    first_de = (shared_data / "multi30k" / f"{split}.de").read_text("utf-8").split("\n")[0]
    first_en = (shared_data / "multi30k" / f"{split}.en").read_text("utf-8").split("\n")[0]
    assert (sources[0], targets[0]) == (first_de.strip(), first_en.strip())


def test_multi30k_other_pairs_and_stripping(shared_data):
    fr, cs = load_multi30k("train", "fr", "cs")
    assert len(fr) == len(cs) == 29000
    # The README: 27 lines of train.fr start with a space, 40 of train.de end with one.
    assert not [s for s in fr if s != s.strip()]
    de, en = load_multi30k("train", "de", "en", data_dir=shared_data)
    assert not [s for s in de if s != s.strip()]
    assert en[0].isascii()


@pytest.mark.parametrize("args, message", [
    (("test", "de", "en"), "'test'"),
    (("train", "es", "en"), "'es'"),
    (("train", "de", "xx"), "'xx'"),
    (("train", "de", "de"), "both 'de'"),
])
def test_multi30k_rejects_unknown_split_or_language(shared_data, args, message):
    with pytest.raises(ValueError, match=message):
        load_multi30k(*args)


def test_multi30k_missing_file_without_download_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"multi30k.val\.de"):
        load_multi30k("val", "de", "en", data_dir=tmp_path, download=False)


def test_multi30k_download_with_fake_opener(shared_data, tmp_path, monkeypatch):
    opener = FakeOpener()
    monkeypatch.setattr(corpora, "_urlopen", opener)
    sources, targets = load_multi30k("test2016", "de", "en", data_dir=tmp_path)
    assert opener.urls == [
        f"https://raw.githubusercontent.com/multi30k/dataset/{MULTI30K_COMMIT}/data/task1/raw/"
        f"test_2016_flickr.{lang}.gz" for lang in ("de", "en")]
    for lang in ("de", "en"):
        assert (tmp_path / "multi30k" / f"test2016.{lang}").read_bytes() == (
            shared_data / "multi30k" / f"test2016.{lang}").read_bytes()
    assert sorted(p.name for p in (tmp_path / "multi30k").iterdir()) == ["test2016.de",
                                                                          "test2016.en"]
    assert (sources, targets) == load_multi30k("test2016", "de", "en", data_dir=shared_data)
    load_multi30k("test2016", "en", "de", data_dir=tmp_path)  # cached: no second download
    assert len(opener.urls) == 2


@pytest.mark.parametrize("fake, message", [
    (FakeOpener(corrupt=True), "checksum mismatch"),
    (FakeOpener(not_gzip=True), "not a valid gzip"),
])
def test_multi30k_download_rejects_bad_files(shared_data, tmp_path, monkeypatch, fake,
                                             message):
    monkeypatch.setattr(corpora, "_urlopen", fake)
    with pytest.raises(ChecksumError, match=message) as info:
        load_multi30k("val", "de", "en", data_dir=tmp_path)
    assert "val.de.gz" in str(info.value)
    assert isinstance(info.value, ValueError)
    folder = tmp_path / "multi30k"
    assert not folder.exists() or not list(folder.iterdir())  # nothing written, no temp file


def test_multi30k_download_network_error_is_clear(tmp_path, monkeypatch):
    def offline(url, timeout=None):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(corpora, "_urlopen", offline)
    with pytest.raises(OSError, match="could not download https://.*val.de.gz"):
        load_multi30k("val", "de", "en", data_dir=tmp_path)


def test_resolve_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("TRANSFORMERKIT_DATA", str(tmp_path / "env"))
    assert resolve_data_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert resolve_data_dir() == tmp_path / "env"
    monkeypatch.delenv("TRANSFORMERKIT_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert resolve_data_dir() == tmp_path / "cache" / "transformerkit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_data_dir() == tmp_path / "home" / ".cache" / "transformerkit"


# ---------------------------------------------------------------------------- plain files
def test_read_lines_strips_handles_crlf_bom_and_only_splits_on_newline(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("\ufeffeins \r\n zwei\u2028drei\n\nvier".encode())
    assert read_lines(path) == ["eins", "zwei\u2028drei", "", "vier"]


def test_read_lines_errors_name_the_path_and_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        read_lines(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nstill ok\nbroken \xff here\n")
    with pytest.raises(ValueError, match=r"bad\.txt.*line 3"):
        read_lines(bad)


def test_read_parallel_line_count_mismatch_names_both_files(tmp_path):
    (tmp_path / "s.de").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "t.en").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"s\.de has 3 lines.*t\.en has 2"):
        read_parallel(tmp_path / "s.de", tmp_path / "t.en")


def test_read_parallel_drops_and_reports_empty_pairs(tmp_path, caplog):
    (tmp_path / "s").write_text("eins\n  \ndrei\nvier\n\n", encoding="utf-8")
    (tmp_path / "t").write_text("one\ntwo\nthree\n \nfive\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="transformerkit.data.corpora"):
        sources, targets = read_parallel(tmp_path / "s", tmp_path / "t")
    assert (sources, targets) == (["eins", "drei"], ["one", "three"])
    assert "dropped 3 of 5 pairs" in caplog.text


def test_read_tsv_columns_blank_lines_and_errors(tmp_path, caplog):
    path = tmp_path / "pairs.tsv"
    path.write_text("id\tHallo Welt\tHello world\n\n2\tGuten Tag \t Good day\n3\t\tx\n",
                    encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert read_tsv(path, 1, 2) == (["Hallo Welt", "Guten Tag"], ["Hello world", "Good day"])
    assert "skipped 1 of 4 lines (1 empty_side); 2 pairs kept" in caplog.text
    assert read_tsv(path, 2, 1)[0] == ["Hello world", "Good day"]
    with pytest.raises(ValueError, match=r"pairs\.tsv: no usable pair in 4 lines "
                                         r"\(3 too_few_columns, 1 blank\)"):
        read_tsv(path, 0, 3)
    with pytest.raises(ValueError, match="both 1"):
        read_tsv(path, 1, 1)


def test_load_text_is_the_whole_file_unchanged():
    path = SHARED / "tinyshakespeare" / "input.txt"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path}")
    text = load_text(path)
    assert len(text) == 1115394 and len(set(text)) == 65
    assert text.startswith("First Citizen:\n")


# ------------------------------------------------------------------------------- TED/TFDS
def test_ted_hrlr_rejects_bad_split_and_pair():
    with pytest.raises(ValueError, match="'dev'"):
        load_ted_hrlr("dev")
    with pytest.raises(ValueError, match="'pt-en'"):
        load_ted_hrlr("train", pair="pt-en")


def test_ted_hrlr_with_tfds(monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    import tensorflow as tf

    calls = []

    def fake_load(name, split, data_dir=None, as_supervised=False):
        calls.append((name, split, as_supervised))
        return tf.data.Dataset.from_tensor_slices((["olá mundo ", "", "bom dia"],
                                                   ["hello world", "x", " good day"]))

    monkeypatch.setattr(tfds, "load", fake_load)
    assert load_ted_hrlr("test", "pt_to_en") == (["olá mundo", "bom dia"],
                                                 ["hello world", "good day"])
    assert calls == [("ted_hrlr_translate/pt_to_en", "test", True)]


# ---------------------------------------------------------------------------- tiny Shakespeare
def test_tiny_shakespeare_is_downloaded_checked_and_kept(tmp_path, monkeypatch):
    """``tinyshakespeare/input.txt`` missing from the data directory is fetched from
    char-rnn's pinned commit (served here from the shared copy), checked and kept; a
    corrupt download writes nothing."""
    shared = SHARED / corpora.TINY_SHAKESPEARE
    if not shared.is_file():
        pytest.skip(f"shared data not found at {SHARED}")
    urls = []

    def opener(url, timeout=None):
        urls.append(url)
        return io.BytesIO(shared.read_bytes())

    monkeypatch.setattr(corpora, "_urlopen", opener)
    path = corpora.known_text(corpora.TINY_SHAKESPEARE, data_dir=tmp_path)
    assert path == tmp_path / "tinyshakespeare" / "input.txt"
    assert path.read_bytes() == shared.read_bytes()
    assert urls == ["https://raw.githubusercontent.com/karpathy/char-rnn/"
                    "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare/input.txt"]
    corpora.known_text(corpora.TINY_SHAKESPEARE, data_dir=tmp_path)  # kept: no second fetch
    assert len(urls) == 1

    monkeypatch.setattr(corpora, "_urlopen",
                        lambda url, timeout=None: io.BytesIO(shared.read_bytes()[:-1]))
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        corpora.known_text(corpora.TINY_SHAKESPEARE, data_dir=tmp_path / "other")
    assert not (tmp_path / "other" / "tinyshakespeare" / "input.txt").exists()
    with pytest.raises(FileNotFoundError, match="tinyshakespeare/input.txt"):
        corpora.known_text(corpora.TINY_SHAKESPEARE, data_dir=tmp_path / "none",
                           download=False)
