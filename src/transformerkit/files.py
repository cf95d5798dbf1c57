"""File helpers every module shares: atomic writes and the sha256 of a file.

An atomic write goes to a temporary file next to the target, is fsynced and renamed onto
it, so a crash never leaves a half-written file under the final name.

:func:`remembered_sha256` reads a large file (a model's weights, whose digest names its
compiled packages and CTranslate2 export) once per version of it: the digest is kept in
the user's cache under the file's identity, as git's index and ccache keep theirs.
"""

import contextlib
import glob
import hashlib
import json
import os
import tempfile
import time

TEMPORARY_PREFIX = ".tmp-"  # names of the temporary files of :func:`atomic_path`
# a file changed less than this long ago is hashed but its digest not remembered: file
# times are kept at the kernel's clock tick, so a second write within that tick could
# leave the same times (git's "racily clean" entries)
RACY_SECONDS = 2.0


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; on success it is fsynced and renamed onto
    ``path`` (``os.replace`` is atomic on POSIX), on error it is removed."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = os.path.splitext(path)[1]  # keep the extension: Keras checks ".keras"
    fd, tmp = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, suffix=suffix, dir=directory)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def atomic_write_text(path, text):
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def remove_temporaries(directory):
    """Remove the temporary files a killed :func:`atomic_path` left in ``directory``."""
    for stale in glob.glob(os.path.join(glob.escape(os.fspath(directory)),
                                        TEMPORARY_PREFIX + "*")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(stale)


def file_sha256(path):
    """sha256 hex digest of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def user_cache_directory(*parts):
    """The user's cache folder for transformerkit joined with ``parts`` (``"compiled"``,
    ``"digests"``, ``"token-cache"``): ``$TRANSFORMERKIT_CACHE``, else
    ``$XDG_CACHE_HOME/transformerkit``, else ``~/.cache/transformerkit``."""
    root = os.environ.get("TRANSFORMERKIT_CACHE") or os.path.join(xdg_cache_home(),
                                                                   "transformerkit")
    return os.path.join(os.path.expanduser(root), *parts)


def xdg_cache_home():
    """The user's cache root: ``$XDG_CACHE_HOME``, else ``~/.cache`` (expanded)."""
    return os.path.expanduser(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"))


def remembered_sha256(path, directory=None):
    """The sha256 hex digest of the file at ``path`` (:func:`file_sha256`), read once per
    version of the file: the digest is remembered in ``directory`` (default
    :func:`user_cache_directory` ``("digests")``) with the file's identity, its device,
    inode, size and modification and change times in nanoseconds, and given again while
    all of them are the same. Writing a file changes its change time, which no user call
    can set back, so a changed file is always read again. A file changed within
    :data:`RACY_SECONDS` is hashed every time until it is older. Where the memo cannot
    be read or written (a read-only cache), the file is hashed."""
    path = os.path.abspath(os.fspath(path))
    directory = directory or user_cache_directory("digests")
    memo = os.path.join(directory,
                        hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:32]
                        + ".json")
    identity = _identity(os.stat(path))
    try:
        with open(memo, encoding="utf-8") as f:
            found = json.load(f)
        if found.get("path") == path and found.get("identity") == identity \
                and isinstance(found.get("sha256"), str):
            return found["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = file_sha256(path)
    unchanged = _identity(os.stat(path)) == identity  # not rewritten while it was read
    if unchanged and time.time() - identity[4] / 1e9 >= RACY_SECONDS:
        with contextlib.suppress(OSError):
            os.makedirs(directory, exist_ok=True)
            atomic_write_text(memo, json.dumps({"path": path, "identity": identity,
                                                "sha256": digest}))
    return digest


def _identity(stat):
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
