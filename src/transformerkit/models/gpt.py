"""GPT: a decoder-only causal language model built from the same blocks."""

import math

import keras
from keras import ops

from transformerkit.layers.calls import call_sublayer
from transformerkit.models.base import TransformerBase, check_token_ids, select_positions
from transformerkit.models.heads import LogitsProjection
from transformerkit.models.options import GPTOptions


@keras.saving.register_keras_serializable(package="transformerkit")
class GPT(TransformerBase):
    """Decoder-only Transformer language model (a stack of causal self-attention blocks).

    Args:
        vocab_size: int (id 0 is padding).
        num_layers, d_model, num_heads, d_ff, dropout, max_length: as in ``Transformer``.
        norm_position: "pre" by default (GPT-2, nanoGPT), or "post" (the paper).
        activation: "gelu" by default, "gelu_tanh" (GPT-2's own tanh approximation), or
            "relu".
        positional: "learned" by default (GPT-2), "sinusoidal" or "t2t".
        min_timescale, max_timescale: the fixed tables' timescales, as in ``Transformer``.
        tie_embeddings: "none" (default) or "all"/"decoder" (both mean: the input embedding
            is the output projection, as in GPT-2 and nanoGPT).
        key_dim, value_dim, attention_dropout, layer_norm_epsilon, embeddings,
        embeddings_trainable, projection_trainable: as in ``Transformer``.
        scale_embeddings: multiply token embeddings by sqrt(d_model) (the paper: True;
            GPT-2 and nanoGPT: False, the default).
        initialization: "gpt2" (default): every matrix drawn from N(0, 0.02), the residual
            output projections (attention output, feed-forward outer) from
            N(0, 0.02 / sqrt(2 * num_layers)), biases zero (GPT-2, nanoGPT); "paper": the
            layers' own initializers (Glorot uniform, embeddings N(0, d_model^-0.5)).
            On tiny Shakespeare with nanoGPT's CPU recipe, GPT-2's choices reach a lower
            validation loss (``bench/gpt_vs_nanogpt.py``).
        use_bias: biases in every projection and offsets in every LayerNorm (default True;
            nanoGPT's ``bias=False``, GPT-2 without biases, is ``use_bias=False``).

    Call: ``model(ids)`` with ``(batch, length)`` ids -> logits ``(batch, length, vocab_size)``
    float32, position t depending only on ids[:, :t+1].

    Example:
    >>> g = GPT(vocab_size=65, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=16)
    >>> g(np.array([[5, 6, 7]])).shape
    (1, 3, 65)
    """

    takes_logit_positions = True

    def __init__(self, vocab_size, num_layers=4, d_model=128, num_heads=4, d_ff=512,
                 dropout=0.0, max_length=256, norm_position="pre", activation="gelu",
                 positional="learned", tie_embeddings="none", key_dim=None, value_dim=None,
                 attention_dropout=0.0, activation_dropout=0.0, layer_norm_epsilon=1e-5,
                 embeddings=None, embeddings_trainable=True, scale_embeddings=False,
                 initialization="gpt2", use_bias=True, min_timescale=1.0,
                 max_timescale=1.0e4, projection_trainable=None, **kwargs):
        super().__init__(**kwargs)
        self._set_options(GPTOptions.from_arguments(locals()))
        self._pretrained_embeddings = embeddings is not None

        self.token_embedding = self._token_embedding(self.vocab_size, embeddings,
                                                     "token_embedding", scale=self.scale_embeddings)
        self.positions = self._positions("positions")
        self.embedding_dropout = keras.layers.Dropout(self.dropout)
        self.blocks = self._decoder_stack(self.num_layers, cross_attention=False, prefix="block")
        self.final_norm = self._final_norm("final_norm")
        self.output_projection = (None if self.tie_embeddings != "none" else
                                  LogitsProjection(self.vocab_size, use_bias=self.use_bias,
                                                   name="output_projection",
                                                   trainable=projection_trainable is not False))
        if self.initialization == "gpt2":
            # built now: Keras' own first build can be symbolic, where assignments are lost
            self.build(None)
            self._gpt2_initialization()

    @classmethod
    def from_pretrained(cls, folder, **overrides):
        """A GPT with the architecture and weights of a local Hugging Face GPT-2 folder
        (``GPT2LMHeadModel``: ``config.json`` + safetensors or ``pytorch_model.bin``).

        ``**overrides``: other constructor arguments, e.g. ``dropout=0.0``. Its ids are
        GPT-2's + 2 (``<pad>`` and ``<s>`` first; a folder exported from a run keeps its
        ids); the folder's tokenizer loads with the same ids with
        :func:`transformerkit.converters.gpt2.convert_tokenizer`. See
        :mod:`transformerkit.converters.gpt2` for the mapping and what is refused.
        """
        from transformerkit.converters import gpt2
        from transformerkit.converters.hf_io import read_weights

        if cls is not GPT:
            raise TypeError("from_pretrained builds a GPT, not a subclass")
        config = gpt2.load_config(folder)
        weights = read_weights(folder)  # before building: a broken file fails fast
        offset = gpt2.folder_offset(folder)
        gpt = GPT(**{**gpt2.convert_backbone_config(config, offset), **overrides})
        return gpt2.convert_weights(gpt, folder, weights, offset)

    def build(self, input_shape=None):
        if self.built:  # built at construction (GPT-2 initialisation)
            return
        hidden = (None, None, self.d_model)
        self.token_embedding.build(None)
        self.positions.build(None)
        for block in self.blocks:
            block.build(hidden)
        for layer in (self.final_norm, self.output_projection):
            if layer is not None:
                layer.build(hidden)
        self.built = True

    def _gpt2_initialization(self):
        """Redraw the matrices as GPT-2 does (see the class docstring); pretrained token
        embeddings and the learned positions (already N(0, 0.02)) are kept."""
        residual_std = 0.02 / math.sqrt(2 * self.num_layers)
        kernels = [(self.output_projection.kernel, 0.02)] if self.output_projection else []
        if not self._pretrained_embeddings:
            kernels.append((self.token_embedding.embeddings, 0.02))
        for block in self.blocks:
            attention = block.self_attention
            kernels += [(attention.query_dense.kernel, 0.02), (attention.key_dense.kernel, 0.02),
                        (attention.value_dense.kernel, 0.02),
                        (attention.output_dense.kernel, residual_std),
                        (block.feedforward.inner.kernel, 0.02),
                        (block.feedforward.outer.kernel, residual_std)]
        for variable, std in kernels:
            draw = keras.initializers.RandomNormal(stddev=std)
            variable.assign(draw(variable.shape, dtype=variable.dtype))

    def call(self, ids, training=None, caches=None, cache_index=None,
             return_attention_scores=False, return_logits=True, logit_positions=None):
        """Logits ``(batch, len, vocab)`` (``return_logits=False``: their softmax, the
        probabilities); with ``caches``, ``ids`` are the new positions from ``cache_index``
        on and ``(logits, new_caches)`` is returned. ``logit_positions``: None, or ``(n,)``
        int positions in the flattened ``(batch * len)`` positions: the logits of those
        only, ``(n, vocab)`` (the training step's loss on real tokens)."""
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
        hidden = select_positions(out[0], logit_positions)
        if self.output_projection is not None:
            logits = call_sublayer(self.output_projection, hidden)
        else:
            logits = call_sublayer(self.token_embedding, hidden, reverse=True)
        logits = ops.cast(logits, "float32")
        if not return_logits:
            logits = ops.softmax(logits, axis=-1)
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

    def _decoder_parts(self):
        return (self.token_embedding, self.positions, self.blocks, self.final_norm,
                self.output_projection)

    def components(self):
        return {"embeddings": [self.token_embedding, self.positions],
                "decoder": self.blocks + [n for n in [self.final_norm] if n],
                "output_head": [self.output_projection] if self.output_projection else []}
