"""Sampling from a GPT with the key/value cache: temperature, top-k, top-p, seed."""

import numpy as np
from keras import ops


def sample_next(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """Draw one id per row from ``(batch, vocab)`` float logits (NumPy).

    ``temperature`` 0 means arg-max. ``top_k`` keeps the k most likely ids, ``top_p`` the
    smallest set whose probability reaches p (nucleus sampling). Padding id 0 is never drawn.
    """
    logits = np.asarray(logits, dtype="float64").copy()
    logits[:, 0] = -np.inf
    if temperature == 0:
        return logits.argmax(-1)
    logits /= temperature
    if top_k:
        kth = np.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])][:, None]
        logits[logits < kth] = -np.inf
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, axis=-1)
        sorted_probs = np.take_along_axis(probs, order, -1)
        keep_sorted = np.cumsum(sorted_probs, -1) - sorted_probs < top_p  # always keeps the top
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(-1, keepdims=True)
    return np.array([rng.choice(len(p), p=p) for p in probs])


def generate_ids(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                 seed=None, eos_id=None):
    """Continue one prompt ``(length,)`` of ids with a ``GPT``; returns the new ids.

    The prompt is run once to fill the cache, then each new token costs one position.
    Generation stops at ``eos_id`` or at the model's ``max_length``.
    """
    prompt = np.asarray(prompt_ids, dtype="int32")[None, :]
    if prompt.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if prompt.shape[1] >= model.max_length:
        raise ValueError(f"the prompt has {prompt.shape[1]} tokens; the model accepts at most "
                         f"{model.max_length - 1} before generating")
    total = min(prompt.shape[1] + max_new_tokens, model.max_length)
    rng = np.random.default_rng(seed)
    caches = model.init_caches(1, total)
    logits, caches = model(prompt, caches=caches, cache_index=0)
    position, generated = prompt.shape[1], []
    while True:
        next_id = int(sample_next(ops.convert_to_numpy(logits[:, -1, :]), rng, temperature,
                                  top_k, top_p)[0])
        generated.append(next_id)
        if next_id == eos_id or position + 1 >= total:
            break
        logits, caches = model(np.array([[next_id]], dtype="int32"), caches=caches,
                               cache_index=position)
        position += 1
    return generated


def generate_text(model, tokenizer, prompt, max_new_tokens=200, **kwargs):
    """Text continuation of ``prompt`` (the prompt included in the result)."""
    ids = tokenizer.encode(prompt)
    new = generate_ids(model, ids, max_new_tokens, eos_id=tokenizer.eos_id, **kwargs)
    return tokenizer.decode(list(ids) + new)
