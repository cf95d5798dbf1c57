"""Multi-head attention (paper section 3.2) with fused head projections and a key/value cache.

Layout used throughout: ``(batch, time, heads, head_dim)``, the layout of
``keras.ops.dot_product_attention`` (which maps to PyTorch's fused
``scaled_dot_product_attention`` and to XLA's attention on JAX).
"""

import math

import keras
from keras import ops

from transformerkit import fastpath
from transformerkit.kernels import softmax as kernel_softmax
from transformerkit.kernels.products import inference_linear, kernels_and_biases, linear
from transformerkit.layers import calls
from transformerkit.layers.calls import call_sublayer, reshape
from transformerkit.layers.masks import attention_mask

_MASKED_SCORE = -1e9  # finite: an all-masked row can never turn into NaN


def scaled_dot_product_attention(query, key, value, mask=None, is_causal=False, dropout=None,
                                 training=False, return_scores=False):
    """softmax(Q K^T / sqrt(d_k)) V  (paper equation 1) for many heads at once.

    This is the single attention core of the package. It uses the backend's fused kernel
    when nothing forbids it (no score output, no attention dropout while training) and, on
    PyTorch, the keys are many enough for it to be the faster one
    (:data:`EXPLICIT_MAX_KEYS`); the explicit formula otherwise. Both give the same numbers.

    Args:
        query: ``(batch, query_len, heads, key_dim)``.
        key: ``(batch, key_len, heads, key_dim)``.
        value: ``(batch, key_len, heads, value_dim)``.
        mask: bool ``(batch|1, query_len, key_len)``, True = may attend, or None.
        is_causal: apply a causal mask (only used when ``mask`` is None; otherwise fold the
            causal part into ``mask`` with :func:`transformerkit.layers.masks.attention_mask`).
        dropout: a ``keras.layers.Dropout`` applied to the attention weights, or None.
        training: whether dropout is active.
        return_scores: also return the attention weights ``(batch, heads, query_len, key_len)``.

    Returns:
        ``(batch, query_len, heads, value_dim)`` and, if asked, the weights. Query rows whose
        keys are all masked get a zero output (never NaN).
    """
    key_dim = calls.shape(query)[-1]
    scale = 1.0 / math.sqrt(key_dim)
    rows_with_keys = None
    if mask is not None:
        mask = ops.cast(mask, "bool")
        rows_with_keys = ops.any(mask, axis=-1, keepdims=True)  # (b, q, 1)
        mask = ops.logical_or(mask, ops.logical_not(rows_with_keys))  # open empty rows
        mask = ops.expand_dims(mask, 1)  # (b, 1, q, k): broadcast over heads
        is_causal = False
    use_dropout = dropout is not None and dropout.rate > 0 and training
    same_width = query.shape[-1] == value.shape[-1]
    if not return_scores and not use_dropout and same_width and not _explicit_is_faster(key):
        output = _fused_attention(query, key, value, mask, scale, is_causal)
        scores = None
    else:
        logits = ops.einsum("bqhd,bkhd->bhqk", query, key) * ops.cast(scale, query.dtype)
        if is_causal:
            q_len, k_len = ops.shape(query)[1], ops.shape(key)[1]
            mask = ops.expand_dims(attention_mask(causal=True, query_len=q_len, key_len=k_len), 1)
        if mask is not None:
            logits = ops.where(mask, logits, ops.cast(_MASKED_SCORE, logits.dtype))
        scores = ops.cast(kernel_softmax.softmax(ops.cast(logits, "float32")), query.dtype)
        weights = dropout(scores, training=training) if use_dropout else scores
        output = ops.einsum("bhqk,bkhd->bqhd", weights, value)
    if rows_with_keys is not None and not _every_row_has_keys(rows_with_keys):
        keep = ops.cast(ops.expand_dims(rows_with_keys, -1), output.dtype)  # (b, q, 1, 1)
        output = output * keep
        if scores is not None:
            scores = scores * ops.cast(ops.expand_dims(rows_with_keys, 1), scores.dtype)
    return (output, scores) if return_scores else output


def _every_row_has_keys(rows_with_keys):
    """Whether no query row of the ``(batch, query_len, 1)`` bool tensor is all masked, known
    without tracing: on eager PyTorch (a :mod:`transformerkit.fastpath` shortcut, where the
    zeroing of such rows would be two passes over the output for nothing, forward and
    backward); elsewhere False (the zeroing runs, a no-op on rows with keys)."""
    return (fastpath.applies(rows_with_keys) and not fastpath.exporting()
            and bool(rows_with_keys.all()))


def layer_outputs(output, scores=None, cache=None):
    """The return convention of the layers and models that take ``return_attention_scores``
    and ``cache(s)``: ``output`` alone, or followed by the scores (when asked) and then the
    updated cache (when one was given); pass None for what is not returned."""
    extras = tuple(x for x in (scores, cache) if x is not None)
    return (output, *extras) if extras else output


# On eager PyTorch the explicit formula is faster than the fused kernel (CPU flash attention)
# up to this many keys: the kernel pays a fixed cost per (batch, head) block that outweighs
# the arithmetic of short sequences (``bench/kernels.py``; the timings: docs/benchmarks.md,
# "Kernel choices").
EXPLICIT_MAX_KEYS = 64


def _explicit_is_faster(key):
    """Whether attention over ``key`` ``(batch, key_len, heads, dim)`` runs the explicit
    formula rather than the fused kernel: on eager PyTorch (a :mod:`transformerkit.fastpath`
    shortcut) for at most :data:`EXPLICIT_MAX_KEYS` keys, and always in a graph that
    ``torch.export`` captures (whose key length is symbolic; its compiler fuses the formula).
    Both compute equation 1."""
    return fastpath.applies(key) and (fastpath.exporting() or key.shape[1] <= EXPLICIT_MAX_KEYS)


def _one_query_products_as_sums():
    """Whether the decoder step's attention (:meth:`MultiHeadAttention.step`,
    :meth:`~MultiHeadAttention.cross_step`: one query, or a beam's few, a row) computes its two
    products as broadcast products summed over the reduced axis rather than batched matrix
    products: in a graph that ``torch.export`` captures (the compiled step), whose compiler
    turns the sums into vectorized loops fused with the softmax, where its batched products
    of a 1-row matrix ran as unvectorized loops or one library call per product (a 64-row
    float32 step 8.5 -> 7.4 ms, int8 4.9 -> 3.6 ms, ``docs/decoding.md``). Eager PyTorch keeps
    ``bmm``/``matmul``, which do not write the broadcast product. Both compute equation 1."""
    return fastpath.exporting()


def _fused_attention(query, key, value, mask, scale, is_causal):
    """``keras.ops.dot_product_attention``; on PyTorch its kernel, ``scaled_dot_product_attention``,
    is called directly on transposed views (a shortcut, :mod:`transformerkit.fastpath`):
    Keras' wrapper first copies the three inputs to contiguous ``(batch, heads, len, dim)``
    tensors, which costs time forward and backward."""
    if not fastpath.applies(query):
        return ops.dot_product_attention(query, key, value, mask=mask, scale=scale,
                                         is_causal=is_causal)
    import torch

    query, key, value = (ops.convert_to_tensor(x).transpose(1, 2) for x in (query, key, value))
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=is_causal, scale=scale)
    return output.transpose(1, 2)


@keras.saving.register_keras_serializable(package="transformerkit")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, "Attention Is All You Need" section 3.2.2.

    MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K,
    V W_i^V). The heads are fused: one ``(d_model, heads * key_dim)`` projection each for
    queries and keys, one ``(d_model, heads * value_dim)`` for values.

    Args:
        num_heads: int, number of heads ``h``.
        key_dim: int, width of each query/key head ``d_k``.
        value_dim: int or None, width of each value head ``d_v`` (default ``key_dim``).
        output_dim: int or None, width of the output (default: the query's last dimension).
        dropout: float, dropout on the attention weights (default 0.0: the paper applies
            dropout to sub-layer outputs only, and the fused kernel stays usable).
        use_bias: bool, biases in the four projections (default True).
        kernel_initializer: initializer of the projections (default "glorot_uniform").

    Call arguments:
        query: ``(batch, query_len, d_query)``.
        value: ``(batch, key_len, d_value)`` or None when ``cache`` holds a cross-attention
            key/value pair.
        key: ``(batch, key_len, d_key)``, default ``value``.
        query_mask, value_mask, key_mask: ``(batch, len)`` bool padding masks; Keras fills
            them from the inputs' Keras masks. ``key_mask`` defaults to ``value_mask``.
        attention_mask: bool ``(batch, query_len, key_len)``, True = may attend.
        use_causal_mask: bool, queries may not see later keys.
        cache: None, or a ``(key, value)`` pair of ``(batch, cache_len, heads, dim)`` tensors.
            With ``cache_index=None`` the pair is used as is (cross-attention over a
            precomputed source, see :meth:`compute_key_value`); with ``cache_index`` the new
            keys/values of ``value`` are written at ``cache_index`` and attention runs over
            the whole cache (self-attention during incremental decoding); then padding of
            cached keys is given as a ``(batch, cache_len)`` ``key_mask``, and a mask that
            covers only the new positions is ignored.
        cache_index: int or scalar tensor, absolute position of the first query.
        return_attention_scores: also return ``(batch, heads, query_len, key_len)`` weights.

    Returns:
        ``output`` of shape ``(batch, query_len, output_dim)``, followed by the weights if
        asked and by the updated cache if one was given.

    Example:
    >>> mha = MultiHeadAttention(num_heads=2, key_dim=4)
    >>> mha(np.ones((1, 3, 8)), np.ones((1, 5, 8))).shape
    (1, 3, 8)

    References: Vaswani et al. 2017, https://arxiv.org/abs/1706.03762
    """

    def __init__(self, num_heads, key_dim, value_dim=None, output_dim=None, dropout=0.0,
                 use_bias=True, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if int(num_heads) < 1 or int(key_dim) < 1:
            raise ValueError(f"num_heads and key_dim must be positive, got {num_heads}, {key_dim}")
        self.num_heads = int(num_heads)
        self.key_dim = int(key_dim)
        self.value_dim = int(value_dim) if value_dim else self.key_dim
        self.output_dim = output_dim
        self.dropout = float(dropout)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        dense = dict(use_bias=self.use_bias, kernel_initializer=self.kernel_initializer,
                     dtype=self.dtype_policy)
        self.query_dense = keras.layers.Dense(self.num_heads * self.key_dim, name="query", **dense)
        self.key_dense = keras.layers.Dense(self.num_heads * self.key_dim, name="key", **dense)
        self.value_dense = keras.layers.Dense(self.num_heads * self.value_dim, name="value",
                                              **dense)
        self.output_dense = keras.layers.Dense(self.output_dim or query_shape[-1], name="output",
                                               **dense)
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build((None, None, self.num_heads * self.value_dim))
        self.attention_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def _split_heads(self, x, width):
        batch, length = calls.shape(x)[:2]
        return reshape(x, (batch, length, self.num_heads, width))  # (b, t, h, width)

    def compute_key_value(self, value, key=None):
        """Project a sequence into ``(key, value)`` heads: two ``(batch, len, heads, dim)``."""
        key = value if key is None else key
        return (self._split_heads(call_sublayer(self.key_dense, key), self.key_dim),
                self._split_heads(call_sublayer(self.value_dense, value), self.value_dim))

    def call(self, query, value=None, key=None, query_mask=None, value_mask=None, key_mask=None,
             attention_mask=None, use_causal_mask=False, cache=None, cache_index=None,
             return_attention_scores=False, training=None):
        q = call_sublayer(self.query_dense, query)
        q = self._split_heads(q, self.key_dim)  # (b, q, h, dk)
        key_mask = value_mask if key_mask is None else key_mask
        query_offset = None
        if cache is None:
            k, v = self.compute_key_value(query if value is None else value, key)
            new_cache = None
        elif cache_index is None:  # precomputed cross-attention keys/values
            k, v = cache
            new_cache = cache
        else:  # incremental self-attention: write the new positions into the cache
            new_k, new_v = self.compute_key_value(query if value is None else value, key)
            start = [0, cache_index, 0, 0]
            k = ops.slice_update(cache[0], start, ops.cast(new_k, cache[0].dtype))
            v = ops.slice_update(cache[1], start, ops.cast(new_v, cache[1].dtype))
            new_cache = (k, v)
            query_offset = cache_index
            if key_mask is not None and key_mask.shape[1] != k.shape[1]:
                key_mask = None  # a mask of the new positions only (Keras' auto-filled one)
        mask = _build_mask(key_mask, use_causal_mask, attention_mask, q, k, query_offset)
        causal_only = use_causal_mask and mask is None
        out = scaled_dot_product_attention(
            q, k, v, mask=mask, is_causal=causal_only, dropout=self.attention_dropout,
            training=training, return_scores=return_attention_scores)
        out, scores = out if return_attention_scores else (out, None)
        batch, length = calls.shape(out)[:2]
        out = call_sublayer(self.output_dense,
                            reshape(out, (batch, length, self.num_heads * self.value_dim)))
        return layer_outputs(out, scores if return_attention_scores else None,
                             new_cache if cache is not None else None)

    # -- The fast twin of ``call`` with a cache: one new position per row, eager PyTorch. --
    # The decode loop of ``transformerkit.decoding`` uses these where
    # :func:`transformerkit.fastpath.applies`: a position-major cache written in place, plain
    # torch kernels on weights read once per batch, no Keras call machinery per step.

    def step_weights(self, precision="float32", packed=True):
        """The projections for :meth:`step`, :meth:`step_memory`, :meth:`cross_step` and
        :meth:`self_attend` as :func:`inference_linear` weights at ``precision`` (float32,
        bfloat16 or int8), read once per decoded batch (so a decoder follows a model that
        trains): ``qkv``, the query, key and value kernels side by side ``(d_model, 2 h d_k +
        h d_v)`` (one product for the three), ``key_value`` (the two of them: a source's
        cross-attention memory), ``query`` and ``output``."""
        dense = (self.query_dense, self.key_dense, self.value_dense)
        kind = dict(precision=precision, packed=packed)
        return {"qkv": inference_linear(*kernels_and_biases(*dense), **kind),
                "key_value": inference_linear(*kernels_and_biases(*dense[1:]), **kind),
                "query": inference_linear(*kernels_and_biases(self.query_dense), **kind),
                "output": inference_linear(*kernels_and_biases(self.output_dense), **kind)}

    def self_attend(self, x, weights, mask=None):
        """Self-attention of whole sequences at inference: ``call(x, x, value_mask=mask)``
        (the encoder's, paper section 3.2.3) computed by :func:`scaled_dot_product_attention`
        on projections with weights from :meth:`step_weights`.

        Args:
            x: ``(batch, length, d_model)`` torch tensor.
            weights: from :meth:`step_weights`.
            mask: ``(batch, length)`` bool, True at real tokens, or None (no padding).

        Returns ``(batch, length, output_dim)`` float32.
        """
        batch, length = x.shape[:2]
        width = self.num_heads * self.key_dim
        qkv = linear(x, weights["qkv"])  # (b, t, 2 h d_k + h d_v)
        q = qkv[..., :width].reshape(batch, length, self.num_heads, self.key_dim)
        k = qkv[..., width:2 * width].reshape(batch, length, self.num_heads, self.key_dim)
        v = qkv[..., 2 * width:].reshape(batch, length, self.num_heads, self.value_dim)
        out = scaled_dot_product_attention(q, k, v, mask=_build_mask(mask, False, None, q, k,
                                                                      None))
        return linear(out.reshape(batch, length, self.num_heads * self.value_dim),
                      weights["output"])

    def prefill(self, x, weights, cache):
        """Causal self-attention of a prompt whose keys and values fill the cache (the
        decoder's masked self-attention, paper section 3.2.3, eq. 1 with the future masked):
        ``call(x, cache=..., cache_index=0, use_causal_mask=True)`` for the first ``length``
        positions of every row, computed with torch kernels on the products of
        :meth:`step` (the same roundings at each position: the projections' outputs at
        their precision, widened for the cache and the query).

        Args:
            x: ``(rows, length, d_model)`` torch tensor, positions ``0..length-1``.
            weights: from :meth:`step_weights`.
            cache: ``(keys, values)``, position-major ``(max_len, rows, heads, dim)``;
                positions ``0..length-1`` are written in place.

        Returns ``(rows, length, output_dim)`` (bfloat16 from a bfloat16 product, as
        :meth:`step`).
        """
        rows, length, width = x.shape[0], x.shape[1], self.num_heads * self.key_dim
        qkv = linear(x, weights["qkv"], low_output=True)  # (rows, length, 2 h d_k + h d_v)
        q = qkv[..., :width].float().reshape(rows, length, self.num_heads, self.key_dim)
        k = qkv[..., width:2 * width].reshape(rows, length, self.num_heads, self.key_dim)
        v = qkv[..., 2 * width:].reshape(rows, length, self.num_heads, self.value_dim)
        keys, values = cache
        keys[:length] = k.transpose(0, 1)
        values[:length] = v.transpose(0, 1)
        # the attention reads the cache's values: float32, as every later step reads them
        out = scaled_dot_product_attention(q, keys[:length].transpose(0, 1),
                                           values[:length].transpose(0, 1), is_causal=True)
        return linear(out.reshape(rows, length, self.num_heads * self.value_dim),
                      weights["output"], low_output=True)

    def step(self, x, weights, cache, index, cache_rows=None):
        """Self-attention of one new position per row: ``call(x, cache=..., cache_index=index,
        use_causal_mask=True)`` for a single query, computed with torch kernels.

        Args:
            x: ``(rows, d_model)`` torch tensor, the position ``index`` of every row.
            weights: from :meth:`step_weights`.
            cache: ``(keys, values)``, position-major ``(max_len, rows, heads, dim)`` tensors;
                the new key and value are written in place at ``index``.
            index: int, the position of ``x`` (a symbolic one in a step captured by
                ``torch.export``: ``TransformerBase.decode_step``).
            cache_rows: None (row ``r`` of ``x`` owns row ``r`` of the caches), or
                ``(max_len, rows)`` int64: position ``p`` of row ``r`` is the caches' row
                ``cache_rows[p, r]`` (their rows then ``(max_len, slots)``, ``slots >=
                rows``), the new key and value written at ``cache_rows[index]``. A beam
                search reorders this table in place of the caches' rows (the compiled engine:
                ``transformerkit.decoding.aot_step``); the attention reads each key through
                it, which its compiled loops do as they read the key.

        Returns ``(rows, output_dim)``, float32 (bfloat16 from a bfloat16 product: the
        residual sum widens it). The query attends over positions ``0..index`` only,
        so no causal mask is needed, and every row has at least one key (its own).
        """
        import torch

        rows, heads, width = x.shape[0], self.num_heads, self.num_heads * self.key_dim
        # (rows, 2 h d_k + h d_v); bfloat16 from a bfloat16 product, widened where it is
        # written into the float32 cache and for the query only
        qkv = linear(x, weights["qkv"], low_output=True)
        keys, values = cache
        new_keys = qkv[:, width:2 * width].view(rows, heads, self.key_dim)
        new_values = qkv[:, 2 * width:].view(rows, heads, self.value_dim)
        q = qkv[:, :width].float()  # (rows, h d_k)
        scale = 1.0 / math.sqrt(self.key_dim)
        if cache_rows is None:  # the filled cache prefix (t, rows, h, dim): views
            keys[index] = new_keys
            values[index] = new_values
            k, v = keys[: index + 1], values[: index + 1]
        else:  # each row's keys and values gathered through the table: (t, rows, h, dim)
            # one (position, row) pair a row: indexing the caches themselves, which the
            # compiler writes in place (a write into the view ``keys[index]`` it copied
            # twice, the whole position of every cache row)
            written = cache_rows[index]
            position = torch.full_like(written, index)
            keys[position, written] = new_keys
            values[position, written] = new_values
            positions = torch.arange(index + 1, device=x.device).unsqueeze(1)
            k = keys[positions, cache_rows[: index + 1]]
            v = values[positions, cache_rows[: index + 1]]
        if _one_query_products_as_sums():
            # the query scaled, not the scores: the compiler lowers ``softmax(scores * scale)``
            # with a pass for non-finite scores and a second maximum (a 64-row float32 step
            # about 4 % slower: docs/decoding.md); (t, rows, h)
            scores = (k * (q * scale).view(rows, heads, self.key_dim)).sum(-1)
            out = (scores.softmax(0).unsqueeze(-1) * v).sum(0)  # (rows, h, dv)
        else:  # batched over rows * heads, on strided views of the prefix (no copies)
            k = k.view(index + 1, rows * heads, self.key_dim)  # (t, rows h, dk)
            v = v.view(index + 1, rows * heads, self.value_dim)
            scores = torch.bmm(q.reshape(rows * heads, 1, self.key_dim), k.permute(1, 2, 0))
            out = torch.bmm(kernel_softmax.softmax(scores * scale), v.transpose(0, 1))
        return linear(out.reshape(rows, heads * self.value_dim), weights["output"],
                      low_output=True)

    def step_memory(self, context, context_mask, weights):
        """Cross-attention keys and values of a source for :meth:`cross_step`, once per batch.

        Args:
            context: ``(batch, source_len, d_model)`` encoder output (torch).
            context_mask: ``(batch, source_len)`` bool, True at real tokens.
            weights: from :meth:`step_weights` (its ``key_value`` product).

        Returns ``(keys, values, bias, keep)``: keys and values ``(batch, heads, source_len,
        dim)``, ``bias`` ``(batch, 1, 1, source_len)`` that is 0 at real tokens and a large
        finite negative number at padding (a row of scores is never all ``-inf``), and
        ``keep`` ``(batch, 1, 1, 1)`` that zeroes the output of a source without any real
        token, as :func:`scaled_dot_product_attention` does (None when every source has one,
        except in a graph ``torch.export`` captures: :func:`transformerkit.fastpath.exporting`).
        """
        import torch

        batch, length = context.shape[:2]
        both = linear(context, weights["key_value"])  # (b, s, h d_k + h d_v)
        width = self.num_heads * self.key_dim
        keys = both[..., :width].reshape(batch, length, self.num_heads, self.key_dim)
        values = both[..., width:].reshape(batch, length, self.num_heads, self.value_dim)
        mask = context_mask[:, None, None, :]  # (b, 1, 1, s)
        bias = torch.zeros(mask.shape, dtype=keys.dtype, device=keys.device)
        bias = bias.masked_fill(~mask, _MASKED_SCORE)
        has_keys = mask.any(-1, keepdim=True)  # (b, 1, 1, 1)
        every = not fastpath.exporting() and bool(has_keys.all())  # a captured graph: any
        keep = None if every else has_keys.to(keys.dtype)
        return (keys.transpose(1, 2).contiguous(), values.transpose(1, 2).contiguous(), bias,
                keep)

    def cross_step(self, x, weights, memory, copies=1):
        """Cross-attention of one position per row over a source from :meth:`step_memory`:
        ``call(x, cache=(keys, values), value_mask=context_mask)`` for a single query.

        ``x`` is ``(rows, d_model)`` with ``rows = batch * copies``: the ``copies`` rows of
        a sentence (its beams) are adjacent and are queries against ONE copy of its source.
        Returns ``(rows, output_dim)``, float32 or bfloat16, as :meth:`step`.
        """
        import torch

        keys, values, bias, keep = memory
        rows, heads = x.shape[0], self.num_heads
        q = linear(x, weights["query"]).view(rows // copies, copies, heads, self.key_dim)
        q = q.transpose(1, 2)  # (b, h, copies, d_k)
        sums = _one_query_products_as_sums()  # as in step
        scores = ((q.unsqueeze(3) * keys.unsqueeze(2)).sum(-1) if sums  # (b, h, copies, s)
                  else torch.matmul(q, keys.transpose(-1, -2)))
        attention = kernel_softmax.softmax(scores * (1.0 / math.sqrt(self.key_dim)) + bias)
        out = ((attention.unsqueeze(-1) * values.unsqueeze(2)).sum(3) if sums  # (b, h, c, d_v)
               else torch.matmul(attention, values))
        if keep is not None:
            out = out * keep
        out = out.transpose(1, 2).reshape(rows, heads * self.value_dim)  # (rows, h d_v)
        return linear(out, weights["output"], low_output=True)  # as in step

    def compute_mask(self, query, previous_mask=None):
        # Keras calls compute_mask(first input, its mask): the output keeps the query's mask.
        return previous_mask

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, key_dim=self.key_dim, value_dim=self.value_dim,
                      output_dim=self.output_dim, dropout=self.dropout, use_bias=self.use_bias,
                      kernel_initializer=keras.initializers.serialize(self.kernel_initializer))
        return config


def _build_mask(key_mask, causal, explicit, q, k, query_offset):
    """Mask for ``scaled_dot_product_attention``; None when a plain causal flag suffices.

    ``query_offset`` is None without a cache (queries and keys are the same positions) and
    the cache write index with one; then the causal part is always an explicit mask.
    """
    if key_mask is None and explicit is None and query_offset is None:
        return None
    return attention_mask(key_mask=key_mask, causal=causal, explicit_mask=explicit,
                          query_len=ops.shape(q)[1], key_len=ops.shape(k)[1],
                          query_offset=0 if query_offset is None else query_offset)
