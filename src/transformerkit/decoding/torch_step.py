"""The incremental decoder step in plain PyTorch ops, for the eager loop on PyTorch.

Why this exists: on the PyTorch backend a decode loop runs eagerly, and one decoder step
of a small model is about 60 Keras layer calls; each ``Layer.__call__`` (argument binding,
masks, autocasting, name scopes) costs several times the arithmetic it wraps at
``(batch, 1, d_model)``. ``torch.compile`` cannot remove that overhead here (graph breaks
and recompiles inside Keras' call machinery). So this module runs the same math as
``DecoderBlock`` / ``MultiHeadAttention`` / ``Transformer.decode`` for ONE new position with
``torch`` functions on the layers' own weights (read at the start of every batch, so it
follows training). It also keeps the caches position-major, ``(max_len, rows, heads, dim)``,
written in place one position at a time, and attends over the filled prefix only (no causal
mask needed for one query). Position-major makes that prefix one contiguous block, so beam
search reorders its rows with a single ``index_select`` into a fresh buffer (no copy back).

It is used for float32 models on PyTorch when ``use_cache=True``; ``use_cache="keras"``
runs the model's own Keras cache path instead. ``tests/test_decoding.py`` checks that
both give the logits of a full forward pass at every step.
"""

import math

import torch
import torch.nn.functional as F


def supported(model):
    """Whether :class:`TorchSteps` can run ``model`` (float32 weights and compute)."""
    policy = model.dtype_policy
    return policy.compute_dtype == "float32" and policy.variable_dtype == "float32"


def _dense(layer):
    return layer.kernel.value, None if layer.bias is None else layer.bias.value


def _norm(layer):
    if layer is None:
        return None
    return layer.gamma.value, None if layer.beta is None else layer.beta.value, layer.epsilon


class _Weights:
    """The tensors of one decoder stack, fetched once per batch."""

    def __init__(self, model, blocks, final_norm, embedding, positions, projection):
        self.blocks = []
        for block in blocks:
            attention = block.self_attention
            q, k, v = (_dense(attention.query_dense), _dense(attention.key_dense),
                       _dense(attention.value_dense))
            # one (d_model, 2 * h * d_k + h * d_v) product for the queries, keys and values
            biases = None if q[1] is None else torch.cat([q[1], k[1], v[1]])
            w = dict(qkv=(torch.cat([q[0], k[0], v[0]], 1), biases),
                     o=_dense(attention.output_dense),
                     self_norm=_norm(block.self_attention_norm),
                     inner=_dense(block.feedforward.inner),
                     outer=_dense(block.feedforward.outer),
                     ff_norm=_norm(block.feedforward_norm))
            if block.cross_attention:
                cross = block.cross_attention_layer
                w.update(cross_q=_dense(cross.query_dense), cross_o=_dense(cross.output_dense),
                         cross_norm=_norm(block.cross_attention_norm))
            self.blocks.append(w)
        self.final_norm = _norm(final_norm)
        self.embedding = embedding.embeddings.value
        self.embedding_scale = math.sqrt(embedding.d_model) if embedding.scale else 1.0
        self.positions = positions.table.value
        # the output projection as a contiguous (d_model, vocab) matrix (tied: the
        # embedding table transposed once per batch), so logits are one (rows, vocab) product
        if projection is None:
            self.projection = (self.embedding.t().contiguous(), None)
        else:
            self.projection = _dense(projection)


def _linear(x, weights):
    kernel, bias = weights
    return torch.mm(x, kernel) if bias is None else torch.addmm(bias, x, kernel)


def _layer_norm(x, norm):
    gamma, beta, epsilon = norm
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, epsilon)


class TorchSteps:
    """Step adapter (see :mod:`.steps`) for a ``Transformer`` or ``GPT`` on PyTorch."""

    def __init__(self, model):
        self.model = model
        self.seq2seq = hasattr(model, "decoder_blocks")
        self.vocab_size = model.target_vocab_size if self.seq2seq else model.vocab_size
        self.heads = model.num_heads
        self.key_dim, self.value_dim = model.key_dim, model.value_dim
        self.pre_norm = model.norm_position == "pre"
        self.activation = F.relu if model.activation == "relu" else F.gelu

    def _weights(self):
        m = self.model
        if self.seq2seq:
            return _Weights(m, m.decoder_blocks, m.decoder_norm, m.target_embedding,
                            m.target_positions, m.output_projection)
        return _Weights(m, m.blocks, m.final_norm, m.token_embedding, m.positions,
                        m.output_projection)

    def _empty_caches(self, rows, max_len, like):
        shape_k = (max_len, rows, self.heads, self.key_dim)
        shape_v = (max_len, rows, self.heads, self.value_dim)
        layers = self.model.num_decoder_layers if self.seq2seq else self.model.num_layers
        return [(torch.zeros(shape_k, dtype=like.dtype, device=like.device),
                 torch.zeros(shape_v, dtype=like.dtype, device=like.device))
                for _ in range(layers)]

    def start(self, *args, **kwargs):
        return self._start_seq2seq(*args, **kwargs) if self.seq2seq else \
            self._start_language_model(*args, **kwargs)

    def _start_seq2seq(self, source_ids, max_len, copies=1):
        from transformerkit.layers.masks import padding_mask

        memory = self.model.encode(source_ids)  # (batch, source_len, d_model)
        cross = []
        for block in self.model.decoder_blocks:
            k, v = block.cross_attention_layer.compute_key_value(memory)  # (b, s, h, d)
            cross.append((k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()))
        mask = padding_mask(source_ids)[:, None, None, :]  # (batch, 1, 1, source_len)
        bias = torch.zeros(mask.shape, dtype=memory.dtype, device=memory.device)
        bias = bias.masked_fill(~mask, float("-inf"))
        state = self._empty_caches(memory.shape[0] * copies, max_len, memory)
        return state, (self._weights(), cross, (bias, copies))

    def _start_language_model(self, buffer, prefill, max_len):
        buffer = torch.as_tensor(buffer)
        weights = self._weights()
        state = self._empty_caches(buffer.shape[0], max_len, weights.embedding)
        if prefill > 0:  # the shared prompt prefix in one Keras call, copied into our caches
            caches = self.model.init_caches(buffer.shape[0], prefill)
            _, caches = self.model(buffer[:, :prefill], caches=caches, cache_index=0)
            for (k, v), cache in zip(state, caches, strict=True):  # Keras: (rows, len, h, d)
                k[:prefill] = cache["self"][0][:, :prefill].transpose(0, 1)
                v[:prefill] = cache["self"][1][:, :prefill].transpose(0, 1)
        return state, (weights, None, None)

    def step(self, buffer, index, state, static):
        """Logits ``(rows, vocab)`` for position ``index + 1``; ``state`` updated in place."""
        weights, cross, mask = static
        tokens = torch.as_tensor(buffer)[:, index].long()
        x = weights.embedding[tokens] * weights.embedding_scale + weights.positions[index]
        for layer, w in enumerate(weights.blocks):
            k_cache, v_cache = state[layer]
            x = self._sublayer(x, w["self_norm"], lambda h, w=w, k=k_cache, v=v_cache:
                               self._self_attention(h, w, k, v, index))
            if cross is not None:
                x = self._sublayer(x, w["cross_norm"], lambda h, w=w, c=cross[layer]:
                                   self._cross_attention(h, w, c, mask))
            x = self._sublayer(x, w["ff_norm"], lambda h, w=w: _linear(
                self.activation(_linear(h, w["inner"])), w["outer"]))
        if weights.final_norm is not None:
            x = _layer_norm(x, weights.final_norm)
        return _linear(x, weights.projection), state  # (rows, vocab)

    def _sublayer(self, x, norm, fn):
        if self.pre_norm:
            return x + fn(_layer_norm(x, norm))
        return _layer_norm(x + fn(x), norm)

    def _heads(self, x, width):
        return x.view(x.shape[0], self.heads, width)  # (rows, h, width)

    def _self_attention(self, h, w, k_cache, v_cache, index):
        """softmax(q k^T / sqrt(d_k)) v for the one new query of each row and head, over
        the filled cache prefix ``(index + 1, rows, h, d)``, then W^O."""
        rows, width = h.shape[0], self.heads * self.key_dim
        qkv = _linear(h, w["qkv"])  # (rows, 2 * h * d_k + h * d_v)
        q = self._heads(qkv[:, :width], self.key_dim)  # (rows, h, d_k)
        k_cache[index] = self._heads(qkv[:, width:2 * width], self.key_dim)
        v_cache[index] = self._heads(qkv[:, 2 * width:], self.value_dim)
        # batched over rows * h: (1, d_k) @ (d_k, keys) and (1, keys) @ (keys, d_v), on
        # strided views of the caches (no copies)
        keys = k_cache[: index + 1].view(index + 1, rows * self.heads, self.key_dim)
        values = v_cache[: index + 1].view(index + 1, rows * self.heads, self.value_dim)
        scores = torch.bmm(q.reshape(rows * self.heads, 1, self.key_dim),
                           keys.permute(1, 2, 0)) * (1.0 / math.sqrt(self.key_dim))
        out = torch.bmm(scores.softmax(-1), values.transpose(0, 1))  # (rows * h, 1, d_v)
        return _linear(out.view(rows, self.heads * self.value_dim), w["o"])

    def _cross_attention(self, h, w, cross, bias_and_copies):
        """Cross-attention; the ``copies`` rows (beams) of a sentence are its queries
        against ONE copy of its source keys/values."""
        bias, copies = bias_and_copies
        rows = h.shape[0]
        q = _linear(h, w["cross_q"]).view(rows // copies, copies, self.heads, self.key_dim)
        scores = torch.matmul(q.transpose(1, 2), cross[0].transpose(-1, -2))  # (b, h, c, s)
        weights = (scores * (1.0 / math.sqrt(self.key_dim)) + bias).softmax(-1)
        out = torch.matmul(weights, cross[1]).transpose(1, 2)  # (b, copies, h, dv)
        return _linear(out.reshape(rows, self.heads * self.value_dim), w["cross_o"])

    def reorder(self, state, rows, filled):
        """Beam search: caches whose rows are taken from ``rows``; only the filled
        positions are copied (the rest of the new buffers is written before it is read).
        The select runs on row-major views ``(rows, filled, h, d)``: PyTorch's row gather
        along the first axis is ~1.6x faster than along the second (beam 4: 0.92x time)."""
        rows = torch.as_tensor(rows).long()
        reordered = []
        for cache in state:
            pair = []
            for t in cache:
                new = torch.empty_like(t)
                torch.index_select(t[:filled].transpose(0, 1), 0, rows,
                                   out=new[:filled].transpose(0, 1))
                pair.append(new)
            reordered.append(tuple(pair))
        return reordered
