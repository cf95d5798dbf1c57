"""The cached decoding step of eager PyTorch: the models' own one-position ``decode_step``
over position-major caches (see :mod:`.steps` for the adapters' interface)."""

from transformerkit import fastpath


def source_memories(model, source_ids, weights):
    """The encoder pass of a batch and every decoder block's cross-attention keys and values
    of its output (``model.decode_step_memory``): ``(batch, source_len)`` ids -> one
    ``(keys, values, bias, keep)`` per block, what :meth:`EagerSteps.step` attends over.
    The compiled engine captures this function too (:mod:`.aot_step`)."""
    from transformerkit.layers.masks import padding_mask

    memory = model.inference_encode(source_ids, weights)  # (batch, source_len, d_model)
    return model.decode_step_memory(memory, padding_mask(source_ids), weights)


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
        memories = source_memories(self.model, source_ids, weights)
        state = self._empty_caches(memories[0][0].shape[0] * copies, max_len, memories[0][2])
        return state, (weights, memories, copies)

    def _start_language_model(self, buffer, prefill, max_len):
        import torch

        weights = self.model.step_weights(self.precision)
        buffer = torch.as_tensor(buffer, device=weights["embedding"].device)
        state = self._empty_caches(buffer.shape[0], max_len, weights["embedding"])
        # the shared prompt prefix in one pass at the step's precision, written into the
        # caches; its logits are not needed (the steps from ``prefill`` on give the next ones)
        if prefill > 0:
            self.model.decode_prefill(buffer[:, :prefill].long(), state, weights)
        return state, (weights, None, 1)

    def step(self, buffer, index, state, static):
        """Logits ``(rows, vocab)`` for position ``index + 1``; ``state`` updated in place."""
        import torch

        tokens = torch.as_tensor(buffer)[:, index].long()
        return self._decode(tokens, index, state, static), state

    def _decode(self, tokens, index, caches, static):
        """The model's ``decode_step`` of ``tokens`` ``(rows,)`` at position ``index``:
        logits ``(rows, vocab)``, ``caches`` written in place."""
        weights, memories, copies = static
        return self.model.decode_step(tokens, index, caches, weights, memories, copies)

    def first_step_of_copies(self, buffer, state, static):
        """:meth:`step` at position 0 when the ``copies`` adjacent rows of every sentence
        hold the same first token (beam search starts every beam with BOS): computed for the
        first row of each sentence only, then its logits and cache position copied to the
        other rows, as CTranslate2 starts a beam search. Returns ``(logits (rows, vocab),
        state)``, the same as :meth:`step` would."""
        import torch

        weights, memories, copies = static
        tokens = torch.as_tensor(buffer)[::copies, 0].long()  # (sentences,)
        # position 0 of one row per sentence (2 positions: the compiled step's least)
        first = [tuple(t.new_empty((2, tokens.shape[0]) + tuple(t.shape[2:])) for t in pair)
                 for pair in state]
        logits = self._decode(tokens, 0, first, (weights, memories, 1))
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
