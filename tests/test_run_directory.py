"""The run directory's layout (``transformerkit.run_directory``) and the shared file helpers
(``transformerkit.files``): names exactly as ``transformerkit train`` writes them."""

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

import transformerkit.files as files
from transformerkit.files import atomic_path, atomic_write_text, file_sha256, remove_temporaries
from transformerkit.run_directory import CheckpointDirectory, RunDirectory


def test_every_file_has_its_documented_name(tmp_path):
    run = RunDirectory(tmp_path)
    names = {
        run.config: "config.yaml", run.shared_tokenizer: "tokenizer.json",
        run.model: "model.keras", run.history: "history.csv", run.logs: "logs",
        run.metrics: "metrics.json", run.samples: "samples.txt",
        run.history_plot: "history.png", os.fspath(run.checkpoints): "checkpoints",
        run.checkpoints.best: os.path.join("checkpoints", "best.keras"),
        run.checkpoints.state: os.path.join("checkpoints", "latest.json"),
    }
    for path, name in names.items():
        assert path == os.path.join(str(tmp_path), name)
    assert run.checkpoints.file(run.checkpoints.epoch_name(3)) == \
        os.path.join(str(tmp_path), "checkpoints", "epoch-0003.keras")


def test_paths_and_strings_are_interchangeable(tmp_path):
    run = RunDirectory(tmp_path)
    assert os.fspath(run) == str(run) == str(tmp_path) == RunDirectory(str(tmp_path)).path
    assert str(run.checkpoints) == os.path.join(str(tmp_path), "checkpoints")
    assert CheckpointDirectory(run.checkpoints).path == run.checkpoints.path
    assert RunDirectory(run).path == run.path


def test_tokenizer_paths_shared_separate_and_read_from_the_directory(tmp_path):
    run = RunDirectory(tmp_path)
    shared = os.path.join(str(tmp_path), "tokenizer.json")
    separate = (os.path.join(str(tmp_path), "source_tokenizer.json"),
                os.path.join(str(tmp_path), "target_tokenizer.json"))
    assert run.tokenizer_paths(shared=True) == (shared, shared)
    assert run.tokenizer_paths(shared=False) == separate
    assert run.tokenizer_paths() == separate  # no tokenizer.json: two vocabularies
    (tmp_path / "tokenizer.json").write_text("{}")
    assert run.tokenizer_paths() == (shared, shared)


def test_model_file_for_model_best_and_an_explicit_path(tmp_path):
    run = RunDirectory(tmp_path / "run")
    assert run.model_file() == run.model_file("model") == run.model
    assert run.model_file("best") == run.checkpoints.best
    explicit = tmp_path / "elsewhere" / "epoch-0002.keras"
    assert run.model_file(explicit) == str(explicit)
    assert run.model_file("relative/file.keras") == "relative/file.keras"  # not in the run


def test_metrics_round_trip_atomically_with_the_same_format(tmp_path):
    run = RunDirectory(tmp_path / "run")
    with pytest.raises(FileNotFoundError):
        run.read_metrics()
    metrics = {"loss": 1.5, "val_bleu": 24.0, "evaluate": {"test2016": {"bleu": 30.1}}}
    run.write_metrics(metrics)
    assert run.read_metrics() == metrics
    assert open(run.metrics, encoding="utf-8").read() == json.dumps(metrics, indent=2)
    assert os.listdir(run.path) == ["metrics.json"]  # created, and no temporary file left


def test_checkpoint_directory_lists_epoch_files_oldest_first(tmp_path):
    checkpoints = CheckpointDirectory(tmp_path / "checkpoints")
    assert checkpoints.epoch_names() == [] and not checkpoints.has_checkpoint()
    os.makedirs(checkpoints)
    for name in ("epoch-0010.keras", "epoch-0002.keras", "best.keras", ".tmp-x.keras",
                 "epoch-3.keras.bak"):
        open(checkpoints.file(name), "w").close()
    assert checkpoints.epoch_names() == ["epoch-0002.keras", "epoch-0010.keras"]
    assert [checkpoints.epoch_of(n) for n in checkpoints.epoch_names()] == [2, 10]
    assert checkpoints.epoch_of("best.keras") is None
    assert checkpoints.has_checkpoint()
    only_state = CheckpointDirectory(tmp_path / "other")
    os.makedirs(only_state)
    open(only_state.state, "w").close()
    assert only_state.has_checkpoint()


def test_importing_the_layout_does_not_import_keras():
    code = ("import sys, transformerkit.run_directory, transformerkit.special_tokens; "
            "print('keras' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


# -- transformerkit.files -----------------------------------------------------------------------
def test_atomic_write_replaces_whole_files_and_cleans_up_on_error(tmp_path):
    path = tmp_path / "sub" / "file.txt"
    atomic_write_text(path, "first")
    atomic_write_text(path, "ünïcode")
    assert path.read_text(encoding="utf-8") == "ünïcode"
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        assert tmp.endswith(".txt") and os.path.dirname(tmp) == str(path.parent)
        open(tmp, "w").write("half")
        raise RuntimeError("crash while writing")
    assert path.read_text(encoding="utf-8") == "ünïcode"
    assert os.listdir(path.parent) == ["file.txt"]


def test_remove_temporaries_removes_only_what_atomic_path_leaves(tmp_path):
    for name in (".tmp-abc.keras", ".tmp-x", "epoch-0001.keras", "tmp-keep"):
        (tmp_path / name).write_text("x")
    remove_temporaries(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["epoch-0001.keras", "tmp-keep"]


def test_file_sha256_matches_hashlib(tmp_path):
    data = os.urandom(3 << 20) + b"tail"  # more than one read block
    (tmp_path / "blob").write_bytes(data)
    assert file_sha256(tmp_path / "blob") == hashlib.sha256(data).hexdigest()


@pytest.fixture
def counted_hashes(monkeypatch):
    """The paths :func:`files.file_sha256` reads, in order."""
    read = []
    real = files.file_sha256
    monkeypatch.setattr(files, "file_sha256", lambda path: read.append(path) or real(path))
    return read


def test_a_remembered_digest_is_read_once_per_version_of_the_file(tmp_path, monkeypatch,
                                                                 counted_hashes):
    """The digest is the file's; a second call answers from the memo; a rewrite of the same
    size with its modification time set back is read again (its change time moved)."""
    monkeypatch.setattr(files, "RACY_SECONDS", 0.0)
    blob, memos = tmp_path / "blob.keras", str(tmp_path / "memo")
    blob.write_bytes(b"a" * 4096)
    first = files.remembered_sha256(blob, memos)
    assert first == hashlib.sha256(b"a" * 4096).hexdigest()
    assert files.remembered_sha256(str(blob), memos) == first
    assert len(counted_hashes) == 1
    assert len(os.listdir(memos)) == 1

    before = os.stat(blob)
    time.sleep(0.05)  # past the kernel's clock tick
    blob.write_bytes(b"b" * 4096)
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(blob).st_size == before.st_size
    assert files.remembered_sha256(blob, memos) == hashlib.sha256(b"b" * 4096).hexdigest()
    assert len(counted_hashes) == 2
    assert files.remembered_sha256(blob, memos) == hashlib.sha256(b"b" * 4096).hexdigest()
    assert len(counted_hashes) == 2


def test_a_just_written_file_is_not_remembered(tmp_path, counted_hashes):
    """A file changed within RACY_SECONDS could change again within the same clock tick:
    it is read on every call, and nothing is remembered."""
    blob, memos = tmp_path / "blob", tmp_path / "memo"
    blob.write_bytes(b"x" * 100)
    digests = {files.remembered_sha256(blob, memos) for _ in range(2)}
    assert digests == {hashlib.sha256(b"x" * 100).hexdigest()}
    assert len(counted_hashes) == 2 and not memos.exists()


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"sha256": 5}', "\udcff"])
def test_a_damaged_or_unwritable_memo_is_hashed_again(tmp_path, monkeypatch, counted_hashes,
                                                       damage):
    monkeypatch.setattr(files, "RACY_SECONDS", 0.0)
    blob, memos = tmp_path / "blob", tmp_path / "memo"
    blob.write_bytes(b"y" * 100)
    expected = hashlib.sha256(b"y" * 100).hexdigest()
    assert files.remembered_sha256(blob, memos) == expected
    (memo,) = memos.iterdir()
    memo.write_bytes(damage.encode("utf-8", "surrogateescape"))
    assert files.remembered_sha256(blob, memos) == expected
    assert files.remembered_sha256(blob, memos) == expected  # the memo was written again
    assert len(counted_hashes) == 2
    unwritable = tmp_path / "a-file"
    unwritable.write_text("not a folder")
    assert files.remembered_sha256(blob, unwritable) == expected


def test_the_user_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    """``$TRANSFORMERKIT_CACHE`` first, then ``$XDG_CACHE_HOME/transformerkit``, then
    ``~/.cache/transformerkit``; the token cache, the compiled packages and the digest memo
    are folders of it."""
    from transformerkit.data import token_cache
    from transformerkit.decoding import aot_packages

    monkeypatch.delenv("TRANSFORMERKIT_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert files.user_cache_directory("digests") == str(
        tmp_path / "home" / ".cache" / "transformerkit" / "digests")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert token_cache.default_cache_root() == str(tmp_path / "xdg" / "transformerkit"
                                                   / "token-cache")
    monkeypatch.setenv("TRANSFORMERKIT_CACHE", str(tmp_path / "mine"))
    assert token_cache.default_cache_root() == str(tmp_path / "mine" / "token-cache")
    assert aot_packages.cache_directory() == str(tmp_path / "mine" / "compiled")
    monkeypatch.setenv("TRANSFORMERKIT_CACHE", "~/scratch")
    assert files.user_cache_directory() == str(tmp_path / "home" / "scratch")
