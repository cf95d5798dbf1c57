"""Padding a batch of id sequences (plain NumPy: the decoders, the CTranslate2 engine and the
training pipeline share it)."""

import numpy as np

from transformerkit.special_tokens import PAD_ID


def pad_batch(sequences, length=None):
    """Right-pad 1-D int sequences (arrays or lists) with PAD -> int32 ``(batch, length or
    longest)``."""
    length = max(len(s) for s in sequences) if length is None else length
    out = np.full((len(sequences), length), PAD_ID, dtype="int32")
    for row, seq in enumerate(sequences):
        out[row, :len(seq)] = seq
    return out
