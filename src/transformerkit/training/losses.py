"""Masked loss and accuracy for padded token sequences (padding id 0)."""

import keras
from keras import ops

from transformerkit import fastpath
from transformerkit.layers.masks import padding_mask
from transformerkit.special_tokens import PAD_ID


def masked_cross_entropy(labels, logits, label_smoothing=0.0):
    """Mean cross-entropy over the real (non-padding) tokens of a batch.

    loss = sum_{real tokens} CE(label, logits) / number of real tokens

    This divides by the number of real tokens, not by batch x length (the classic Keras
    pitfall that makes the loss depend on how much padding a batch has).

    Label smoothing (paper section 5.4) mixes the one-hot target with the uniform
    distribution over the vocabulary: target = (1 - eps) * onehot + eps / vocab, the
    convention of PyTorch's ``CrossEntropyLoss`` and Keras' ``categorical_crossentropy``.

    Args:
        labels: ``(batch, length)`` int ids, 0 = padding (ignored).
        logits: ``(batch, length, vocab)`` unnormalised scores (any float dtype; computed in
            float32).
        label_smoothing: float in [0, 1).

    Returns:
        A float32 scalar. 0 when the batch has no real token.
    """
    _check_label_smoothing(label_smoothing)
    if fastpath.applies(logits):  # the shortcut, beside the plain formula below
        return _torch_masked_cross_entropy(labels, logits, label_smoothing)
    labels = ops.cast(labels, "int32")
    nll = smoothed_cross_entropy(labels, logits, label_smoothing)  # (b, t)
    mask = ops.cast(padding_mask(labels), "float32")
    return ops.sum(nll * mask) / ops.maximum(ops.sum(mask), 1.0)


def smoothed_cross_entropy(labels, logits, label_smoothing=0.0):
    """Cross-entropy of each position against its label-smoothed one-hot target (section
    5.4): ``(1 - eps) * -log p(label) + eps * mean_v(-log p(v))``.

    Args:
        labels: ``(...)`` int class ids. logits: ``(..., classes)`` (computed in float32).

    Returns float32 ``(...)``, unreduced (callers mask and average).
    """
    logits = ops.cast(logits, "float32")
    # One fused log-softmax pass (forward and backward) instead of logsumexp, gather and
    # mean as separate passes over the (b, t, V) logits: the loss is the largest
    # element-wise cost of a training step at vocabulary sizes of 8k-37k.
    log_probs = ops.log_softmax(logits, axis=-1)  # (..., V)
    labels = ops.cast(labels, "int32")
    nll = -ops.squeeze(ops.take_along_axis(log_probs, labels[..., None], axis=-1), -1)
    if label_smoothing:
        uniform = -ops.mean(log_probs, axis=-1)  # CE against the uniform target
        nll = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    return nll


def classification_cross_entropy(labels, logits, label_smoothing=0.0):
    """Mean cross-entropy of a batch of sequence classifications (every row counts; class
    0 is a class, not padding).

    Args:
        labels: ``(batch,)`` int class ids. logits: ``(batch, classes)``.
        label_smoothing: float in [0, 1), as in :func:`masked_cross_entropy`.

    Returns a float32 scalar.
    """
    _check_label_smoothing(label_smoothing)
    return ops.mean(smoothed_cross_entropy(labels, logits, label_smoothing))


def _torch_masked_cross_entropy(labels, logits, label_smoothing):
    """The same loss on eager PyTorch as one ``F.cross_entropy`` (``ignore_index`` = the
    padding id, PyTorch's label smoothing = ours): one autograd node instead of about ten
    ``keras.ops`` calls, whose Python overhead at a small vocabulary exceeds the arithmetic."""
    import torch
    import torch.nn.functional as F

    labels = torch.as_tensor(labels, device=logits.device).long()
    logits = logits.float()
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                            ignore_index=PAD_ID, label_smoothing=float(label_smoothing),
                            reduction="sum")
    return total / (labels != PAD_ID).sum().clamp(min=1)


def _check_label_smoothing(label_smoothing):
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")


@keras.saving.register_keras_serializable(package="transformerkit")
class MaskedCrossEntropy(keras.losses.Loss):
    """Keras loss wrapper of :func:`masked_cross_entropy` for ``model.compile``.

    The reduction is done by :func:`masked_cross_entropy` itself (token mean); the models
    return logits without a Keras mask, so ``Loss.__call__`` adds no second masking.
    """

    # padding positions may be left out of y_true and y_pred (training/step.py reads it)
    ignores_padding = True

    def __init__(self, label_smoothing=0.0, name="masked_cross_entropy", **kwargs):
        _check_label_smoothing(label_smoothing)  # at construction, not at the first batch
        kwargs.pop("reduction", None)
        super().__init__(name=name, reduction="sum", **kwargs)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        return masked_cross_entropy(y_true, y_pred, self.label_smoothing)

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing}


@keras.saving.register_keras_serializable(package="transformerkit")
class MaskedAccuracy(keras.metrics.Metric):
    """Fraction of real (non-padding) tokens whose arg-max prediction equals the label,
    counted over all tokens seen since the last reset (not an average of batch averages)."""

    # padding positions may be left out of y_true and y_pred (training/step.py reads it)
    ignores_padding = True

    def __init__(self, name="masked_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")
        predictions = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        mask = ops.cast(padding_mask(labels), "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            while len(sample_weight.shape) < len(mask.shape):  # (batch,) -> (batch, 1)
                sample_weight = ops.expand_dims(sample_weight, -1)
            mask = mask * sample_weight
        hits = ops.cast(ops.equal(labels, predictions), "float32") * mask
        self.correct.assign_add(ops.sum(hits))
        self.total.assign_add(ops.sum(mask))

    def result(self):
        return self.correct / ops.maximum(self.total, 1.0)

    def reset_state(self):
        self.correct.assign(0.0)
        self.total.assign(0.0)


@keras.saving.register_keras_serializable(package="transformerkit")
class ClassificationCrossEntropy(keras.losses.Loss):
    """Keras loss wrapper of :func:`classification_cross_entropy` (an Encoder's class logits
    ``(batch, classes)`` against ``(batch,)`` labels)."""

    def __init__(self, label_smoothing=0.0, name="classification_cross_entropy", **kwargs):
        _check_label_smoothing(label_smoothing)
        kwargs.pop("reduction", None)
        super().__init__(name=name, reduction="sum", **kwargs)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        return classification_cross_entropy(y_true, y_pred, self.label_smoothing)

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing}
