"""Pieces every decoder shares: input checks and bucketing, token rules, output cleanup."""

import warnings

import numpy as np
from keras import ops

from transformerkit.decoding.compiled import batch_bucket, bucket

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
NEG_INF = float("-inf")
SOURCE_BUCKET = 8  # source lengths are rounded up to a multiple of this on JAX/TensorFlow


def check_max_new_tokens(max_new_tokens, limit, what="max_new_tokens"):
    """``max_new_tokens`` as an int in ``[1, limit]``; larger values are cut with a warning."""
    if max_new_tokens is None:
        return int(limit)
    max_new_tokens = int(max_new_tokens)
    if max_new_tokens < 1:
        raise ValueError(f"{what} must be at least 1, got {max_new_tokens}")
    if max_new_tokens > limit:
        warnings.warn(f"{what}={max_new_tokens} is more than this model can produce; "
                      f"decoding at most {limit} tokens (the model's max_length)", stacklevel=3)
        return int(limit)
    return max_new_tokens


def prepare_sources(model, source_ids):
    """Check ``(batch, source_len)`` ids and pad them to a shape bucket.

    Returns ``(source, active)``: int32 ids whose rows and columns are rounded up on
    compiling backends (extra rows hold just EOS; extra columns are padding), and a bool
    ``(rows,)`` array that is False for the extra rows.
    """
    source = np.asarray(source_ids)
    if source.ndim != 2:
        raise ValueError(f"source_ids must have shape (batch, source_len), got {source.shape}")
    if source.shape[0] == 0:
        raise ValueError("source_ids holds no sentence (batch size 0)")
    if source.shape[1] == 0 or not np.any(source != PAD_ID, axis=1).all():
        empty = int(np.flatnonzero(~np.any(source != PAD_ID, axis=1))[0]) \
            if source.shape[1] else 0
        raise ValueError(f"source sentence {empty} is empty (only padding); every source needs "
                         "at least one token (the end token)")
    if source.shape[1] > model.max_length:
        raise ValueError(f"source_ids has length {source.shape[1]}, longer than max_length="
                         f"{model.max_length} of this model; truncate the input")
    if not np.issubdtype(source.dtype, np.integer):
        raise TypeError(f"source_ids must be integer token ids, got dtype {source.dtype}")
    rows = batch_bucket(source.shape[0])
    width = bucket(source.shape[1], SOURCE_BUCKET, model.max_length)
    padded = np.zeros((rows, width), dtype="int32")
    padded[: source.shape[0], : source.shape[1]] = source
    padded[source.shape[0]:, 0] = EOS_ID
    active = np.arange(rows) < source.shape[0]
    return padded, active


def forbid_tokens(logits, eos_id, forbid_eos):
    """``(rows, vocab)`` logits with PAD and BOS never chosen, and EOS not where
    ``forbid_eos`` ``(rows,)`` is True (``min_new_tokens`` not reached yet).

    Done as one addition of a ``(rows, vocab)`` bias of 0 / -inf, built in one pass, since
    on the eager PyTorch loop every full pass over the logits costs time.
    """
    vocab = logits.shape[-1]
    always = np.zeros((1, vocab), dtype="float32")
    always[0, [PAD_ID, BOS_ID]] = NEG_INF
    if eos_id is None or eos_id < 0:
        return logits + ops.convert_to_tensor(always, logits.dtype)
    without_eos = always.copy()
    without_eos[0, eos_id] = NEG_INF
    bias = ops.where(ops.expand_dims(forbid_eos, 1), ops.convert_to_tensor(without_eos),
                     ops.convert_to_tensor(always))
    return logits + ops.cast(bias, logits.dtype)


def length_penalty(length, alpha):
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` (Wu et al. 2016, eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


def cut_at_eos(ids, eos_id):
    """Generated ids up to (not including) the first ``eos_id``, without padding."""
    out = []
    for i in ids:
        i = int(i)
        if i == eos_id:
            break
        if i != PAD_ID:
            out.append(i)
    return out
