"""GPT: a decoder-only causal language model built from the same blocks."""

import keras
from keras import ops

from transformerkit.models.base import TIE_OPTIONS, TransformerBase, check_choice, check_token_ids
from transformerkit.models.heads import LogitsProjection


@keras.saving.register_keras_serializable(package="transformerkit")
class GPT(TransformerBase):
    """Decoder-only Transformer language model (a stack of causal self-attention blocks).

    Args:
        vocab_size: int (id 0 is padding).
        num_layers, d_model, num_heads, d_ff, dropout, max_length: as in ``Transformer``.
        norm_position: "pre" by default (GPT-2, nanoGPT), or "post" (the paper).
        activation: "gelu" by default (GPT-2), or "relu".
        positional: "learned" by default (GPT-2), "sinusoidal" or "t2t".
        tie_embeddings: "none" (default) or "all"/"decoder" (both mean: the input embedding
            is the output projection, as in GPT-2 and nanoGPT).
        key_dim, value_dim, attention_dropout, layer_norm_epsilon, embeddings,
        embeddings_trainable: as in ``Transformer``.

    Call: ``model(ids)`` with ``(batch, length)`` ids -> logits ``(batch, length, vocab_size)``
    float32, position t depending only on ids[:, :t+1].

    Example:
    >>> g = GPT(vocab_size=65, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=16)
    >>> g(np.array([[5, 6, 7]])).shape
    (1, 3, 65)
    """

    def __init__(self, vocab_size, num_layers=4, d_model=128, num_heads=4, d_ff=512,
                 dropout=0.0, max_length=256, norm_position="pre", activation="gelu",
                 positional="learned", tie_embeddings="none", key_dim=None, value_dim=None,
                 attention_dropout=0.0, activation_dropout=0.0, layer_norm_epsilon=1e-5,
                 embeddings=None,
                 embeddings_trainable=True, **kwargs):
        super().__init__(**kwargs)
        self._check_common(d_model, num_heads, key_dim, norm_position, activation, positional,
                           max_length)
        check_choice("tie_embeddings", tie_embeddings, TIE_OPTIONS)
        self.vocab_size, self.num_layers = int(vocab_size), int(num_layers)
        self.d_model, self.num_heads, self.d_ff = int(d_model), int(num_heads), int(d_ff)
        self.dropout, self.attention_dropout = float(dropout), float(attention_dropout)
        self.activation_dropout = float(activation_dropout)
        self.max_length = int(max_length)
        self.norm_position, self.activation, self.positional = norm_position, activation, positional
        self.tie_embeddings = tie_embeddings
        self.key_dim = int(key_dim) if key_dim else self.d_model // self.num_heads
        self.value_dim = int(value_dim) if value_dim else self.key_dim
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.embeddings_trainable = bool(embeddings_trainable)

        self.token_embedding = self._token_embedding(self.vocab_size, embeddings,
                                                     "token_embedding")
        self.positions = self._positions("positions")
        self.embedding_dropout = keras.layers.Dropout(self.dropout)
        self.blocks = self._decoder_stack(self.num_layers, cross_attention=False, prefix="block")
        self.final_norm = self._final_norm("final_norm")
        self.output_projection = (None if tie_embeddings != "none" else
                                  LogitsProjection(self.vocab_size, name="output_projection"))

    def build(self, input_shape=None):
        hidden = (None, None, self.d_model)
        self.token_embedding.build(None)
        self.positions.build(None)
        for block in self.blocks:
            block.build(hidden)
        for layer in (self.final_norm, self.output_projection):
            if layer is not None:
                layer.build(hidden)
        self.built = True

    def call(self, ids, training=None, caches=None, cache_index=None,
             return_attention_scores=False):
        """Logits ``(batch, len, vocab)``; with ``caches``, ``ids`` are the new positions from
        ``cache_index`` on and ``(logits, new_caches)`` is returned."""
        if caches is None:
            ids = check_token_ids(ids, self.vocab_size, self.max_length, "ids")
        start = 0 if cache_index is None else cache_index
        x = self._embed(ids, self.token_embedding, self.positions, start_index=start,
                        training=training)
        mask = None if caches is not None else self._padding_mask(ids)
        out = self._run_decoder(x, mask, self.blocks, self.final_norm, caches=caches,
                                cache_index=cache_index, training=training,
                                return_attention_scores=return_attention_scores)
        out = out if isinstance(out, tuple) else (out,)
        if self.output_projection is not None:
            logits = self.output_projection(out[0])
        else:
            logits = self.token_embedding(out[0], reverse=True)
        logits = ops.cast(logits, "float32")
        return (logits, *out[1:]) if len(out) > 1 else logits

    def init_caches(self, batch_size, max_length, dtype="float32"):
        """Empty per-layer key/value caches for up to ``max_length`` positions."""
        if max_length > self.max_length:
            raise ValueError(f"cannot decode {max_length} tokens: max_length={self.max_length}")
        self._ensure_built()
        return [block.init_cache(batch_size, max_length, dtype=dtype) for block in self.blocks]

    def attention_scores(self, ids):
        """``{"self": [ (batch, heads, len, len) per layer ]}``."""
        _, scores = self(ids, return_attention_scores=True)
        return {"self": [s["self"] for s in scores]}

    def components(self):
        return {"embeddings": [self.token_embedding, self.positions],
                "decoder": self.blocks + [n for n in [self.final_norm] if n],
                "output_head": [self.output_projection] if self.output_projection else []}

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size, num_layers=self.num_layers, d_model=self.d_model,
            num_heads=self.num_heads, d_ff=self.d_ff, dropout=self.dropout,
            max_length=self.max_length, norm_position=self.norm_position,
            activation=self.activation, positional=self.positional,
            tie_embeddings=self.tie_embeddings, key_dim=self.key_dim, value_dim=self.value_dim,
            attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout,
            layer_norm_epsilon=self.layer_norm_epsilon,
            embeddings_trainable=self.embeddings_trainable)
        return config
