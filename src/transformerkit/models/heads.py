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
