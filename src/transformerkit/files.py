"""File helpers every module shares: atomic writes and the sha256 of a file.

An atomic write goes to a temporary file next to the target, is fsynced and renamed onto
it, so a crash never leaves a half-written file under the final name.
"""

import contextlib
import glob
import hashlib
import os
import tempfile

TEMPORARY_PREFIX = ".tmp-"  # names of the temporary files of :func:`atomic_path`


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


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
