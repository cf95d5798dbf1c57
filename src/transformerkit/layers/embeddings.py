"""Token embeddings (paper section 3.4) and positional encodings (section 3.5)."""

import math

import keras
import numpy as np
from keras import ops

from transformerkit.layers.masks import padding_mask

POSITIONAL_KINDS = ("sinusoidal", "sinusoidal_split", "t2t", "learned")


@keras.saving.register_keras_serializable(package="transformerkit")
class TokenEmbedding(keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model), usable as the tied output projection.

    ``call(ids)`` maps ``(batch, length)`` int ids to ``(batch, length, d_model)`` vectors,
    multiplied by ``sqrt(d_model)`` when ``scale`` is set (paper section 3.4), and attaches
    the padding mask (id 0 is padding). ``call(x, reverse=True)`` maps ``(batch, length,
    d_model)`` to ``(batch, length, vocab_size)`` logits with the same matrix (the paper's
    shared "pre-softmax linear transformation"); that output carries no mask.

    Args:
        vocab_size: int, number of ids.
        d_model: int, embedding width.
        scale: bool, multiply by sqrt(d_model) (default True; BERT-style encoders use False).
        embeddings_initializer: initializer (default normal with stddev d_model^-0.5, so that
            the scaled embeddings have unit variance, as in tensor2tensor).
        pretrained: optional ``(vocab_size, d_model)`` array copied into the matrix at build
            time (not serialized: the saved weights carry it). Rows that are all NaN keep
            the initializer's values: tokens a vectors file has no vector for.
        trainable: bool, set False to freeze a pretrained matrix.

    Example:
    >>> emb = TokenEmbedding(vocab_size=10, d_model=4)
    >>> emb(np.array([[3, 4, 0]])).shape
    (1, 3, 4)
    """

    def __init__(self, vocab_size, d_model, scale=True, embeddings_initializer=None,
                 pretrained=None, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.d_model = int(d_model)
        self.scale = bool(scale)
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=d_model ** -0.5)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self._pretrained = None
        if pretrained is not None:
            pretrained = np.asarray(pretrained)
            if pretrained.shape != (self.vocab_size, self.d_model):
                raise ValueError(
                    f"pretrained embedding matrix has shape {pretrained.shape}, expected "
                    f"(vocab_size, d_model) = ({self.vocab_size}, {self.d_model})")
            nan = np.isnan(pretrained)
            if (nan.any(axis=1) & ~nan.all(axis=1)).any() or np.isinf(pretrained).any():
                raise ValueError("pretrained embedding matrix has infinite values or rows only "
                                 "partly NaN (a NaN row means: no vector, keep the "
                                 "initializer's)")
            self._pretrained = pretrained
        self.supports_masking = True

    def build(self, input_shape=None):
        initializer = self.embeddings_initializer
        if self._pretrained is not None:
            # The matrix is the initial value (an assignment would be lost when Keras' first
            # build runs symbolically inside fit).
            initializer = _PretrainedInitializer(self._pretrained, initializer)
            self._pretrained = None
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.vocab_size, self.d_model),
            initializer=initializer, trainable=True)

    def call(self, inputs, reverse=False):
        if reverse:  # (b, t, d_model) -> (b, t, vocab)
            kernel = ops.cast(self.embeddings, self.compute_dtype)
            return ops.matmul(inputs, ops.transpose(kernel))
        x = ops.take(self.embeddings, ops.cast(inputs, "int32"), axis=0)
        x = ops.cast(x, self.compute_dtype)
        if self.scale:
            x = x * ops.cast(math.sqrt(self.d_model), x.dtype)
        return x

    def compute_mask(self, inputs, mask=None, reverse=False):
        # Keras calls compute_mask(inputs, previous_mask) without ``reverse``: hidden states
        # (floating point) mean the reverse projection, whose logits must carry no mask.
        if reverse or "float" in str(keras.backend.standardize_dtype(inputs.dtype)):
            return None
        return padding_mask(inputs)

    def compute_output_shape(self, input_shape, reverse=False):
        if reverse:
            return (*input_shape[:-1], self.vocab_size)
        return (*input_shape, self.d_model)

    def compute_output_spec(self, inputs, reverse=False):
        # Keras cannot pass ``reverse`` to compute_output_shape for symbolic inputs.
        return keras.KerasTensor(self.compute_output_shape(inputs.shape, reverse),
                                 dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, d_model=self.d_model, scale=self.scale,
                      embeddings_initializer=keras.initializers.serialize(
                          self.embeddings_initializer))
        return config


class _PretrainedInitializer:
    """The rows of ``matrix`` ``(vocab, d_model)``, and ``fallback``'s draw for the rows
    that are all NaN (tokens without a pretrained vector)."""

    def __init__(self, matrix, fallback):
        self.matrix, self.fallback = matrix, fallback

    def __call__(self, shape, dtype=None):
        given = self.matrix.astype(keras.backend.standardize_dtype(dtype or "float32"))
        missing = np.isnan(given).all(axis=1, keepdims=True)  # (vocab, 1)
        if not missing.any():
            return ops.convert_to_tensor(given)
        return ops.where(missing, self.fallback(shape, dtype=dtype), np.nan_to_num(given))


def sinusoidal_table(max_length, d_model, kind="sinusoidal", min_timescale=1.0,
                     max_timescale=1.0e4):
    """The fixed position table, ``(max_length, d_model)`` float32 NumPy.

    ``sinusoidal``: the paper's PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)), sines and cosines interleaved.
    ``sinusoidal_split``: the same frequencies, all sines first (columns ``0 ..
    ceil(d_model/2) - 1``), then all cosines: Marian's layout (OPUS-MT; ``transformers``'
    ``MarianSinusoidalPositionalEmbedding``, which with an odd ``d_model`` has one more
    sine than cosines).
    ``t2t``: tensor2tensor's ``get_timing_signal_1d``: timescales spaced geometrically
    from ``min_timescale`` to ``max_timescale`` over ``d_model/2 - 1`` steps, all sines
    first, then all cosines (zero-padded when ``d_model`` is odd).
    """
    position = np.arange(max_length, dtype=np.float64)[:, None]  # (L, 1)
    if kind in ("sinusoidal", "sinusoidal_split"):
        i = np.arange(0, d_model, 2, dtype=np.float64)  # 2i
        angles = position / np.power(max_timescale, i / d_model)  # (L, ceil(d/2))
        table = np.zeros((max_length, d_model))
        sines, cosines = ((slice(0, None, 2), slice(1, None, 2)) if kind == "sinusoidal" else
                          (slice(0, angles.shape[1]), slice(angles.shape[1], None)))
        table[:, sines] = np.sin(angles)
        table[:, cosines] = np.cos(angles[:, : d_model // 2])
    elif kind == "t2t":
        num_timescales = d_model // 2
        log_increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
        inv_timescales = min_timescale * np.exp(-log_increment * np.arange(num_timescales))
        angles = position * inv_timescales[None, :]
        table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
        table = np.pad(table, [(0, 0), (0, d_model % 2)])
    else:
        raise ValueError(f"unknown fixed positional encoding {kind!r}")
    return table.astype("float32")


@keras.saving.register_keras_serializable(package="transformerkit")
class PositionalEncoding(keras.layers.Layer):
    """Adds position information to ``(batch, length, d_model)`` embeddings.

    Args:
        max_length: int, longest sequence the model accepts; longer inputs raise an error.
        d_model: int.
        kind: "sinusoidal" (the paper), "sinusoidal_split" (its frequencies, sines then
            cosines: Marian), "t2t" (tensor2tensor timescales) or "learned".
        min_timescale, max_timescale: floats, the fixed tables' timescales
            (:func:`sinusoidal_table`; the paper's table uses ``max_timescale`` only).

    Call arguments:
        inputs: ``(batch, length, d_model)``.
        start_index: int or scalar tensor, position of the first input (cached decoding).

    Returns ``inputs + PE[start_index : start_index + length]``; the input mask passes through.
    """

    def __init__(self, max_length, d_model, kind="sinusoidal", min_timescale=1.0,
                 max_timescale=1.0e4, **kwargs):
        super().__init__(**kwargs)
        if kind not in POSITIONAL_KINDS:
            raise ValueError(f"positional must be one of {POSITIONAL_KINDS}, got {kind!r}")
        self.max_length = int(max_length)
        self.d_model = int(d_model)
        self.kind = kind
        self.min_timescale = float(min_timescale)
        self.max_timescale = float(max_timescale)
        self.supports_masking = True

    def build(self, input_shape=None):
        if self.kind == "learned":
            self.table = self.add_weight(
                name="position_embeddings", shape=(self.max_length, self.d_model),
                initializer=keras.initializers.RandomNormal(stddev=0.02))
        else:
            self.table = self.add_weight(
                name="table", shape=(self.max_length, self.d_model), trainable=False,
                initializer=keras.initializers.Constant(
                    sinusoidal_table(self.max_length, self.d_model, self.kind,
                                     self.min_timescale, self.max_timescale)))

    def call(self, inputs, start_index=0):
        length = inputs.shape[1]
        if length is not None and isinstance(start_index, int) and \
                start_index + length > self.max_length:
            raise ValueError(
                f"sequence of length {start_index + length} is longer than max_length="
                f"{self.max_length} of this model")
        length = ops.shape(inputs)[1]
        if isinstance(start_index, int) and start_index == 0:
            positions = self.table[:length]
        else:
            # the variable's tensor: JAX cannot slice a Keras variable at a traced index
            table = ops.convert_to_tensor(self.table)
            positions = ops.slice(table, [start_index, 0], [length, self.d_model])
        return inputs + ops.cast(positions, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(max_length=self.max_length, d_model=self.d_model, kind=self.kind,
                      min_timescale=self.min_timescale, max_timescale=self.max_timescale)
        return config
