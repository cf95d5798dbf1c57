"""Output heads."""

import keras


@keras.saving.register_keras_serializable(package="transformerkit")
class LogitsProjection(keras.layers.Dense):
    """Untied pre-softmax projection ``(batch, len, d_model) -> (batch, len, vocab)``.

    A ``Dense`` layer that accepts masked inputs and returns logits *without* a Keras mask,
    so a compiled loss is never silently re-weighted by the padding mask (the loss does its
    own masking, see :func:`transformerkit.training.masked_cross_entropy`).
    """

    def __init__(self, units, **kwargs):
        super().__init__(units, **kwargs)
        self.supports_masking = True

    def compute_mask(self, inputs, mask=None):
        return None


@keras.saving.register_keras_serializable(package="transformerkit")
class LogitsBias(keras.layers.Layer):
    """A frozen bias vector added to the logits: ``(..., vocab) -> (..., vocab)``.

    Marian's and BART's ``final_logits_bias``: ``transformers`` keeps it as a buffer, which
    its optimisers never update, so here it is a non-trainable weight (zeros until a
    checkpoint fills it), and fine-tuning changes the same weights in both libraries.
    """

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.supports_masking = True

    def build(self, input_shape=None):
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros",
                                    trainable=False)

    def call(self, logits):
        return logits + keras.ops.cast(self.bias, logits.dtype)

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "units": self.units}
