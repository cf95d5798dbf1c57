"""transformerkit: the Transformer of "Attention Is All You Need" on Keras 3.

``import transformerkit`` does not import Keras: the backend can still be chosen
(``KERAS_BACKEND``, the CLI's ``--backend``) until something needs Keras.
``transformerkit.load(run_dir)`` (see :mod:`transformerkit.api`) is resolved lazily.
Importing it also tunes glibc ``malloc`` for large tensors (:mod:`transformerkit.allocator`).
"""

from transformerkit.allocator import keep_freed_memory
from transformerkit.backend import choose_default_backend

choose_default_backend()
keep_freed_memory()

__version__ = "0.1.0"


def __getattr__(name):
    if name in ("load", "Run"):
        from transformerkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'transformerkit' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), "load", "Run"])
