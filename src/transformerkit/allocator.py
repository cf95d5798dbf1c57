"""Keep freed memory in the process: large tensors are reused instead of page-faulted.

glibc's ``malloc`` serves every block above 32 MiB with a fresh ``mmap`` and gives it back
to the kernel on ``free``. A training step allocates and frees tensors of that size all the
time (the ``(batch, length, vocabulary)`` logits are 100-600 MB), so each one is faulted
in page by page again, and the page faults cost several times the element-wise arithmetic
on them. Turning the ``mmap`` path off (``M_MMAP_MAX = 0``) and
never trimming the heap makes freed blocks reusable; memory is reused, not grown.

It changes the whole process (a long-lived server that imports the library would keep
its peak memory), so nothing applies it on import: the CLI's ``train``, ``translate``,
``generate`` and ``evaluate`` commands call :func:`keep_freed_memory`, and Python users
call ``transformerkit.keep_freed_memory()`` themselves. ``bench/train_step.py`` measures
the effect. ``TRANSFORMERKIT_MALLOC=system`` keeps the C library's default.
"""

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def keep_freed_memory():
    """Configure glibc ``malloc`` as described above; return True when it was applied.

    A no-op (False) on other platforms or C libraries, or with
    ``TRANSFORMERKIT_MALLOC=system``.
    """
    if not sys.platform.startswith("linux") or os.environ.get("TRANSFORMERKIT_MALLOC") == "system":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
