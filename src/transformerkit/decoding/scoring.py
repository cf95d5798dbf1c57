"""The model's own score of given outputs (teacher forcing, one full forward pass)."""

import numpy as np
from keras import ops

from transformerkit.data.padding import pad_batch
from transformerkit.special_tokens import BOS_ID, EOS_ID, PAD_ID


def sequence_log_probs(model, source_ids, outputs, bos_id=BOS_ID, eos_id=EOS_ID, add_eos=True):
    """``log p(y | x)`` of each output under a ``Transformer``: the sum over its tokens
    (and the end token, with ``add_eos``) of the log-softmax of the logits.

    Args:
        source_ids: ``(batch, source_len)`` int ids.
        outputs: ``batch`` lists of target ids without BOS (e.g. a decoder's result).

    Returns ``(batch,)`` float64 NumPy.
    """
    targets = [list(y) + [eos_id] * bool(add_eos) for y in outputs]
    labels = pad_batch(targets)
    decoder_input = np.concatenate([np.full((len(targets), 1), bos_id, "int32"),
                                    labels[:, :-1]], axis=1)
    decoder_input[labels == PAD_ID] = PAD_ID  # no input after the last real label
    logits = model((np.asarray(source_ids, "int32"), decoder_input), training=False)
    logp = ops.convert_to_numpy(ops.log_softmax(ops.cast(logits, "float32"), axis=-1))
    picked = np.take_along_axis(logp.astype("float64"), labels[..., None], axis=-1)[..., 0]
    return np.where(labels != PAD_ID, picked, 0.0).sum(axis=1)
