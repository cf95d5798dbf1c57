"""transformerkit: the Transformer of "Attention Is All You Need" on Keras 3.

``import transformerkit`` does not import Keras, so the backend can still be chosen
(``KERAS_BACKEND``, the CLI's ``--backend``) until something needs Keras; when none is
chosen, the fastest installed one on a CPU is named for Keras (:mod:`transformerkit.backend`).
``transformerkit.load(run_dir)`` (see :mod:`transformerkit.api`) is resolved lazily.

:func:`keep_freed_memory` is the one process-wide setting the library offers: it makes the
C allocator keep large freed blocks for reuse (:mod:`transformerkit.allocator`), which
speeds up training and decoding on CPU. The CLI's training and decoding commands apply it;
from Python, call it yourself.
"""

from transformerkit.allocator import keep_freed_memory
from transformerkit.backend import choose_default_backend

choose_default_backend()

__version__ = "0.1.0"
__all__ = ["Run", "keep_freed_memory", "load"]


def __getattr__(name):
    if name in ("load", "Run"):
        from transformerkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'transformerkit' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), "load", "Run"])
