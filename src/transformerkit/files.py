"""Atomic file writes: a crash never leaves a half-written file under the final name."""

import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; on success it is fsynced and renamed onto
    ``path`` (``os.replace`` is atomic on POSIX), on error it is removed."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = os.path.splitext(path)[1]  # keep the extension: Keras checks ".keras"
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
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
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
