"""Pieces shared by the three models: input checks, embedding, the block stacks, caches."""

import keras
import numpy as np

from transformerkit.layers import (
    DecoderBlock,
    EncoderBlock,
    PositionalEncoding,
    TokenEmbedding,
    calls,
    padding_mask,
)
from transformerkit.layers.blocks import NORM_POSITIONS
from transformerkit.layers.calls import call_sublayer
from transformerkit.layers.dropout import apply_dropout
from transformerkit.layers.embeddings import POSITIONAL_KINDS
from transformerkit.layers.feedforward import ACTIVATIONS

TIE_OPTIONS = ("none", "decoder", "all")
_INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def check_choice(name, value, choices):
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def check_token_ids(ids, vocab_size, max_length, name="token_ids"):
    """Validate ``(batch, length)`` token ids where they enter a model.

    Always checks rank, integer dtype and length <= ``max_length``; checks that every id is
    in ``[0, vocab_size)`` whenever the values are concrete (eager calls, NumPy input), i.e.
    everywhere except inside a compiled graph. Raises ``TypeError``/``ValueError`` naming
    the problem instead of failing deep inside a backend (or, on JAX, silently clipping).
    """
    if isinstance(ids, (list, tuple)):
        ids = np.asarray(ids)
    dtype = keras.backend.standardize_dtype(ids.dtype)
    if dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must be integer token ids, got dtype {dtype}")
    if len(ids.shape) != 2:
        raise ValueError(f"{name} must have shape (batch, length), got shape {tuple(ids.shape)}")
    length = ids.shape[1]
    if length is not None and length > max_length:
        raise ValueError(f"{name} has length {length}, longer than max_length={max_length} of "
                         "this model; truncate the input or build the model with a larger "
                         "max_length")
    values = _concrete_numpy(ids)
    if values is not None and values.size:
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{name} contains id {bad}, outside the vocabulary [0, {vocab_size})")
    return ids


def _concrete_numpy(x):
    """NumPy value of ``x`` if it is concrete (not symbolic or traced), else None."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, keras.KerasTensor):
        return None
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):
            return None
    elif backend == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly() or not hasattr(x, "numpy"):
            return None
    elif backend == "torch":
        import torch

        if torch.compiler.is_compiling():
            return None
    return keras.ops.convert_to_numpy(x)


class TransformerBase(keras.Model):
    """Shared constructor checks and building blocks of ``Transformer``, ``GPT``, ``Encoder``."""

    use_bias = True  # projection biases and LayerNorm offsets (a GPT may turn them off)

    def train_step(self, *args):
        """One optimisation step on a batch (``model.fit`` calls it): Keras' own step, and on
        eager PyTorch the same step with less Python around it.

        Keras' PyTorch ``train_step`` walks the layer tree for the trainable weights twice,
        ``torch.nn.Module.zero_grad`` walks it once more, and ``Model.__call__`` adds its
        per-call bookkeeping (see :func:`transformerkit.layers.calls.call_sublayer`): about
        0.5 ms of a small GPT's ~30 ms CPU step. Here the weights are listed once, their
        gradients reset to None before the backward pass (what ``zero_grad`` does), and the
        model is called through ``call_sublayer`` after clearing the losses of the previous
        call (what the outermost ``__call__`` does). The loss (``compile``'s, with any layer
        losses), loss scaling, optimizer update, loss tracker and metrics are Keras' own, so
        every number is the same (``tests/test_fast_paths.py``). Under ``jit_compile``
        (``torch.compile``), on JAX and TensorFlow and with
        :data:`transformerkit.layers.calls.FAST_CALLS` off, it is Keras' ``train_step``
        (JAX's takes ``(state, data)``, the others ``(data)``).
        """
        if not (calls.FAST_CALLS and keras.backend.backend() == "torch" and not self.jit_compile
                and self.optimizer is not None):
            return super().train_step(*args)
        weights = self.trainable_weights
        if not weights:
            return super().train_step(*args)  # Keras warns
        import torch

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(*args)
        self._clear_losses()
        y_pred = call_sublayer(self, x, training=True)
        for variable in weights:
            variable.value.grad = None
        loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                  training=True)
        batch_size = next(t for t in keras.tree.flatten(x) if t is not None).shape[0]
        self._loss_tracker.update_state(loss, sample_weight=batch_size)
        self.optimizer.scale_loss(loss).backward()
        with torch.no_grad():
            self.optimizer.apply([v.value.grad for v in weights], weights)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _check_common(self, d_model, num_heads, key_dim, norm_position, activation, positional,
                      max_length):
        check_choice("norm_position", norm_position, NORM_POSITIONS)
        check_choice("activation", activation, ACTIVATIONS)
        check_choice("positional", positional, POSITIONAL_KINDS)
        if key_dim is None and d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                             "choose another num_heads or set key_dim explicitly")
        if int(max_length) < 1:
            raise ValueError(f"max_length must be positive, got {max_length}")

    def _block_kwargs(self):
        return dict(d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
                    dropout=self.dropout, norm_position=self.norm_position,
                    activation=self.activation, key_dim=self.key_dim, value_dim=self.value_dim,
                    attention_dropout=self.attention_dropout,
                    activation_dropout=self.activation_dropout,
                    layer_norm_epsilon=self.layer_norm_epsilon, use_bias=self.use_bias)

    def _token_embedding(self, vocab_size, pretrained, name, scale=True):
        embedding = TokenEmbedding(vocab_size, self.d_model, scale=scale, pretrained=pretrained,
                                   name=name)
        embedding.trainable = self.embeddings_trainable
        return embedding

    def _positions(self, name):
        return PositionalEncoding(self.max_length, self.d_model, self.positional, name=name)

    def _encoder_stack(self, num_layers, prefix="encoder"):
        return [EncoderBlock(**self._block_kwargs(), name=f"{prefix}_block_{i}")
                for i in range(num_layers)]

    def _decoder_stack(self, num_layers, cross_attention, prefix="decoder"):
        return [DecoderBlock(**self._block_kwargs(), cross_attention=cross_attention,
                             name=f"{prefix}_block_{i}") for i in range(num_layers)]

    def _final_norm(self, name):
        if self.norm_position != "pre":
            return None
        return keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon,
                                               center=self.use_bias, name=name)

    def _ensure_built(self):
        """Methods other than ``call`` (``encode``, ``init_caches``) may run first."""
        if not self.built:
            self.build(None)

    def _embed(self, ids, token_embedding, positions, start_index=0, training=None):
        """``(batch, len)`` ids -> ``(batch, len, d_model)``: embed, add positions, dropout."""
        x = call_sublayer(positions, call_sublayer(token_embedding, ids), start_index=start_index)
        return apply_dropout(self.embedding_dropout, x, training)

    def _run_encoder(self, x, mask, blocks, final_norm, training=None,
                     return_attention_scores=False):
        """Encoder stack over ``(batch, len, d_model)`` with ``(batch, len)`` padding mask."""
        scores = []
        for block in blocks:
            out = call_sublayer(block, x, mask=mask,
                                return_attention_scores=return_attention_scores,
                                training=training)
            x, s = out if return_attention_scores else (out, None)
            scores.append(s)
        if final_norm is not None:
            x = call_sublayer(final_norm, x)
        return (x, scores) if return_attention_scores else x

    def _run_decoder(self, x, mask, blocks, final_norm, context=None, context_mask=None,
                     caches=None, cache_index=None, training=None,
                     return_attention_scores=False):
        """Decoder stack; returns hidden states, then per-layer scores and new caches if used."""
        scores, new_caches = [], []
        for i, block in enumerate(blocks):
            kwargs = {}
            if caches is not None:
                kwargs.update(cache=caches[i], cache_index=cache_index)
            out = call_sublayer(block, x, context, inputs_mask=mask, context_mask=context_mask,
                                return_attention_scores=return_attention_scores,
                                training=training, **kwargs)
            out = out if isinstance(out, tuple) else (out,)
            x = out[0]
            if return_attention_scores:
                scores.append(out[1])
            if caches is not None:
                new_caches.append(out[-1])
        if final_norm is not None:
            x = call_sublayer(final_norm, x)
        results = (x,)
        if return_attention_scores:
            results += (scores,)
        if caches is not None:
            results += (new_caches,)
        return results[0] if len(results) == 1 else results

    @staticmethod
    def _padding_mask(ids):
        """``(batch, len)`` bool mask of the real tokens of ``ids``, for attention; None when
        the ids are concrete (eager, not traced) and hold no padding, as language-model
        batches never do: attention then needs no mask (or only the causal flag, PyTorch's
        fused causal kernel) instead of building masks in every layer."""
        values = _concrete_numpy(ids)
        if values is not None and values.size and values.all():
            return None
        return padding_mask(ids)

    def components(self):
        """Mapping of component name -> list of layers, for :func:`parameter_summary`."""
        raise NotImplementedError
