"""Greedy decoding with the key/value cache (one new position per step)."""

import numpy as np
from keras import ops

from transformerkit.layers.masks import padding_mask


def greedy_translate(model, source_ids, bos_id, eos_id, max_new_tokens):
    """Translate a batch greedily with a ``Transformer``.

    Args:
        model: a built ``transformerkit.models.Transformer``.
        source_ids: ``(batch, source_len)`` int ids (0 = padding).
        bos_id, eos_id: start and end token ids of the target vocabulary.
        max_new_tokens: stop after this many tokens (the end token included).

    Returns:
        List of ``batch`` lists of generated ids, each without BOS and cut after EOS (EOS
        itself dropped). The loop stops as soon as every sentence has produced EOS.
    """
    source_ids = np.asarray(source_ids, dtype="int32")
    batch = source_ids.shape[0]
    max_new_tokens = min(int(max_new_tokens), model.max_length)
    memory = model.encode(source_ids)
    source_mask = padding_mask(source_ids)
    caches = model.init_caches(memory, max_new_tokens)
    tokens = np.full((batch, 1), bos_id, dtype="int32")
    finished = np.zeros(batch, dtype=bool)
    outputs = []
    for step in range(max_new_tokens):
        logits, caches = model.decode(tokens, None, source_mask, caches=caches, cache_index=step)
        next_ids = ops.convert_to_numpy(ops.argmax(logits[:, -1, :], axis=-1)).astype("int32")
        next_ids = np.where(finished, 0, next_ids)
        outputs.append(next_ids)
        finished |= next_ids == eos_id
        if finished.all():
            break
        tokens = next_ids[:, None]
    generated = np.stack(outputs, axis=1) if outputs else np.zeros((batch, 0), "int32")
    return [_cut_at_eos(row, eos_id) for row in generated]


def _cut_at_eos(row, eos_id):
    ids = row.tolist()
    return ids[: ids.index(eos_id)] if eos_id in ids else [i for i in ids if i != 0]
