"""Pieces shared by the three models: input checks, embedding, the block stacks, caches."""

import contextlib
import dataclasses
import inspect
import math
import weakref

import keras

from transformerkit import fastpath, internals
from transformerkit.kernels.products import inference_linear, kernels_and_biases, linear
from transformerkit.layers import (
    DecoderBlock,
    EncoderBlock,
    PositionalEncoding,
    TokenEmbedding,
    padding_mask,
)
from transformerkit.layers.attention import layer_outputs
from transformerkit.layers.calls import call_sublayer, norm_weights, normalize
from transformerkit.layers.dropout import apply_dropout
from transformerkit.token_ids import check_token_ids, concrete_numpy  # noqa: F401 (models import it here)

# model -> its weights' torch tensors, listed once (a Keras variable on PyTorch keeps its
# tensor for life: ``assign`` copies into it)
_WEIGHT_TENSORS = weakref.WeakKeyDictionary()
# model -> {(precision, packed): (weight_versions, step_weights)}
_STEP_WEIGHTS = weakref.WeakKeyDictionary()


def weight_versions(model):
    """The in-place version counter of each of ``model``'s (built) weights: a tuple that
    changes when any weight is written (``assign``, an optimizer update; code that writes a
    weight's tensor behind PyTorch's back must call ``torch.autograd.graph.
    increment_version`` on it); None entries where the counter cannot be read."""
    tensors = _WEIGHT_TENSORS.get(model)
    if tensors is None:
        tensors = _WEIGHT_TENSORS[model] = [v.value for v in model.weights]
    return tuple(internals.tensor_version(t) for t in tensors)


# The options a block takes: the arguments of EncoderBlock (DecoderBlock passes them on).
_BLOCK_OPTIONS = frozenset(inspect.signature(EncoderBlock).parameters)


def stack_step_weights(embedding, positions, blocks, final_norm, precision, packed):
    """The weights of a stack's inference twin (``decode_step``, ``inference_encode``):
    the token ``embedding`` table and its scale, the ``positions`` table, each block's
    ``step_weights(precision, packed)`` and the ``final_norm`` (or None)."""
    return {"embedding": embedding.embeddings.value,
            "embedding_scale": math.sqrt(embedding.d_model) if embedding.scale else 1.0,
            "positions": positions.table.value,
            "blocks": [block.step_weights(precision, packed) for block in blocks],
            "final_norm": None if final_norm is None else norm_weights(final_norm)}


def _position(index, length):
    """The int of a 0-d tensor ``index`` known to be a position of caches of ``length``
    positions (``torch._check``: what lets a captured graph slice ``[:index + 1]``)."""
    import torch

    position = index.item()
    torch._check(position >= 0)
    torch._check(position < length)
    return position


def select_positions(hidden, positions=None):
    """``(batch, len, d)`` hidden states -> ``(n, d)``: those at the flat positions
    ``positions`` ``(n,)`` of the ``batch * len`` positions; ``hidden`` itself for None."""
    if positions is None:
        return hidden
    if fastpath.applies(hidden):  # a row gather (keras.ops.take is an embedding lookup here)
        return hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
    flat = keras.ops.reshape(hidden, (-1, hidden.shape[-1]))
    return keras.ops.take(flat, positions, axis=0)


def compute_in_float32(model):
    """Let every layer of ``model`` whose weights are float32 also compute in float32.

    A model trained under ``train.precision: mixed_bfloat16`` (or ``auto``'s choice of it)
    keeps float32 weights and is saved with that policy, whose layers compute in bfloat16
    with the weights cast at every use. For decoding, where the precision is chosen per call
    (:mod:`transformerkit.kernels.lowprec`: float32 everywhere, bfloat16 or int8 products),
    such a model computes in float32, which also lets it take the decoder's one-position step
    (``decoding/eager_steps.py: EagerSteps``, float32 models only). ``transformerkit.load`` does
    this to every model it loads. The layers are found with Keras' private
    ``_flatten_layers`` (:mod:`transformerkit.internals`); where it is missing the model is
    left as it is and decodes through Keras' casts.

    Returns ``{layer: policy}`` of the layers changed (empty for a float32 model), for
    :func:`float32_compute` to restore.
    """
    changed = {}
    flatten = internals.attribute(model, "flatten_layers")
    for layer in flatten(include_self=True) if flatten is not None else ():
        policy = layer.dtype_policy
        if policy.variable_dtype == "float32" and policy.compute_dtype != "float32" \
                and policy.quantization_mode is None:
            changed[layer] = policy
            layer.dtype_policy = "float32"
    return changed


@contextlib.contextmanager
def float32_compute(model):
    """:func:`compute_in_float32` for the block (the decoding of the training monitors),
    then the policies ``model`` had. Not for a model that other threads use meanwhile."""
    changed = compute_in_float32(model)
    try:
        yield model
    finally:
        for layer, policy in changed.items():
            layer.dtype_policy = policy


class TransformerBase(keras.Model):
    """Shared constructor checks and building blocks of ``Transformer``, ``GPT``, ``Encoder``."""

    use_bias = True  # projection biases and LayerNorm offsets (a GPT may turn them off)
    # Models whose ``call`` takes ``logit_positions`` (the logits of some positions only).
    takes_logit_positions = False

    # -- Training hooks. Keras' ``fit`` calls ``train_step`` on the model, and Keras' own
    # step calls ``compute_loss`` and ``compute_metrics``. A model compiled and fitted as
    # any Keras model trains with Keras' own step. ``transformerkit train`` attaches its
    # step as ``training_step`` (``transformerkit.training.step.TrainStep``, by
    # ``attach_train_step``: gradient accumulation, the exchange between processes, the
    # cast-once bfloat16 step and the eager PyTorch shortcut), and the three hooks then hand
    # the call to it. The model keeps the architecture.

    training_step = None

    def train_step(self, *args):
        """One optimisation step on a batch: Keras' own, or the attached step's
        (``self.training_step.train_step(self, *args)``, ``training/step.py``)."""
        if self.training_step is None:
            return super().train_step(*args)
        return self.training_step.train_step(self, *args)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Keras' ``compute_loss``, or the attached step's (weighted for gradient
        accumulation, see ``TrainStep.compute_loss``)."""
        if self.training_step is None:
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        return self.training_step.compute_loss(self, x, y, y_pred, sample_weight,
                                               training=training)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """Keras' ``compute_metrics``, or the attached step's (see
        ``TrainStep.compute_metrics``)."""
        if self.training_step is None:
            return super().compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return self.training_step.compute_metrics(self, x, y, y_pred,
                                                  sample_weight=sample_weight)

    def _set_options(self, options):
        """Keep ``options`` (a validated dataclass of :mod:`transformerkit.models.options`)
        and set one attribute per option: ``model.d_model``, ``model.key_dim``, ..."""
        self.options = options
        for name, value in dataclasses.asdict(options).items():
            setattr(self, name, value)

    def get_config(self):
        """Keras' config plus every option (pretrained matrices are weights, not config)."""
        return {**super().get_config(), **dataclasses.asdict(self.options)}

    def _block_kwargs(self):
        return {name: value for name, value in dataclasses.asdict(self.options).items()
                if name in _BLOCK_OPTIONS}

    def _token_embedding(self, vocab_size, pretrained, name, scale=True, trainable=None):
        embedding = TokenEmbedding(vocab_size, self.d_model, scale=scale, pretrained=pretrained,
                                   name=name)
        embedding.trainable = self.embeddings_trainable if trainable is None else trainable
        return embedding

    def _positions(self, name):
        return PositionalEncoding(self.max_length, self.d_model, self.positional,
                                  min_timescale=self.min_timescale,
                                  max_timescale=self.max_timescale, name=name)

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
        return layer_outputs(x, scores if return_attention_scores else None,
                             new_caches if caches is not None else None)

    # -- The fast twin of the cached decoder, one position per row (eager PyTorch). --
    # ``transformerkit.decoding`` uses it where :func:`transformerkit.fastpath.applies`; the
    # plain path is ``_run_decoder`` with caches (see ``DecoderBlock.step``).

    def _decoder_parts(self):
        """``(token_embedding, positions, blocks, final_norm or None, projection or None)``
        of the decoder stack; a None projection means the embedding is tied to it."""
        raise NotImplementedError(f"{type(self).__name__} has no decoder")

    def step_weights(self, precision="float32", packed=True):
        """The weights of the inference twins (:meth:`decode_step`, and the encoder's
        ``inference_encode``) as torch tensors, read once per decoded batch, with every
        product packed for ``precision`` (float32, bfloat16 or int8:
        :func:`~transformerkit.kernels.products.inference_linear`): the precision travels as
        this value, from the decoding loop's steps to each product. ``packed=False`` leaves
        products as plain tensors (for a compiler that packs them itself:
        :mod:`transformerkit.decoding.aot_step`). A tied embedding table is the output
        projection's ``(vocab, d_model)`` matrix.

        The dict is kept per ``(precision, packed)`` while no weight has changed (their
        tensors' in-place version counters, :func:`weight_versions`): gathering it walks
        every layer (milliseconds, as much as decoding a short sentence). Callers must not
        change it. Raises ``RuntimeError`` on another Keras backend (the twins are PyTorch
        code; ``transformerkit.decoding`` runs the plain cached decoder there)."""
        if keras.backend.backend() != "torch":
            raise RuntimeError(
                f"{type(self).__name__}.step_weights: the inference twins (decode_step, "
                f"decode_prefill, inference_encode) run on the PyTorch backend only; this "
                f"process runs Keras on {keras.backend.backend()!r}. Decode with "
                f"transformerkit.decoding (greedy_translate, beam_translate, "
                f"generate_ids), which takes each backend's own path")
        self._ensure_built()
        versions = weight_versions(self)
        kept = _STEP_WEIGHTS.setdefault(self, {})
        key = (precision, packed)
        if key in kept and kept[key][0] == versions and None not in versions:
            return kept[key][1]
        weights = self._gather_step_weights(precision, packed)
        kept[key] = (versions, weights)
        return weights

    def _gather_step_weights(self, precision, packed):
        """:meth:`step_weights` gathered from the layers."""
        kind = dict(precision=precision, packed=packed)
        embedding, positions, blocks, final_norm, projection = self._decoder_parts()
        table = embedding.embeddings.value
        bias = self._logits_bias_weight()
        return {"precision": precision,
                **stack_step_weights(embedding, positions, blocks, final_norm, precision, packed),
                "projection": (inference_linear([table], transposed=True, **kind)
                               if projection is None
                               else inference_linear(*kernels_and_biases(projection), **kind)),
                "logits_bias": None if bias is None else bias.value}

    def _logits_bias_weight(self):
        """The variable of a bias added to the logits after the output projection, or None
        (``Transformer(final_logits_bias=True)``)."""
        return None

    def decode_step_memory(self, memory, memory_mask, weights):
        """Every decoder block's cross-attention keys/values of ``memory`` ``(batch,
        source_len, d_model)`` with ``memory_mask`` ``(batch, source_len)``, for
        :meth:`decode_step`, by the products of ``weights`` (:meth:`step_weights`; see
        ``MultiHeadAttention.step_memory``)."""
        return [block.cross_attention_layer.step_memory(memory, memory_mask,
                                                        block_weights["cross_attention"])
                for block, block_weights in zip(self._decoder_parts()[2], weights["blocks"],
                                                strict=True)]

    def decode_step(self, tokens, index, caches, weights, memories=None, copies=1,
                    cache_rows=None):
        """Logits ``(rows, vocab)`` predicting position ``index + 1`` from the ids ``tokens``
        ``(rows,)`` at position ``index``: the decoder with caches (``Transformer.decode`` /
        ``GPT.call`` with ``caches`` and ``cache_index=index``) for one position, computed by
        each block's :meth:`~transformerkit.layers.DecoderBlock.step`.

        ``index``: an int, or a 0-d int64 tensor (the step captured by ``torch.export``,
        :mod:`transformerkit.decoding.aot_step`: its value becomes the graph's symbolic
        position, so the same code slices the caches' filled prefix).
        ``caches``: one position-major ``(keys, values)`` pair per block, ``(max_len, rows,
        heads, dim)``, updated in place; ``weights`` from :meth:`step_weights`;
        ``memories`` from :meth:`decode_step_memory` (encoder-decoder models), with
        ``copies`` adjacent rows per source (beams); ``cache_rows``: None, or ``(max_len,
        rows)`` int64, the caches' row holding each row's position (the caches then ``(max_len,
        slots, heads, dim)``): a beam search that reorders this table instead of the caches
        (``MultiHeadAttention.step``).
        """
        blocks = self._decoder_parts()[2]
        if not isinstance(index, int):  # a 0-d tensor: the step captured by torch.export
            index = _position(index, caches[0][0].shape[0])
        x = weights["embedding"][tokens] * weights["embedding_scale"] + \
            weights["positions"][index]  # (rows, d_model); embedding dropout is off
        memories = memories or [None] * len(blocks)
        for block, block_weights, cache, memory in zip(blocks, weights["blocks"], caches,
                                                       memories, strict=True):
            x = block.step(x, block_weights, cache, index, memory, copies, cache_rows)
        if weights["final_norm"] is not None:
            x = normalize(x, weights["final_norm"])
        logits = linear(x, weights["projection"])
        return logits if weights["logits_bias"] is None else logits + weights["logits_bias"]

    def decode_prefill(self, tokens, caches, weights):
        """A decoder-only model's prompt written into :meth:`decode_step`'s caches in one
        pass: the ids ``tokens`` ``(rows, length)`` at positions ``0..length-1`` through each
        block's :meth:`~transformerkit.layers.DecoderBlock.prefill` (``GPT.call`` with
        ``caches`` and ``cache_index=0``, its logits not computed); ``caches`` and
        ``weights`` as :meth:`decode_step`'s (the compiled engine's prompt package, captured
        from this method, is handed the caches' first ``length`` positions). The next step
        is ``decode_step`` at ``length``. Returns the last block's output ``(rows, length,
        d_model)`` (section 3.2.3: the decoder's masked self-attention, every prompt position
        at once)."""
        blocks = self._decoder_parts()[2]
        x = weights["embedding"][tokens] * weights["embedding_scale"] + \
            weights["positions"][: tokens.shape[1]]  # (rows, length, d_model)
        for block, block_weights, cache in zip(blocks, weights["blocks"], caches, strict=True):
            x = block.prefill(x, block_weights, cache)
        return x

    @staticmethod
    def _padding_mask(ids):
        """``(batch, len)`` bool mask of the real tokens of ``ids``, for attention; None when
        the ids are concrete (eager, not traced) and hold no padding, as language-model
        batches never do: attention then needs no mask (or only the causal flag, PyTorch's
        fused causal kernel) instead of building masks in every layer."""
        values = concrete_numpy(ids)
        if values is not None and values.size and values.all():
            return None
        return padding_mask(ids)

    def components(self):
        """Mapping of component name -> list of layers, for
        :func:`transformerkit.training.parameter_summary`."""
        raise NotImplementedError
