"""Softmax on PyTorch's CPU kernels: short rows padded onto the vectorised kernel."""

import keras
from keras import ops

from transformerkit import fastpath

if keras.backend.backend() == "torch":
    import torch
    import torch.nn.functional as F


# PyTorch's CPU softmax vectorises each row over 16 floats (AVX-512; 8 with AVX2) and runs
# rows shorter than that through a scalar loop, several times slower per element (attention
# over 4-15 keys: a decoder's first steps, short captions and their padding buckets). Padded
# with -inf to 16 entries (exp(-inf) = 0: the same values), such rows take the vectorised
# kernel; rows of 1-3 entries are left as they are (``bench/kernels.py``; the timings:
# docs/benchmarks.md, "Kernel choices").
_SHORT_SOFTMAX = range(4, 16)


def softmax(x):
    """``keras.ops.softmax(x, axis=-1)``; on CPU PyTorch (a :mod:`transformerkit.fastpath`
    shortcut) rows of 4-15 entries are softmaxed padded with ``-inf`` to 16 entries (see
    ``_SHORT_SOFTMAX``), others by ``torch.softmax`` directly."""
    if not fastpath.applies(x):
        return ops.softmax(x, axis=-1)
    length = x.shape[-1]
    if torch.compiler.is_compiling():  # a captured graph (torch.export): the compiler's own
        return x.softmax(-1)
    if length in _SHORT_SOFTMAX and x.device.type == "cpu":
        padded = F.pad(x, (0, 16 - length), value=float("-inf"))
        return padded.softmax(-1)[..., :length]
    return x.softmax(-1)
