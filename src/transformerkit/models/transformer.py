"""The encoder-decoder Transformer of "Attention Is All You Need" (paper figure 1)."""


import keras
from keras import ops

from transformerkit import fastpath
from transformerkit.layers.calls import call_sublayer, normalize
from transformerkit.models.base import (
    TransformerBase,
    check_token_ids,
    select_positions,
    stack_step_weights,
)
from transformerkit.models.heads import LogitsBias, LogitsProjection
from transformerkit.models.options import TransformerOptions
from transformerkit.special_tokens import PAD_ID


@keras.saving.register_keras_serializable(package="transformerkit")
class Transformer(TransformerBase):
    """Encoder-decoder Transformer for sequence-to-sequence tasks.

    Args:
        source_vocab_size, target_vocab_size: int vocabulary sizes (id 0 is padding).
        num_layers: int, encoder and decoder layers (6 in the paper).
        d_model: int, model width (512). num_heads: int (8). d_ff: int, inner FFN width (2048).
        dropout: float, residual/embedding dropout (0.1).
        max_length: int, longest source or target sequence accepted.
        norm_position: "post" (paper) or "pre". activation: "relu" (paper), "gelu"
            or "gelu_tanh".
        positional: "sinusoidal" (paper), "t2t" or "learned".
        min_timescale, max_timescale: the fixed tables' timescales (t2t: both; sinusoidal:
            the paper's 10000 is ``max_timescale``; see ``layers.embeddings.sinusoidal_table``).
        tie_embeddings: "none"; "decoder" (target embedding = output projection, paper
            section 3.4); "all" (source and target embeddings and the projection share one
            matrix, which needs one shared vocabulary).
        key_dim, value_dim: per-head widths (default d_model // num_heads).
        num_decoder_layers: int, default ``num_layers``.
        attention_dropout: float, dropout on attention weights (0.0, as in the paper).
        activation_dropout: float, dropout inside the feed-forward network (0.0, as in the
            paper; tensor2tensor's relu_dropout).
        layer_norm_epsilon: float (1e-6, as in the reference implementation).
        source_embeddings, target_embeddings: optional pretrained ``(vocab, d_model)`` arrays.
        embeddings_trainable: bool, False freezes the embedding matrices.
        source_embeddings_trainable, target_embeddings_trainable: bool or None (default:
            ``embeddings_trainable``), freeze or train one embedding on its own.
        projection_trainable: bool or None, False freezes the output projection (default:
            trainable; with tied embeddings it is the target embedding and follows it).
        scale_embeddings: bool, multiply the token embeddings by sqrt(d_model) (True, paper
            section 3.4; Marian checkpoints with ``scale_embedding: false`` do not).
        final_logits_bias: bool, add a frozen bias vector to the logits (False; Marian's and
            BART's ``final_logits_bias``, a buffer that ``transformers`` never trains, so it
            stays frozen here too: fine-tuning changes the same weights in both). With
            ``tie_embeddings="none"`` it takes the place of the output projection's bias.

    Call: ``model((source_ids, target_input_ids))`` with ``(batch, source_len)`` and
    ``(batch, target_len)`` int ids -> logits ``(batch, target_len, target_vocab_size)``
    in float32, carrying no Keras mask.

    Example:
    >>> m = Transformer(100, 100, num_layers=2, d_model=32, num_heads=4, d_ff=64)
    >>> m((np.array([[5, 6, 0]]), np.array([[1, 7]]))).shape
    (1, 2, 100)
    """

    takes_logit_positions = True

    def __init__(self, source_vocab_size, target_vocab_size, num_layers=6, d_model=512,
                 num_heads=8, d_ff=2048, dropout=0.1, max_length=256, norm_position="post",
                 activation="relu", positional="sinusoidal", tie_embeddings="none",
                 key_dim=None, value_dim=None, num_decoder_layers=None, attention_dropout=0.0,
                 activation_dropout=0.0,
                 layer_norm_epsilon=1e-6, source_embeddings=None, target_embeddings=None,
                 embeddings_trainable=True, min_timescale=1.0, max_timescale=1.0e4,
                 source_embeddings_trainable=None, target_embeddings_trainable=None,
                 projection_trainable=None, scale_embeddings=True, final_logits_bias=False,
                 **kwargs):
        super().__init__(**kwargs)
        self._set_options(TransformerOptions.from_arguments(locals()))
        source_trainable, target_trainable, projection_trainable = \
            self.options.trainable_parts()

        self.source_embedding = self._token_embedding(
            self.source_vocab_size, source_embeddings, "source_embedding",
            scale=self.scale_embeddings, trainable=source_trainable)
        if self.tie_embeddings == "all":
            if target_embeddings is not None:
                raise ValueError("tie_embeddings='all' uses one matrix: pass source_embeddings "
                                 "only")
            self.target_embedding = self.source_embedding
        else:
            self.target_embedding = self._token_embedding(
                self.target_vocab_size, target_embeddings, "target_embedding",
                scale=self.scale_embeddings, trainable=target_trainable)
        self.source_positions = self._positions("source_positions")
        self.target_positions = self._positions("target_positions")
        self.embedding_dropout = keras.layers.Dropout(self.dropout)
        self.encoder_blocks = self._encoder_stack(self.num_layers)
        self.decoder_blocks = self._decoder_stack(self.num_decoder_layers, cross_attention=True)
        self.encoder_norm = self._final_norm("encoder_norm")
        self.decoder_norm = self._final_norm("decoder_norm")
        self.output_projection = (
            None if self.tie_embeddings != "none"
            else LogitsProjection(self.target_vocab_size, name="output_projection",
                                  use_bias=not self.final_logits_bias,
                                  trainable=projection_trainable))
        self.logits_bias = (LogitsBias(self.target_vocab_size, name="final_logits_bias")
                            if self.final_logits_bias else None)

    @classmethod
    def from_pretrained(cls, folder, **overrides):
        """A Transformer with the architecture and weights of a local Hugging Face Marian
        (OPUS-MT) checkpoint folder (``config.json`` with ``model_type: marian`` +
        safetensors or ``pytorch_model.bin``).

        Args:
            folder: path to the checkpoint folder.
            **overrides: other constructor arguments, e.g. ``dropout=0.0`` (the
                architecture's own must keep the config's values, or the weights do not
                fit).

        Its ids are Marian's reordered so that 0..3 are ``<pad> <s> </s> <unk>``
        (:class:`transformerkit.converters.marian_ids.MarianIds`); the folder's tokenizers
        load in these ids with :func:`transformerkit.converters.marian.convert_tokenizer`.
        See :mod:`transformerkit.converters.marian` for the mapping, the options and what is
        refused (a ``CheckpointError`` naming the key).
        """
        from transformerkit.converters import marian
        from transformerkit.converters.hf_io import read_weights

        if cls is not Transformer:
            raise TypeError("from_pretrained builds a Transformer, not a subclass")
        config = marian.load_config(folder)
        weights = read_weights(folder)  # before building: a broken file fails fast
        model = Transformer(**{**marian.convert_backbone_config(config), **overrides})
        return marian.convert_weights(model, folder, weights, config)

    def build(self, input_shape=None):
        hidden = (None, None, self.d_model)
        for layer in (self.source_embedding, self.target_embedding, self.source_positions,
                      self.target_positions):
            if not layer.built:
                layer.build(None)
        for block in self.encoder_blocks:
            block.build(hidden)
        for block in self.decoder_blocks:
            block.build(hidden, hidden)
        if self.logits_bias is not None and not self.logits_bias.built:
            self.logits_bias.build(None)
        for norm in (self.encoder_norm, self.decoder_norm, self.output_projection):
            if norm is not None:
                norm.build(hidden)
        self.built = True

    # -- the two halves -------------------------------------------------------------------
    def encode(self, source_ids, training=None, return_attention_scores=False):
        """``(batch, source_len)`` ids -> memory ``(batch, source_len, d_model)`` (+ scores)."""
        self._ensure_built()
        source_ids = check_token_ids(source_ids, self.source_vocab_size, self.max_length,
                                     "source_ids")
        mask = self._padding_mask(source_ids)
        x = self._embed(source_ids, self.source_embedding, self.source_positions,
                        training=training)
        return self._run_encoder(x, mask, self.encoder_blocks, self.encoder_norm, training,
                                 return_attention_scores)

    # -- The fast twin of ``encode`` at inference (eager PyTorch), beside ``decode_step``. --

    def _gather_step_weights(self, precision, packed):
        """:meth:`TransformerBase.step_weights` with the encoder's under ``"encoder"`` (for
        :meth:`inference_encode`), every product packed for ``precision``."""
        weights = super()._gather_step_weights(precision, packed)
        weights["encoder"] = stack_step_weights(self.source_embedding, self.source_positions,
                                                self.encoder_blocks, self.encoder_norm,
                                                precision, packed)
        return weights

    def inference_encode(self, source_ids, weights):
        """:meth:`encode` at inference with the products of ``weights``
        (:meth:`step_weights`, at their precision): ``(batch, source_len)`` torch ids ->
        memory ``(batch, source_len, d_model)``. Equal to :meth:`encode` at the real
        positions (float32: to round-off; padded positions are never read by the decoder)."""
        import torch

        encoder = weights["encoder"]
        captured = fastpath.exporting()  # a graph for any ids: checked before its call
        if not captured:
            source_ids = torch.as_tensor(check_token_ids(source_ids, self.source_vocab_size,
                                                         self.max_length, "source_ids"),
                                         device=encoder["embedding"].device)
        length = source_ids.shape[1]
        x = encoder["embedding"][source_ids.long()] * encoder["embedding_scale"] + \
            encoder["positions"][:length]  # embedding dropout is off
        mask = source_ids != PAD_ID  # (batch, source_len), as padding_mask
        mask = None if not captured and bool(mask.all()) else mask
        for block, block_weights in zip(self.encoder_blocks, encoder["blocks"], strict=True):
            x = block.inference_call(x, block_weights, mask)
        return x if encoder["final_norm"] is None else normalize(x, encoder["final_norm"])

    def decode(self, target_ids, memory, source_mask, caches=None, cache_index=None,
               training=None, return_attention_scores=False, logit_positions=None):
        """Decoder pass -> logits ``(batch, target_len, target_vocab_size)`` float32.

        Args:
            target_ids: ``(batch, target_len)`` decoder input ids; with ``caches``, the new
                positions only (usually one), starting at ``cache_index``.
            memory: ``(batch, source_len, d_model)`` from :meth:`encode`, or None when the
                caches hold the cross-attention keys/values.
            source_mask: ``(batch, source_len)`` bool, True at real source tokens.
            caches: list of per-layer caches from :meth:`init_caches`, or None.
            cache_index: position of ``target_ids[:, 0]`` (int or scalar tensor).
            logit_positions: None, or ``(n,)`` int positions in the flattened ``(batch *
                target_len)`` positions: the logits of those only, ``(n, target_vocab)``
                (the training step's loss on real tokens; see ``training/step.py``).

        Returns logits, then per-layer score dicts if asked, then the updated caches.
        """
        self._ensure_built()
        if caches is None:
            target_ids = check_token_ids(target_ids, self.target_vocab_size, self.max_length,
                                         "target_ids")
        start = 0 if cache_index is None else cache_index
        x = self._embed(target_ids, self.target_embedding, self.target_positions,
                        start_index=start, training=training)
        mask = None if caches is not None else self._padding_mask(target_ids)
        out = self._run_decoder(x, mask, self.decoder_blocks, self.decoder_norm, memory,
                                source_mask, caches, cache_index, training,
                                return_attention_scores)
        out = out if isinstance(out, tuple) else (out,)
        logits = self._logits(select_positions(out[0], logit_positions))
        return (logits, *out[1:]) if len(out) > 1 else logits

    def init_caches(self, memory, max_length):
        """Per-layer key/value caches for incremental decoding of up to ``max_length`` tokens.

        The cross-attention keys/values of ``memory`` are computed here, once per source.
        """
        if max_length > self.max_length:
            raise ValueError(f"cannot decode {max_length} tokens: max_length={self.max_length}")
        self._ensure_built()
        batch = ops.shape(memory)[0]
        return [block.init_cache(batch, max_length, memory, dtype=memory.dtype)
                for block in self.decoder_blocks]

    def _logits(self, hidden):
        if self.output_projection is not None:
            logits = call_sublayer(self.output_projection, hidden)
        else:
            logits = call_sublayer(self.target_embedding, hidden, reverse=True)
        if self.logits_bias is not None:
            logits = call_sublayer(self.logits_bias, logits)
        return ops.cast(logits, "float32")

    def call(self, inputs, training=None, return_logits=True, logit_positions=None):
        """Logits ``(batch, target_len, target_vocab)``; ``return_logits=False``: the
        probabilities, their softmax over the vocabulary; ``logit_positions``: those of
        the flat positions given only, ``(n, target_vocab)`` (see :meth:`decode`)."""
        source_ids, target_ids = _unpack_pair(inputs)
        memory = self.encode(source_ids, training=training)
        logits = self.decode(target_ids, memory, self._padding_mask(source_ids),
                             training=training, logit_positions=logit_positions)
        return logits if return_logits else ops.softmax(logits, axis=-1)

    def attention_scores(self, source_ids, target_ids):
        """Attention weights for plotting: dict of lists (one per layer) of
        ``(batch, heads, query_len, key_len)``: "encoder", "decoder_self", "cross"."""
        memory, encoder_scores = self.encode(source_ids, return_attention_scores=True)
        _, decoder_scores = self.decode(target_ids, memory, self._padding_mask(source_ids),
                                        return_attention_scores=True)
        return {"encoder": encoder_scores,
                "decoder_self": [s["self"] for s in decoder_scores],
                "cross": [s["cross"] for s in decoder_scores]}

    def _decoder_parts(self):
        return (self.target_embedding, self.target_positions, self.decoder_blocks,
                self.decoder_norm, self.output_projection)

    def _logits_bias_weight(self):
        return None if self.logits_bias is None else self.logits_bias.bias

    def components(self):
        embeddings = [self.source_embedding, self.source_positions, self.target_positions]
        if self.target_embedding is not self.source_embedding:
            embeddings.insert(1, self.target_embedding)
        return {
            "embeddings": embeddings,
            "encoder": self.encoder_blocks + [n for n in [self.encoder_norm] if n],
            "decoder": self.decoder_blocks + [n for n in [self.decoder_norm] if n],
            "output_head": [layer for layer in (self.output_projection, self.logits_bias)
                            if layer is not None],
        }


def _unpack_pair(inputs):
    if isinstance(inputs, dict):
        try:
            return inputs["source"], inputs["target"]
        except KeyError as err:
            raise ValueError("Transformer inputs as a dict need keys 'source' and 'target'; "
                             f"got {sorted(inputs)}") from err
    if isinstance(inputs, (list, tuple)) and len(inputs) == 2:
        return inputs
    raise ValueError("Transformer expects inputs (source_ids, target_input_ids); got "
                     f"{type(inputs).__name__}")
