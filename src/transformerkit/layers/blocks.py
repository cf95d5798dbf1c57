"""Encoder and decoder blocks (paper section 3.1), post- or pre-LayerNorm."""

import keras
from keras import ops

from transformerkit.layers.attention import MultiHeadAttention, layer_outputs
from transformerkit.layers.calls import call_sublayer, norm_weights, normalize
from transformerkit.layers.dropout import apply_dropout
from transformerkit.layers.feedforward import FeedForward

NORM_POSITIONS = ("post", "pre")


class _Block(keras.layers.Layer):
    """Shared plumbing: sub-layer connections with residual, dropout and LayerNorm.

    ``post`` (the paper): ``x = LayerNorm(x + Dropout(sublayer(x)))``.
    ``pre`` (GPT-2 / "On Layer Normalization in the Transformer Architecture"):
    ``x = x + Dropout(sublayer(LayerNorm(x)))``; the model adds a final LayerNorm.
    """

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_position="post",
                 activation="relu", key_dim=None, value_dim=None, attention_dropout=0.0,
                 activation_dropout=0.0, layer_norm_epsilon=1e-6, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        if norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position must be one of {NORM_POSITIONS}, "
                             f"got {norm_position!r}")
        if key_dim is None and d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                             "set key_dim to choose the head width explicitly")
        self.d_model, self.num_heads, self.d_ff = int(d_model), int(num_heads), int(d_ff)
        self.dropout = float(dropout)
        self.norm_position = norm_position
        self.activation = activation
        self.key_dim = int(key_dim) if key_dim else self.d_model // self.num_heads
        self.value_dim = int(value_dim) if value_dim else self.key_dim
        self.attention_dropout = float(attention_dropout)
        self.activation_dropout = float(activation_dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.use_bias = bool(use_bias)
        self.supports_masking = True
        FeedForward(d_model, d_ff, activation)  # validates ``activation`` now, not at build

    def _attention(self, name):
        return MultiHeadAttention(self.num_heads, self.key_dim, self.value_dim,
                                  output_dim=self.d_model, dropout=self.attention_dropout,
                                  use_bias=self.use_bias, dtype=self.dtype_policy, name=name)

    def _norm(self, name):
        return keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon,
                                               center=self.use_bias, dtype=self.dtype_policy,
                                               name=name)

    def _build_feedforward(self, input_shape):
        self.feedforward = FeedForward(self.d_model, self.d_ff, self.activation,
                                       self.activation_dropout, use_bias=self.use_bias,
                                       dtype=self.dtype_policy, name="feedforward")
        self.feedforward.build(input_shape)
        self.feedforward_norm = self._norm("feedforward_norm")
        self.feedforward_norm.build(input_shape)
        self.residual_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def _connect(self, x, norm, sublayer, dropout=None):
        """One residual connection (paper section 5.4 for ``post``): ``post``:
        ``norm(x + dropout(sublayer(x)))``; ``pre``: ``x + dropout(sublayer(norm(x)))``.
        ``sublayer`` may return a tuple ``(output, *extras)``; returns ``(new_x, extras)``."""
        out = sublayer(norm(x) if self.norm_position == "pre" else x)
        out, extras = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
        x = x + (out if dropout is None else dropout(out))
        return (x if self.norm_position == "pre" else norm(x)), extras

    def _sublayer(self, x, norm, fn, training):
        """:meth:`_connect` with a Keras LayerNorm layer and the residual dropout."""
        return self._connect(x, lambda h: call_sublayer(norm, h), fn,
                             lambda h: apply_dropout(self.residual_dropout, h, training))

    def _step_sublayer(self, x, norm, fn):
        """:meth:`_connect` at inference with LayerNorm weights from :func:`norm_weights`."""
        return self._connect(x, lambda h: normalize(h, norm), fn)[0]

    def step_weights(self, precision="float32", packed=True):
        """The weights of the block's inference twin (``EncoderBlock.inference_call``,
        ``DecoderBlock.step``) as torch tensors, read once per batch; the projections
        packed for ``precision`` (float32, bfloat16 or int8:
        :func:`~transformerkit.kernels.products.inference_linear`)."""
        return {"self_attention": self.self_attention.step_weights(precision, packed),
                "self_attention_norm": norm_weights(self.self_attention_norm),
                "feedforward": self.feedforward.step_weights(precision, packed),
                "feedforward_norm": norm_weights(self.feedforward_norm)}

    def _feedforward(self, training):
        return lambda h: call_sublayer(self.feedforward, h, training=training)

    def compute_mask(self, inputs, previous_mask=None):
        # Keras calls compute_mask(inputs, mask of inputs): the output keeps the padding mask.
        return previous_mask

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
                      dropout=self.dropout, norm_position=self.norm_position,
                      activation=self.activation, key_dim=self.key_dim,
                      value_dim=self.value_dim, attention_dropout=self.attention_dropout,
                      activation_dropout=self.activation_dropout,
                      layer_norm_epsilon=self.layer_norm_epsilon, use_bias=self.use_bias)
        return config


@keras.saving.register_keras_serializable(package="transformerkit")
class EncoderBlock(_Block):
    """Self-attention + feed-forward, each in a residual connection (paper figure 1, left).

    Args: see :class:`_Block` (``d_model``, ``num_heads``, ``d_ff``, ``dropout``,
    ``norm_position`` "post"|"pre", ``activation`` "relu"|"gelu", ``key_dim``,
    ``value_dim``, ``attention_dropout``, ``activation_dropout`` (inside the feed-forward
    network; 0.0 as in the paper), ``layer_norm_epsilon``, ``use_bias`` (biases in the
    projections and LayerNorm offsets; True as in the paper, False as in nanoGPT)).

    Call arguments:
        inputs: ``(batch, length, d_model)``.
        mask: ``(batch, length)`` bool padding mask (Keras fills it from the input's mask).
        attention_mask: optional ``(batch, length, length)`` bool.
        return_attention_scores: also return ``(batch, heads, length, length)``.

    Returns ``(batch, length, d_model)`` (and the scores if asked).
    """

    def build(self, input_shape):
        self.self_attention = self._attention("self_attention")
        self.self_attention.build(input_shape, input_shape)
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention_norm.build(input_shape)
        self._build_feedforward(input_shape)

    def call(self, inputs, mask=None, attention_mask=None, return_attention_scores=False,
             training=None):
        x, extras = self._sublayer(
            inputs, self.self_attention_norm,
            lambda h: call_sublayer(self.self_attention, h, h, value_mask=mask,
                                    attention_mask=attention_mask,
                                    return_attention_scores=return_attention_scores,
                                    training=training),
            training)
        x, _ = self._sublayer(x, self.feedforward_norm, self._feedforward(training), training)
        return (x, extras[0]) if return_attention_scores else x

    # -- The fast twin of ``call`` at inference (eager PyTorch, see ``DecoderBlock.step``). --

    def inference_call(self, x, weights, mask=None):
        """``call(x, mask=mask)`` at inference: ``(batch, length, d_model)`` torch tensor ->
        the same shape, with weights from :meth:`step_weights` (their precision) and ``mask``
        ``(batch, length)`` bool or None. No dropout, no scores."""
        x = self._step_sublayer(x, weights["self_attention_norm"],
                                lambda h: self.self_attention.self_attend(
                                    h, weights["self_attention"], mask))
        return self._step_sublayer(x, weights["feedforward_norm"],
                                   lambda h: self.feedforward.step(h, weights["feedforward"]))


@keras.saving.register_keras_serializable(package="transformerkit")
class DecoderBlock(_Block):
    """Causal self-attention, optional cross-attention, feed-forward (paper figure 1, right).

    With ``cross_attention=False`` this is a GPT block.

    Call arguments:
        inputs: ``(batch, target_len, d_model)``.
        context: ``(batch, source_len, d_model)`` encoder output, or None when a
            cross-attention cache is given (or ``cross_attention=False``).
        inputs_mask / mask: ``(batch, target_len)`` bool padding mask of ``inputs`` (Keras
            fills ``inputs_mask`` when ``context`` is given and ``mask`` otherwise).
        context_mask: ``(batch, source_len)`` bool padding mask of ``context``.
        cache: None, or a dict ``{"self": (k, v), "cross": (k, v)}`` from
            :meth:`init_cache`; then ``inputs`` are the new positions starting at
            ``cache_index`` and the updated cache is returned too.
        cache_index: int or scalar tensor.
        return_attention_scores: also return a dict of ``(batch, heads, q, k)`` weights.

    Returns ``(batch, target_len, d_model)``, then the scores if asked, then the cache if given.
    """

    def __init__(self, *args, cross_attention=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.cross_attention = bool(cross_attention)

    def build(self, inputs_shape, context_shape=None):
        self.self_attention = self._attention("self_attention")
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention_norm.build(inputs_shape)
        if self.cross_attention:
            context_shape = context_shape or (None, None, self.d_model)
            self.cross_attention_layer = self._attention("cross_attention")
            self.cross_attention_layer.build(inputs_shape, context_shape)
            self.cross_attention_norm = self._norm("cross_attention_norm")
            self.cross_attention_norm.build(inputs_shape)
        self._build_feedforward(inputs_shape)

    def init_cache(self, batch_size, max_length, context=None, dtype="float32"):
        """Empty self-attention cache and, given ``context``, the cross-attention keys/values.

        Returns ``{"self": (keys, values), "cross": (keys, values) or None}`` with
        ``(batch, max_length, heads, dim)`` zeros for the self-attention part.
        """
        heads = self.num_heads
        cache = {"self": (ops.zeros((batch_size, max_length, heads, self.key_dim), dtype),
                          ops.zeros((batch_size, max_length, heads, self.value_dim), dtype)),
                 "cross": None}
        if self.cross_attention and context is not None:
            cache["cross"] = self.cross_attention_layer.compute_key_value(context)
        return cache

    def call(self, inputs, context=None, inputs_mask=None, context_mask=None, mask=None,
             attention_mask=None, cache=None, cache_index=None, return_attention_scores=False,
             training=None):
        inputs_mask = inputs_mask if inputs_mask is not None else mask
        scores = {}
        new_cache = None if cache is None else dict(cache)

        def self_attend(h):
            return call_sublayer(
                self.self_attention, h, h, value_mask=inputs_mask, attention_mask=attention_mask,
                use_causal_mask=True, cache=None if cache is None else cache["self"],
                cache_index=cache_index, return_attention_scores=return_attention_scores,
                training=training)

        x, extras = self._sublayer(inputs, self.self_attention_norm, self_attend, training)
        if return_attention_scores:
            scores["self"], extras = extras[0], extras[1:]
        if cache is not None:
            new_cache["self"] = extras[0]

        if self.cross_attention:
            cross_cache = None if cache is None else cache["cross"]
            if context is None and cross_cache is None:
                raise ValueError("DecoderBlock with cross_attention needs `context` "
                                 "(the encoder output) or a cross-attention cache")

            def cross_attend(h):
                return call_sublayer(
                    self.cross_attention_layer, h, context, value_mask=context_mask,
                    cache=cross_cache, return_attention_scores=return_attention_scores,
                    training=training)

            x, extras = self._sublayer(x, self.cross_attention_norm, cross_attend, training)
            if return_attention_scores:
                scores["cross"] = extras[0]

        x, _ = self._sublayer(x, self.feedforward_norm, self._feedforward(training), training)
        return layer_outputs(x, scores if return_attention_scores else None, new_cache)

    # -- The fast twin of ``call`` with a cache (see ``MultiHeadAttention.step``). --

    def step_weights(self, precision="float32", packed=True):
        """The block's weights as torch tensors for :meth:`step`, read once per batch; the
        projections packed for ``precision`` (float32, bfloat16 or int8)."""
        weights = super().step_weights(precision, packed)
        if self.cross_attention:
            weights["cross_attention"] = self.cross_attention_layer.step_weights(precision, packed)
            weights["cross_attention_norm"] = norm_weights(self.cross_attention_norm)
        return weights

    def step(self, x, weights, cache, index, memory=None, copies=1, cache_rows=None):
        """``call(x, cache=..., cache_index=index)`` at inference for one position per row.

        Args:
            x: ``(rows, d_model)`` torch tensor.
            weights: from :meth:`step_weights`.
            cache: this block's self-attention ``(keys, values)``, position-major
                ``(max_len, rows, heads, dim)``, written in place at ``index``.
            index: int position of ``x``.
            memory: the source from ``cross_attention_layer.step_memory`` (with
                ``cross_attention``), ``copies`` rows per source (beams).
            cache_rows: where each row's positions are in ``cache`` (None: its own row),
                as in ``MultiHeadAttention.step``.

        Returns ``(rows, d_model)``.
        """
        x = self._step_sublayer(x, weights["self_attention_norm"],
                                lambda h: self.self_attention.step(
                                    h, weights["self_attention"], cache, index, cache_rows))
        if self.cross_attention:
            x = self._step_sublayer(x, weights["cross_attention_norm"],
                                    lambda h: self.cross_attention_layer.cross_step(
                                        h, weights["cross_attention"], memory, copies))
        return self._step_sublayer(x, weights["feedforward_norm"],
                                   lambda h: self.feedforward.step(h, weights["feedforward"]))

    def prefill(self, x, weights, cache):
        """``call(x, cache=..., cache_index=0)`` at inference for a prompt of a GPT block (no
        cross-attention: a decoder layer of section 3.1 without its second sub-layer): every
        position of ``x`` ``(rows, length, d_model)`` at once, its keys and values written
        into ``cache`` (:meth:`step`'s, positions ``0..length-1``), with :meth:`step`'s
        products. Returns ``(rows, length, d_model)``."""
        if self.cross_attention:
            raise ValueError("prefill is a GPT block's (no cross-attention): a decoder "
                             "block with cross-attention steps from its first position")
        x = self._step_sublayer(x, weights["self_attention_norm"],
                                lambda h: self.self_attention.prefill(
                                    h, weights["self_attention"], cache))
        return self._step_sublayer(x, weights["feedforward_norm"],
                                   lambda h: self.feedforward.step(h, weights["feedforward"]))

    def get_config(self):
        config = super().get_config()
        config.update(cross_attention=self.cross_attention)
        return config
