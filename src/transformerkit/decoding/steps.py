"""One decoding step of each model kind, with the key/value cache or by recomputation.

The search loops (:mod:`.greedy`, :mod:`.beam`, :mod:`.sampling`) see a model through two methods:

- ``start(...) -> (state, static)``: everything computed once per batch. With the cache
  that is the encoder output's cross-attention keys/values (once per source, paper
  section 3.2.3) and empty self-attention caches; ``state`` is what changes every step.
- ``step(buffer, index, state, static) -> (logits, state)``: the logits ``(rows, vocab)``
  that predict position ``index + 1`` from ``buffer[:, :index + 1]``, where ``buffer``
  ``(rows, width)`` holds the decoder input so far (BOS, or the prompt, then the tokens
  chosen). With the cache only ``buffer[:, index]`` is fed (one new position per step);
  without it the whole prefix is run again (the baseline of ``bench/decode.py``).

State is a list of per-layer self-attention ``(keys, values)`` (the compiled engine's: those
and a table of where each row's positions are, :class:`~.aot_step.TabledCaches`); beam
search reorders its rows with ``reorder``. The eager (PyTorch) loops also drop the rows of
finished sentences: ``reorder`` with fewer rows shrinks the caches (the table), and
``select_sources(static, rows)`` keeps the encoder memory of the sentences those rows belong
to.

:func:`make_steps` picks the adapter: the model's Keras cache API (``Transformer.decode`` /
``GPT.__call__`` with ``caches``, caches ``(rows, max_len, heads, dim)``) on every backend,
or, where the PyTorch shortcuts apply (:mod:`transformerkit.fastpath`),
:class:`~.eager_steps.EagerSteps`: the models' own one-position
``decode_step`` (the fast twin of their cached ``call``, beside it in ``models/base.py``
and ``layers/``) over position-major caches ``(max_len, rows, heads, dim)``.
"""

import warnings

from transformerkit.backend import keras_ops as ops
from transformerkit.decoding.aot_files import PackagedModel, PackagedSteps
from transformerkit.decoding.aot_step import CompiledSteps
from transformerkit.decoding.compiled import is_eager_loop
from transformerkit.decoding.eager_steps import EagerSteps
from transformerkit.decoding.loop_ops import loop_ops

__all__ = ["CACHE_MODES", "CompiledSteps", "EagerSteps", "make_steps", "token_at"]


def token_at(buffer, index):
    """``buffer[:, index:index + 1]`` for an int or scalar-tensor ``index``."""
    rows = buffer.shape[0]
    return loop_ops().slice(buffer, [0, index], [rows, 1])


CACHE_MODES = (True, "compiled", "keras", False)


def make_steps(model, use_cache=True, precision="float32"):
    """The step adapter for ``model`` (a ``Transformer`` or a ``GPT``).

    ``use_cache``: True = the fastest cached step for this backend; ``"compiled"`` = the
    cached step compiled ahead of time (:class:`~.aot_step.CompiledSteps`, PyTorch; where
    it cannot run, True's with a warning; for a :class:`~.aot_files.PackagedModel`, the
    packages of its file); ``"keras"`` = the model's own Keras cache path on
    every backend; False = recompute the whole prefix (the last two are the references the
    cached steps are tested against).
    ``precision``: the products' precision (``float32``, ``bfloat16``, ``int8`` or ``auto``:
    :func:`transformerkit.kernels.lowprec.resolve`), carried by the step's weights; other
    than float32 only for :class:`EagerSteps` and (bfloat16) :class:`CompiledSteps`, else a
    clear ``ValueError``.
    """
    from transformerkit.kernels.lowprec import resolve

    if use_cache not in CACHE_MODES:
        raise ValueError(f"use_cache must be True, 'compiled', 'keras' or False; got "
                         f"{use_cache!r}")
    precision = resolve(precision)[0]
    if isinstance(model, PackagedModel):  # a model's compiled packages, the model unloaded
        if use_cache == "compiled":
            return PackagedSteps(model, precision)
        model = model.loaded()
    if use_cache == "compiled":
        if is_eager_loop() and EagerSteps.supports(model):
            return CompiledSteps(model, precision)
        warnings.warn("transformerkit: the compiled step runs on the PyTorch backend with "
                      "its fast paths and a float32 model; decoding with this backend's "
                      "cached step", RuntimeWarning, stacklevel=3)
        use_cache = True
    if use_cache is True and is_eager_loop() and EagerSteps.supports(model):
        return EagerSteps(model, precision)
    if precision != "float32":
        raise ValueError(f"precision {precision} runs on the cached PyTorch step only "
                         f"(use_cache=True, a float32 model); got use_cache={use_cache!r}")
    adapter = Seq2SeqSteps if hasattr(model, "decoder_blocks") else LanguageModelSteps
    return adapter(model, bool(use_cache))


class _KerasSteps:
    def __init__(self, model, use_cache=True):
        self.model = model
        self.use_cache = use_cache
        self.vocab_size = getattr(model, "target_vocab_size", None) or model.vocab_size

    def reorder(self, state, rows, filled):
        """Self-attention caches with their rows taken from ``rows`` (beam search; fewer
        rows drop finished sentences)."""
        return [(ops.take(k, rows, axis=0), ops.take(v, rows, axis=0)) for k, v in state]

    def select_sources(self, static, rows):
        """``static`` for the rows ``rows`` of the current ones (``copies`` adjacent rows per
        sentence: every row of a kept sentence, in order): drops finished sentences."""
        return static


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
        from transformerkit.layers.masks import padding_mask

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

    def select_sources(self, static, rows):
        context, source_mask, max_len = static  # every row holds its own copy here
        if self.use_cache:
            context = [tuple(ops.take(t, rows, axis=0) for t in pair) for pair in context]
        else:
            context = ops.take(context, rows, axis=0)
        return context, ops.take(source_mask, rows, axis=0), max_len


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
