"""The compiled packages' cache kept under its size (:mod:`transformerkit.decoding.aot_packages`):
after a build the least recently used packages go (a load marks one used), each with its
extracted library, never one the process uses, and nothing that is not a package; the limit
comes from ``$TRANSFORMERKIT_COMPILED_CACHE_GB`` and a bad value is a clear error."""

import os
import time

import keras
import pytest

from transformerkit.decoding import aot_packages

DIGESTS = ["a" * 32, "b" * 32, "c" * 32, "d" * 32]


def _package(folder, kind, digest, size, used, library=True):
    """A fake package ``KIND-DIGEST.pt2`` of ``size`` bytes (and its extracted library of as
    many), last used ``used`` seconds ago; their paths."""
    paths = [folder / f"{kind}-{digest}.pt2"]
    if library:
        paths.append(folder / f"{kind}-{digest}-0123abcd.so")
    for path in paths:
        path.write_bytes(b"\0" * size)
        os.utime(path, (time.time() - used,) * 2)
    return paths


def test_pruning_removes_the_least_recently_used_packages_first(tmp_path, capfd):
    """Over the limit, whole packages (archive and library) go oldest use first until the
    folder is under it; a package this process loaded stays however old; other files,
    folders, names that only look like packages and a fresh temporary file stay; a build's
    temporary file a day old goes."""
    oldest = _package(tmp_path, "step", DIGESTS[0], 1000, used=4000)
    in_use = _package(tmp_path, "encoder", DIGESTS[1], 1000, used=3000)
    older = _package(tmp_path, "search", DIGESTS[2], 1000, used=2000, library=False)
    newest = _package(tmp_path, "step", DIGESTS[3], 1000, used=10)
    others = [tmp_path / "notes.txt", tmp_path / "step-not-a-digest.pt2",
              tmp_path / f"model-{DIGESTS[0]}.pt2", tmp_path / "tmpfresh1.pt2"]
    for path in others:
        path.write_bytes(b"\0" * 5000)
        os.utime(path, (time.time() - 9000,) * 2)
    os.utime(others[-1])  # a build under way in another process
    stale = tmp_path / "tmpkilled_2.so"
    stale.write_bytes(b"\0" * 10)
    os.utime(stale, (time.time() - 2 * 86400,) * 2)
    (tmp_path / "files").mkdir()
    aot_packages._IN_USE.add(os.path.abspath(in_use[0]))
    try:
        removed = aot_packages.prune(str(tmp_path), limit=4000)
    finally:
        aot_packages._IN_USE.discard(os.path.abspath(in_use[0]))
    # 7000 package bytes: without the oldest (2000) and the next not in use (1000), 4000
    assert sorted(removed) == sorted(map(str, oldest + older + [stale]))
    assert not any(p.exists() for p in oldest + older + [stale])
    assert all(p.exists() for p in in_use + newest + others)
    assert (tmp_path / "files").is_dir()
    err = capfd.readouterr().err
    assert "removed 2 compiled package(s)" in err and aot_packages.CACHE_LIMIT_VARIABLE in err

    assert aot_packages.prune(str(tmp_path), limit=None) == []  # no limit: nothing to do
    assert aot_packages.prune(str(tmp_path), limit=10 ** 6) == []  # under the limit
    assert aot_packages.prune(str(tmp_path / "missing"), limit=1) == []


def test_the_limit_is_read_from_the_environment(monkeypatch):
    """Gigabytes, default 20; 0 is no limit; anything but a number >= 0 names the variable."""
    name = aot_packages.CACHE_LIMIT_VARIABLE
    monkeypatch.delenv(name, raising=False)
    assert aot_packages.cache_limit_bytes() == 20 * 10 ** 9
    for text, expected in (("1.5", 1_500_000_000), (" 2 ", 2 * 10 ** 9), ("0", None),
                           ("", 20 * 10 ** 9)):
        monkeypatch.setenv(name, text)
        assert aot_packages.cache_limit_bytes() == expected
    for text in ("lots", "-1", "inf", "nan", "1GB"):
        monkeypatch.setenv(name, text)
        with pytest.raises(ValueError, match=name):
            aot_packages.cache_limit_bytes()


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="the compiled engine is PyTorch's (AOTInductor)")
def test_a_build_prunes_the_cache_but_not_what_the_process_uses(tmp_path, monkeypatch, capfd):
    """A real package built through ``load_or_build`` in a folder over its limit: the
    package runs, an old package not used here is removed, one this process loaded earlier
    stays (its use was marked when it loaded); a bad limit stops a load or a build before
    anything is built, with the variable named."""
    import torch

    from transformerkit import internals

    if internals.get("aoti_compile_and_package") is None:
        pytest.skip("this PyTorch has no AOTInductor")

    class Double(torch.nn.Module):
        def forward(self, rows):
            return (rows * 2.0,)

    def build(path):
        with torch.no_grad():
            program = torch.export.export(Double().eval(), (torch.randn(3, 4),))
        aot_packages.compile_program(program, path)

    loaded = str(tmp_path / f"search-{DIGESTS[1]}.pt2")
    build(loaded)
    assert aot_packages.load(loaded)([torch.ones(3, 4)])[0].sum() == 24
    built_at = os.stat(loaded).st_mtime_ns
    os.utime(loaded, ns=(0, built_at))
    assert aot_packages.load(loaded)([torch.ones(3, 4)])[0].sum() == 24
    assert time.time() - os.stat(loaded).st_atime < 60  # loading marked it used
    assert os.stat(loaded).st_mtime_ns == built_at  # the build's time kept
    os.utime(loaded, (time.time() - 5000,) * 2)  # and yet older than the unused one below
    unused = _package(tmp_path, "step", DIGESTS[0], 10_000, used=4000)

    monkeypatch.setenv(aot_packages.CACHE_LIMIT_VARIABLE, "1e-9")  # 1 byte
    built = []
    path = str(tmp_path / f"step-{DIGESTS[2]}.pt2")

    def counted(path):
        built.append(path)
        build(path)

    run = aot_packages.load_or_build(path, counted, "the test package", "a product",
                                     "running eagerly")
    assert built == [path] and run([torch.ones(3, 4)])[0].sum() == 24
    assert not any(p.exists() for p in unused)
    assert os.path.exists(loaded) and os.path.exists(path)
    assert "removed 1 compiled package(s)" in capfd.readouterr().err

    monkeypatch.setenv(aot_packages.CACHE_LIMIT_VARIABLE, "twenty")
    other = str(tmp_path / f"step-{DIGESTS[3]}.pt2")
    with pytest.raises(ValueError, match=aot_packages.CACHE_LIMIT_VARIABLE):
        aot_packages.load_or_build(other, counted, "the test package", "a product",
                                   "running eagerly")
    with pytest.raises(ValueError, match=aot_packages.CACHE_LIMIT_VARIABLE):
        aot_packages.load(path)
    assert built == [path] and not os.path.exists(other)
