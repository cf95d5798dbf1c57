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


# The kernel caches a long-lived server bounds (:func:`bound_kernel_caches`): oneDNN's
# primitive cache and ideep's (PyTorch's oneDNN layer) cache of its matmul setups.
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
SERVER_KERNEL_CACHE = 64


def bound_kernel_caches(capacity=SERVER_KERNEL_CACHE):
    """Keep at most ``capacity`` entries in oneDNN's and ideep's per-shape kernel caches
    (default 1,024 each); returns the variables set.

    Each distinct input shape of a product adds an entry that keeps its own buffers. A
    server sees ever new shapes (batch rows times beam, source lengths, steps), so with
    the default capacities its memory grows for as long as it runs (a Multi30k model
    translating random batches in one process: +310 MiB over 150 calls, still rising;
    bounded at 64: +113 MiB, nearly flat after the first 75). Both libraries read the variables
    when they first build a kernel, so this works after ``import torch`` but not after the
    first product. A value the user set is kept. ``transformerkit serve`` calls it; nothing
    calls it on import.
    """
    changed = []
    for name in KERNEL_CACHE_VARIABLES:
        if name not in os.environ:
            os.environ[name] = str(int(capacity))
            changed.append(name)
    return changed
