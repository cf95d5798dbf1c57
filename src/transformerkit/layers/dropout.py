"""One helper: apply a ``keras.layers.Dropout`` cheaply, and only when it can change its input."""

from transformerkit.layers.calls import direct_call_allowed


def apply_dropout(layer, x, training=None):
    """``layer(x, training=training)``, computed as cheaply as the backend allows.

    - ``x`` itself when the layer's rate is 0 or ``training`` is False: a Keras layer call
      costs Python time on PyTorch even when it does nothing, and models without dropout
      (nanoGPT's recipe) make dozens per step. ``training=None`` still calls the layer
      (Keras resolves it from the context).
    - On PyTorch, for a plain unseeded ``Dropout`` (no ``noise_shape``, no ``seed``: the
      layers where Keras itself calls ``torch.nn.functional.dropout``) with
      ``training=True`` and a direct call allowed (:func:`~.calls.direct_call_allowed`):
      ``x * mask / (1 - rate)`` with ``mask = uniform(0, 1) >= rate`` drawn by
      ``torch.rand_like`` from the same global generator. The same distribution and
      seeding as ``F.dropout``, whose Bernoulli sampler is slower on CPU forward and
      backward (``bench/results/`` and the commit log have the measurement).
    """
    if layer.rate == 0 or training is False:
        return x
    if training is True and layer.rate < 1 and layer.noise_shape is None and layer.seed is None \
            and direct_call_allowed(layer, x) and x.is_floating_point():
        import torch

        keep = 1.0 - layer.rate
        return x * torch.rand_like(x).ge_(layer.rate).mul_(1.0 / keep)
    return layer(x, training=training)
