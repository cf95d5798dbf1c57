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

State is a list of per-layer self-attention ``(keys, values)``; beam search reorders its
rows with ``reorder``. The eager (PyTorch) loops also drop the rows of finished sentences:
``reorder`` with fewer rows shrinks the caches, and ``select_sources(static, rows)`` keeps the
encoder memory of the sentences those rows belong to.

:func:`make_steps` picks the adapter: the model's Keras cache API (``Transformer.decode`` /
``GPT.__call__`` with ``caches``, caches ``(rows, max_len, heads, dim)``) on every backend,
or, where the PyTorch shortcuts apply (:mod:`transformerkit.fastpath`),
:class:`EagerSteps`: the models' own one-position
``decode_step`` (the fast twin of their cached ``call``, beside it in ``models/base.py``
and ``layers/``) over position-major caches ``(max_len, rows, heads, dim)``.
"""

from keras import ops

from transformerkit import fastpath
from transformerkit.decoding.compiled import is_eager_loop
from transformerkit.layers.masks import padding_mask


def token_at(buffer, index):
    """``buffer[:, index:index + 1]`` for an int or scalar-tensor ``index``."""
    rows = buffer.shape[0]
    return ops.slice(buffer, [0, index], [rows, 1])


CACHE_MODES = (True, "keras", False)


def make_steps(model, use_cache=True, precision="float32"):
    """The step adapter for ``model`` (a ``Transformer`` or a ``GPT``).

    ``use_cache``: True = the fastest cached step for this backend; ``"keras"`` = the
    model's own Keras cache path on every backend; False = recompute the whole prefix (the
    last two are the references the cached step is tested against).
    ``precision``: the products' precision (``float32``, ``bfloat16``, ``int8`` or ``auto``:
    :func:`transformerkit.kernels.lowprec.resolve`), carried by the step's weights; other
    than float32 only for :class:`EagerSteps`, else a clear ``ValueError``.
    """
    from transformerkit.kernels.lowprec import resolve

    if use_cache not in CACHE_MODES:
        raise ValueError(f"use_cache must be True, 'keras' or False; got {use_cache!r}")
    precision = resolve(precision)[0]
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


class EagerSteps:
    """Steps through the models' ``decode_step`` on eager PyTorch (see the module docstring).

    The caches are position-major, ``(max_len, rows, heads, dim)``, written in place one
    position at a time: the filled prefix is one contiguous block, so beam search reorders
    its rows with one ``index_select`` into a fresh buffer. Weights are read once per batch
    (:meth:`start`), so decoding during training follows the weights.
    """

    def __init__(self, model, precision="float32"):
        self.model = model
        self.precision = precision  # resolved: float32, bfloat16 or int8
        self.seq2seq = hasattr(model, "decoder_blocks")
        self.vocab_size = model.target_vocab_size if self.seq2seq else model.vocab_size

    @staticmethod
    def supports(model):
        """Float32 weights and compute (no autocast to emulate) and the shortcuts on."""
        policy = model.dtype_policy
        return (fastpath.applies() and policy.compute_dtype == "float32"
                and policy.variable_dtype == "float32")

    def _empty_caches(self, rows, max_len, like):
        """One unfilled ``(keys, values)`` pair per block, with ``like``'s dtype and device:
        a step writes position ``index`` before it reads positions ``0..index``, and
        :meth:`reorder` copies the filled positions only, so nothing reads a position before
        it is written (zero-filling a beam search's caches would cost a pass over them)."""
        m = self.model
        layers = m.num_decoder_layers if self.seq2seq else m.num_layers
        return [(like.new_empty((max_len, rows, m.num_heads, m.key_dim)),
                 like.new_empty((max_len, rows, m.num_heads, m.value_dim)))
                for _ in range(layers)]

    def start(self, *args, **kwargs):
        if self.seq2seq:
            return self._start_seq2seq(*args, **kwargs)
        return self._start_language_model(*args, **kwargs)

    def _start_seq2seq(self, source_ids, max_len, copies=1):
        weights = self.model.step_weights(self.precision)
        memory = self.model.inference_encode(source_ids, weights)  # (batch, source_len, d)
        memories = self.model.decode_step_memory(memory, padding_mask(source_ids), weights)
        state = self._empty_caches(memory.shape[0] * copies, max_len, memory)
        return state, (weights, memories, copies)

    def _start_language_model(self, buffer, prefill, max_len):
        import torch

        weights = self.model.step_weights(self.precision)
        buffer = torch.as_tensor(buffer, device=weights["embedding"].device)
        state = self._empty_caches(buffer.shape[0], max_len, weights["embedding"])
        # the shared prompt prefix in one Keras call (float32 products), copied into the caches
        if prefill > 0:
            caches = self.model.init_caches(buffer.shape[0], prefill)
            _, caches = self.model(buffer[:, :prefill], caches=caches, cache_index=0)
            for (k, v), cache in zip(state, caches, strict=True):  # Keras: (rows, len, h, d)
                k[:prefill] = cache["self"][0][:, :prefill].transpose(0, 1)
                v[:prefill] = cache["self"][1][:, :prefill].transpose(0, 1)
        return state, (weights, None, 1)

    def step(self, buffer, index, state, static):
        """Logits ``(rows, vocab)`` for position ``index + 1``; ``state`` updated in place."""
        import torch

        weights, memories, copies = static
        tokens = torch.as_tensor(buffer)[:, index].long()
        return self.model.decode_step(tokens, index, state, weights, memories, copies), state

    def first_step_of_copies(self, buffer, state, static):
        """:meth:`step` at position 0 when the ``copies`` adjacent rows of every sentence
        hold the same first token (beam search starts every beam with BOS): computed for the
        first row of each sentence only, then its logits and cache position copied to the
        other rows, as CTranslate2 starts a beam search. Returns ``(logits (rows, vocab),
        state)``, the same as :meth:`step` would."""
        import torch

        weights, memories, copies = static
        tokens = torch.as_tensor(buffer)[::copies, 0].long()  # (sentences,)
        first = [tuple(t.new_empty((1, tokens.shape[0]) + tuple(t.shape[2:])) for t in pair)
                 for pair in state]  # position 0 of one row per sentence
        logits = self.model.decode_step(tokens, 0, first, weights, memories, 1)
        for pair, first_pair in zip(state, first, strict=True):
            for t, t_first in zip(pair, first_pair, strict=True):
                t[0] = t_first[0].repeat_interleave(copies, 0)
        return logits.repeat_interleave(copies, 0), state

    def reorder(self, state, rows, filled):
        """Beam search: caches whose rows are taken from ``rows`` (fewer rows than now drop
        finished sentences); only the filled positions are copied (the rest of the new
        buffers is written before it is read). The select runs on row-major views ``(rows,
        filled, h, d)``: PyTorch's row gather along the first axis is faster than along the
        second."""
        import torch

        rows = torch.as_tensor(rows).long()
        reordered = []
        for cache in state:
            pair = []
            for t in cache:
                new = t.new_empty((t.shape[0], rows.shape[0]) + tuple(t.shape[2:]))
                torch.index_select(t[:filled].transpose(0, 1), 0, rows,
                                   out=new[:filled].transpose(0, 1))
                pair.append(new)
            reordered.append(tuple(pair))
        return reordered

    def select_sources(self, static, rows):
        """Keep the cross-attention memory (one copy per sentence) of the sentences of
        ``rows``: every ``copies``-th row names one."""
        import torch

        weights, memories, copies = static
        if memories is None:
            return static
        rows = torch.as_tensor(rows).long()
        sentences = rows[::copies] // copies
        memories = [tuple(None if t is None else t.index_select(0, sentences) for t in memory)
                    for memory in memories]
        return weights, memories, copies
