"""One decoding step of each model kind, with the key/value cache or by recomputation.

The search loops (:mod:`.search`) see a model through two methods:

- ``start(...) -> (state, static)``: everything computed once per batch. With the cache
  that is the encoder output's cross-attention keys/values (once per source, paper
  section 3.2.3) and empty self-attention caches; ``state`` is what changes every step.
- ``step(buffer, index, state, static) -> (logits, state)``: the logits ``(rows, vocab)``
  that predict position ``index + 1`` from ``buffer[:, :index + 1]``, where ``buffer``
  ``(rows, width)`` holds the decoder input so far (BOS, or the prompt, then the tokens
  chosen). With the cache only ``buffer[:, index]`` is fed (one new position per step);
  without it the whole prefix is run again (the baseline of ``bench/decode.py``).

State is a list of per-layer self-attention ``(keys, values)``, each
``(rows, max_len, heads, dim)``; beam search reorders its rows with ``reorder``.
:func:`make_steps` picks the adapter: on PyTorch the cached step runs as plain torch ops
(:mod:`.torch_step`, the eager loop's fast path), elsewhere through the model's Keras
cache API (``Transformer.decode`` / ``GPT.__call__`` with ``caches``).
"""

from keras import ops

from transformerkit.decoding.compiled import is_eager_loop
from transformerkit.layers.masks import padding_mask


def token_at(buffer, index):
    """``buffer[:, index:index + 1]`` for an int or scalar-tensor ``index``."""
    rows = buffer.shape[0]
    return ops.slice(buffer, [0, index], [rows, 1])


CACHE_MODES = (True, "keras", False)


def make_steps(model, use_cache=True):
    """The step adapter for ``model`` (a ``Transformer`` or a ``GPT``).

    ``use_cache``: True = the fastest cached step for this backend; ``"keras"`` = the
    model's own Keras cache path on every backend; False = recompute the whole prefix.
    """
    if use_cache not in CACHE_MODES:
        raise ValueError(f"use_cache must be True, 'keras' or False; got {use_cache!r}")
    if use_cache is True and is_eager_loop():
        from transformerkit.decoding import torch_step

        if torch_step.supported(model):
            return torch_step.TorchSteps(model)
    adapter = Seq2SeqSteps if hasattr(model, "decoder_blocks") else LanguageModelSteps
    return adapter(model, bool(use_cache))


class _KerasSteps:
    def __init__(self, model, use_cache=True):
        self.model = model
        self.use_cache = use_cache
        self.vocab_size = getattr(model, "target_vocab_size", None) or model.vocab_size

    def reorder(self, state, rows, filled):
        """Self-attention caches with their rows taken from ``rows`` (beam search)."""
        return [(ops.take(k, rows, axis=0), ops.take(v, rows, axis=0)) for k, v in state]


def _repeat(x, copies):
    return x if copies == 1 else ops.repeat(x, copies, axis=0)


def _prefix_logits(logits, index):
    """Logits at ``index`` of ``(rows, length, vocab)``."""
    if isinstance(index, int):
        return logits[:, index, :]
    return ops.squeeze(ops.slice(logits, [0, index, 0], [logits.shape[0], 1, logits.shape[2]]),
                       1)


def _prefix(buffer, index, width):
    """Decoder input for recomputation: the exact prefix in eager loops, else a fixed
    ``width`` (later positions are masked by causality, so their content does not matter)."""
    if isinstance(index, int) and is_eager_loop():
        return buffer[:, : index + 1]
    return buffer[:, :width]


class Seq2SeqSteps(_KerasSteps):
    """Steps of a :class:`~transformerkit.models.Transformer` (encoder-decoder)."""

    def start(self, source_ids, max_len, copies=1):
        """Encode ``(batch, source_len)`` ids once; ``copies`` rows per sentence (beams)."""
        memory = self.model.encode(source_ids)
        source_mask = padding_mask(source_ids)
        if not self.use_cache:
            return [], (_repeat(memory, copies), _repeat(source_mask, copies), max_len)
        caches = self.model.init_caches(memory, max_len)
        state = [tuple(_repeat(t, copies) for t in c["self"]) for c in caches]
        cross = [tuple(_repeat(t, copies) for t in c["cross"]) for c in caches]
        return state, (cross, _repeat(source_mask, copies), max_len)

    def step(self, buffer, index, state, static):
        context, source_mask, max_len = static
        if not self.use_cache:
            prefix = _prefix(buffer, index, max_len)
            logits = self.model.decode(prefix, context, source_mask)
            return _prefix_logits(logits, index), state
        caches = [{"self": s, "cross": c} for s, c in zip(state, context, strict=True)]
        logits, caches = self.model.decode(token_at(buffer, index), None, source_mask,
                                           caches=caches, cache_index=index)
        return logits[:, -1, :], [c["self"] for c in caches]


class LanguageModelSteps(_KerasSteps):
    """Steps of a :class:`~transformerkit.models.GPT` (decoder only)."""

    def start(self, buffer, prefill, max_len):
        """Empty caches for ``max_len`` positions, with ``buffer[:, :prefill]`` (prompt
        positions every row has) run in one call."""
        if not self.use_cache:
            return [], max_len
        caches = self.model.init_caches(buffer.shape[0], max_len)
        if prefill > 0:
            _, caches = self.model(buffer[:, :prefill], caches=caches, cache_index=0)
        return [c["self"] for c in caches], max_len

    def step(self, buffer, index, state, static):
        max_len = static
        if not self.use_cache:
            logits = self.model(_prefix(buffer, index, max_len))
            return _prefix_logits(logits, index), state
        caches = [{"self": s, "cross": None} for s in state]
        logits, caches = self.model(token_at(buffer, index), caches=caches, cache_index=index)
        return logits[:, -1, :], [c["self"] for c in caches]
