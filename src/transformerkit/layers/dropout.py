"""One helper: apply a ``keras.layers.Dropout`` cheaply, and only when it can change its input."""

import numpy as np

from transformerkit.layers.calls import direct_call_allowed

_BITS = 2**32  # random bits per element of a CPU dropout mask


def apply_dropout(layer, x, training=None):
    """``layer(x, training=training)``, computed as cheaply as the backend allows.

    - ``x`` itself when the layer's rate is 0 or ``training`` is False: a Keras layer call
      costs Python time on PyTorch even when it does nothing, and models without dropout
      (nanoGPT's recipe) make dozens per step. ``training=None`` still calls the layer
      (Keras resolves it from the context).
    - On PyTorch, for a plain unseeded ``Dropout`` (no ``noise_shape``, no ``seed``: the
      layers where Keras itself calls ``torch.nn.functional.dropout``) with
      ``training=True`` and a direct call allowed (:func:`~.calls.direct_call_allowed`):
      ``x * mask`` with ``mask`` = ``1 / (1 - rate)`` where an element is kept, 0 where it
      is dropped (:func:`keep_mask`), drawn from PyTorch's global generator, so
      ``keras.utils.set_random_seed`` and a resumed run's restored RNG state reproduce it.
    """
    if layer.rate == 0 or training is False:
        return x
    if training is True and layer.rate < 1 and layer.noise_shape is None and layer.seed is None \
            and direct_call_allowed(layer, x) and x.is_floating_point():
        return x * keep_mask(x, layer.rate)
    return layer(x, training=training)


def keep_mask(x, rate):
    """The inverted-dropout mask for the torch tensor ``x``: ``(x.shape)``, ``x``'s dtype,
    ``1 / (1 - rate)`` where an element is kept (probability ``1 - rate``), else 0.

    On CPU the random numbers are the bottleneck: ``torch.rand_like`` draws them one by one
    from a Mersenne Twister, and building the mask from them costs as much again. So a seed
    is drawn from PyTorch's global generator and NumPy's SFC64 generator, several times
    faster per number, gives 32 random bits per element from it: read as a uniform int32 ``s``,
    an element is dropped when ``s < round(rate * 2**32) - 2**31`` (compared as float32,
    whose rounding is monotone: the rate is met to within ``2**-25``, as finely as the 24-bit
    floats of ``rand_like``), and kept ones are scaled by the inverse of the kept share. The
    comparison and scaling run as torch kernels on all threads. The same distribution as
    ``torch.nn.functional.dropout``, in less time than ``rand_like >= rate``
    (``bench/kernels.py``; the timings: docs/benchmarks.md, "Kernel choices"). Elsewhere (GPU)
    the mask is ``rand_like(x) >= rate`` scaled by ``1 / (1 - rate)``.
    """
    import torch

    if x.device.type != "cpu":
        return torch.rand_like(x).ge_(rate).mul_(1.0 / (1.0 - rate))
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
    count = x.numel()
    bits = np.random.SFC64(seed).random_raw((count + 1) // 2).view(np.int32)[:count]
    dropped = min(round(rate * _BITS), _BITS - 1)  # of the 2**32 bit patterns
    mask = torch.from_numpy(bits).to(torch.float32).ge_(float(dropped - _BITS // 2))
    return mask.mul_(_BITS / (_BITS - dropped)).reshape(x.shape).to(x.dtype)
