"""One helper: run a ``keras.layers.Dropout`` only when it can change its input."""


def apply_dropout(layer, x, training=None):
    """``layer(x, training=training)``, or ``x`` itself when the layer's rate is 0 or
    ``training`` is False: a Keras layer call costs ~0.1-0.3 ms of Python on PyTorch even
    when it does nothing, and models without dropout (nanoGPT's recipe) make dozens per
    step. ``training=None`` still calls the layer (Keras resolves it from the context)."""
    if layer.rate == 0 or training is False:
        return x
    return layer(x, training=training)
