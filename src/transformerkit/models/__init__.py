"""The three models: encoder-decoder ``Transformer``, ``Encoder`` and ``GPT``.

The names are resolved on first use, so that :mod:`transformerkit.models.options` (plain
Python: the config schema reads it) can be imported without importing Keras. The first use
imports all three, which registers them for ``keras.saving.load_model`` as before.
"""

import importlib

_EXPORTS = {"Encoder": "encoder", "GPT": "gpt", "Transformer": "transformer"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        modules = {m: importlib.import_module(f"{__name__}.{m}") for m in _EXPORTS.values()}
        return getattr(modules[_EXPORTS[name]], name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
