"""Encoder-only Transformer (BERT-like): hidden states, pooled output, classifier head."""

import keras
from keras import ops

from transformerkit.layers.dropout import apply_dropout
from transformerkit.layers.masks import padding_mask
from transformerkit.models.base import TransformerBase, check_token_ids
from transformerkit.models.options import EncoderOptions


@keras.saving.register_keras_serializable(package="transformerkit")
class Encoder(TransformerBase):
    """A stack of encoder blocks over token (+ position, + token-type) embeddings.

    Args:
        vocab_size: int (id 0 is padding).
        num_layers, d_model, num_heads, d_ff, dropout, max_length, norm_position, activation,
        positional, key_dim, value_dim, attention_dropout, layer_norm_epsilon, embeddings,
        embeddings_trainable, min_timescale, max_timescale: as in ``Transformer`` (defaults
        are the paper's).
        type_vocab_size: int, number of token types (segments); 0 = no type embedding.
        embedding_norm: bool, LayerNorm after summing the embeddings (BERT).
        scale_embeddings: bool, multiply token embeddings by sqrt(d_model) (paper: True,
            BERT: False).
        pooling: None (return hidden states), "cls" (BERT pooler: tanh Dense over the first
            token) or "mean" (mean over real tokens, as sentence-transformers).
        num_classes: int or None; with ``pooling``, adds a dropout + Dense classifier and the
            model returns class logits.

    Call: ``model(ids)`` or ``model((ids, token_type_ids))`` with ``(batch, length)`` ints.
    Returns hidden states ``(batch, length, d_model)``; with ``pooling``, ``(batch, d_model)``;
    with ``num_classes``, float32 logits ``(batch, num_classes)``.

    Example:
    >>> e = Encoder(vocab_size=100, num_layers=2, d_model=32, num_heads=4, d_ff=64)
    >>> e(np.array([[5, 6, 0]])).shape
    (1, 3, 32)
    """

    def __init__(self, vocab_size, num_layers=6, d_model=512, num_heads=8, d_ff=2048,
                 dropout=0.1, max_length=512, norm_position="post", activation="relu",
                 positional="sinusoidal", key_dim=None, value_dim=None, attention_dropout=0.0,
                 activation_dropout=0.0,
                 layer_norm_epsilon=1e-6, type_vocab_size=0, embedding_norm=False,
                 scale_embeddings=True, pooling=None, num_classes=None, embeddings=None,
                 embeddings_trainable=True, min_timescale=1.0, max_timescale=1.0e4,
                 **kwargs):
        super().__init__(**kwargs)
        self._set_options(EncoderOptions.from_arguments(locals()))

        self.token_embedding = self._token_embedding(self.vocab_size, embeddings,
                                                     "token_embedding", scale=self.scale_embeddings)
        self.positions = self._positions("positions")
        self.type_embedding = (keras.layers.Embedding(self.type_vocab_size, self.d_model,
                                                      name="type_embedding")
                               if self.type_vocab_size else None)
        self.embedding_layer_norm = (
            keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon,
                                            name="embedding_norm")
            if self.embedding_norm else None)
        self.embedding_dropout = keras.layers.Dropout(self.dropout)
        self.blocks = self._encoder_stack(self.num_layers, prefix="block")
        self.final_norm = self._final_norm("final_norm")
        self.pooler = (keras.layers.Dense(self.d_model, activation="tanh", name="pooler")
                       if self.pooling == "cls" else None)
        self.classifier = None
        if self.num_classes is not None:
            self.classifier_dropout = keras.layers.Dropout(self.dropout)
            self.classifier = keras.layers.Dense(self.num_classes, name="classifier")

    def build(self, input_shape=None):
        hidden = (None, None, self.d_model)
        self.token_embedding.build(None)
        self.positions.build(None)
        if self.type_embedding is not None:
            self.type_embedding.build((None, None))
        for layer in (self.embedding_layer_norm, self.final_norm):
            if layer is not None:
                layer.build(hidden)
        for block in self.blocks:
            block.build(hidden)
        if self.pooler is not None:
            self.pooler.build((None, self.d_model))
        if self.classifier is not None:
            self.classifier.build((None, self.d_model))
        self.built = True

    @classmethod
    def from_pretrained(cls, folder, pooling=None, num_classes=None, **overrides):
        """An Encoder with the architecture and weights of a local Hugging Face BERT or
        DistilBERT checkpoint folder (``config.json`` + safetensors or ``pytorch_model.bin``).

        Args:
            folder: path to the checkpoint folder.
            pooling: None (hidden states), "mean" (sentence-transformers mean pooling) or
                "cls" (BERT's tanh pooler, loaded from the checkpoint when present; new for
                DistilBERT, which has none).
            num_classes: int or None; adds a classification head (loaded when the
                checkpoint is a ``BertForSequenceClassification`` with as many labels;
                refused for a ``DistilBertForSequenceClassification``, whose ReLU head
                the Encoder cannot reproduce).
            **overrides: other constructor arguments, e.g. ``dropout=0.0``.

        The tokenizer of the folder loads with
        :func:`transformerkit.converters.bert.convert_tokenizer`. See
        :mod:`transformerkit.converters.bert` for the mapping and its errors.
        """
        from transformerkit.converters import bert
        from transformerkit.converters.hf_io import read_weights

        if cls is not Encoder:
            raise TypeError("from_pretrained builds an Encoder, not a subclass")
        config = bert.load_config(folder)
        weights = read_weights(folder)  # before building: a broken file fails fast
        encoder = Encoder(pooling=pooling, num_classes=num_classes,
                          **{**bert.convert_backbone_config(config), **overrides})
        return bert.convert_weights(encoder, folder, weights)

    def encode(self, ids, token_type_ids=None, training=None, return_attention_scores=False):
        """Hidden states ``(batch, length, d_model)`` (and per-layer scores if asked)."""
        ids = check_token_ids(ids, self.vocab_size, self.max_length, "ids")
        self._ensure_built()
        mask = self._padding_mask(ids)
        x = self.positions(self.token_embedding(ids))
        if self.type_embedding is not None:
            if token_type_ids is None:
                token_type_ids = ops.zeros_like(ids)
            else:
                token_type_ids = check_token_ids(token_type_ids, self.type_vocab_size,
                                                 self.max_length, "token_type_ids")
            x = x + ops.cast(self.type_embedding(token_type_ids), x.dtype)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids given, but the model has type_vocab_size=0")
        if self.embedding_layer_norm is not None:
            x = self.embedding_layer_norm(x)
        x = apply_dropout(self.embedding_dropout, x, training)
        return self._run_encoder(x, mask, self.blocks, self.final_norm, training,
                                 return_attention_scores)

    def pool(self, hidden, mask):
        """``(batch, length, d_model)`` -> ``(batch, d_model)`` by the configured pooling."""
        if self.pooling == "cls":
            return self.pooler(hidden[:, 0, :])
        return mean_pool(hidden, mask)

    def call(self, inputs, training=None, return_logits=True):
        """Hidden states ``(batch, len, d_model)``; with ``pooling`` ``(batch, d_model)``;
        with ``num_classes`` the class logits ``(batch, num_classes)``, or with
        ``return_logits=False`` their softmax, the class probabilities."""
        ids, token_type_ids = _unpack_inputs(inputs)
        hidden = self.encode(ids, token_type_ids, training=training)
        if self.pooling is None:
            return hidden
        pooled = self.pool(hidden, padding_mask(ids))
        if self.classifier is None:
            return pooled
        logits = self.classifier(apply_dropout(self.classifier_dropout, pooled, training))
        logits = ops.cast(logits, "float32")
        return logits if return_logits else ops.softmax(logits, axis=-1)

    def attention_scores(self, ids, token_type_ids=None):
        """``{"self": [ (batch, heads, len, len) per layer ]}``."""
        _, scores = self.encode(ids, token_type_ids, return_attention_scores=True)
        return {"self": scores}

    def components(self):
        embeddings = [self.token_embedding, self.positions]
        embeddings += [x for x in (self.type_embedding, self.embedding_layer_norm) if x]
        return {"embeddings": embeddings,
                "encoder": self.blocks + [n for n in [self.final_norm] if n],
                "output_head": [x for x in (self.pooler, self.classifier) if x]}


def mean_pool(hidden, mask):
    """Mean of the hidden states of the real tokens (sentence-transformers' mean pooling):
    ``(batch, length, d)`` and ``(batch, length)`` bool/0-1 mask -> ``(batch, d)``."""
    weights = ops.cast(ops.expand_dims(mask, -1), hidden.dtype)  # (b, t, 1)
    total = ops.sum(hidden * weights, axis=1)
    return total / ops.maximum(ops.sum(weights, axis=1), ops.cast(1e-9, hidden.dtype))


def _unpack_inputs(inputs):
    if isinstance(inputs, dict):
        unknown = set(inputs) - {"token_ids", "token_type_ids"}
        if unknown or "token_ids" not in inputs:
            raise ValueError("Encoder inputs as a dict take 'token_ids' and optionally "
                             f"'token_type_ids'; got {sorted(inputs)}")
        return inputs["token_ids"], inputs.get("token_type_ids")
    if isinstance(inputs, (list, tuple)):
        if len(inputs) != 2:
            raise ValueError("Encoder expects ids or (ids, token_type_ids)")
        return inputs[0], inputs[1]
    return inputs, None
