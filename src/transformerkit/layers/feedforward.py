"""Position-wise feed-forward network, paper section 3.3."""

import keras

from transformerkit.kernels.products import inference_linear, kernels_and_biases, linear
from transformerkit.layers.calls import call_sublayer
from transformerkit.layers.dropout import apply_dropout

ACTIVATIONS = ("relu", "gelu", "swish", "gelu_tanh")


@keras.saving.register_keras_serializable(package="transformerkit")
def gelu_tanh(x):
    """GELU's tanh approximation, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
    (Hendrycks and Gimpel 2016): GPT-2's activation (``transformers``' ``gelu_new`` and
    ``gelu_pytorch_tanh``), which a GPT-2 checkpoint needs to reproduce its outputs."""
    return keras.activations.gelu(x, approximate=True)


# option name -> the Dense activation (Keras' "gelu" is the exact erf form; swish is
# x * sigmoid(x), SiLU: Marian / OPUS-MT)
_DENSE_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "gelu_tanh": gelu_tanh}


@keras.saving.register_keras_serializable(package="transformerkit")
class FeedForward(keras.layers.Layer):
    """FFN(x) = act(x W1 + b1) W2 + b2 (paper equation 2), applied to every position.

    Args:
        d_model: int, input and output width.
        d_ff: int, inner width (2048 in the base model).
        activation: "relu" (the paper), "gelu" (exact erf form, as in BERT), "swish"
            (``x * sigmoid(x)``, also called SiLU: Marian's and OPUS-MT's) or "gelu_tanh"
            (GELU's tanh approximation, as in GPT-2: :func:`gelu_tanh`).
        dropout: float, dropout on the inner activations (tensor2tensor's relu_dropout).
        use_bias: bool, biases ``b1``, ``b2`` (default True; nanoGPT's GPTs have none).

    Shapes: ``(batch, length, d_model)`` -> ``(batch, length, d_model)``; masks pass through.
    """

    def __init__(self, d_model, d_ff, activation="relu", dropout=0.0,
                 kernel_initializer="glorot_uniform", use_bias=True, **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.d_model, self.d_ff = int(d_model), int(d_ff)
        self.activation = activation
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, input_shape):
        self.inner = keras.layers.Dense(self.d_ff,
                                        activation=_DENSE_ACTIVATIONS[self.activation],
                                        kernel_initializer=self.kernel_initializer,
                                        use_bias=self.use_bias,
                                        dtype=self.dtype_policy, name="inner")
        self.outer = keras.layers.Dense(self.d_model, kernel_initializer=self.kernel_initializer,
                                        use_bias=self.use_bias,
                                        dtype=self.dtype_policy, name="outer")
        self.inner_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.inner.build(input_shape)
        self.outer.build((*input_shape[:-1], self.d_ff))

    def call(self, inputs, training=None):
        inner = apply_dropout(self.inner_dropout, call_sublayer(self.inner, inputs), training)
        return call_sublayer(self.outer, inner)

    def step_weights(self, precision="float32", packed=True):
        """``{"inner": ..., "outer": ...}`` as :func:`inference_linear` weights at
        ``precision``."""
        kind = dict(precision=precision, packed=packed)
        return {"inner": inference_linear(*kernels_and_biases(self.inner), **kind),
                "outer": inference_linear(*kernels_and_biases(self.outer), **kind)}

    def step(self, x, weights):
        """:meth:`call` at inference on ``(..., d_model)`` torch tensors with weights from
        :meth:`step_weights` (the one-position decoder step, see ``MultiHeadAttention.step``);
        float32, or bfloat16 from a bfloat16 product (the residual sum widens it)."""
        import torch.nn.functional as F

        if self.activation == "relu":  # inside the product's kernel; bfloat16 stays bfloat16
            inner = linear(x, weights["inner"], activation="relu", low_output=True)
        else:
            activation = {"gelu": F.gelu, "swish": F.silu,
                          "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[self.activation]
            inner = activation(linear(x, weights["inner"]))
        # a bfloat16 result is widened by the residual sum that takes it
        return linear(inner, weights["outer"], low_output=True)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, d_ff=self.d_ff, activation=self.activation,
                      dropout=self.dropout, use_bias=self.use_bias,
                      kernel_initializer=keras.initializers.serialize(self.kernel_initializer))
        return config
