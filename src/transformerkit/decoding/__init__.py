"""Decoding with the key/value cache: greedy, beam search, sampling; compiled loops.

- :class:`SearchOptions`, :class:`GenerationOptions` (``decoding/options.py``): every search
  and sampling option, declared once.
- :func:`greedy_translate`, :func:`beam_translate`, :func:`sample_translate`: a
  ``Transformer`` on a batch of source ids.
- :func:`generate_ids`, :func:`generate_text`: a ``GPT`` continuing prompts;
  :mod:`.streaming`: one prompt's continuation piece by piece while it is made.
- :func:`translate_texts`, :func:`translate_batches`: text in, text out.
- :func:`sequence_log_probs`: the model's log-probability of given outputs.

The names are resolved on first use, so that ``transformerkit.decoding.options`` (plain
Python) can be imported, e.g. to build the command line, without importing Keras.
"""

import importlib

_EXPORTS = {
    "GenerationOptions": "options", "SearchOptions": "options",
    "Hypothesis": "beam", "beam_translate": "beam",
    "greedy_translate": "greedy",
    "generate_ids": "sampling", "generate_text": "sampling", "sample_translate": "sampling",
    "sequence_log_probs": "scoring",
    "translate_batches": "translate", "translate_texts": "translate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
