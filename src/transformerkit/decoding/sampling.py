"""Sampling with temperature, top-k and top-p (nucleus), reproducible with a seed.

A draw from ``softmax(logits / T)`` restricted to the top-k ids and/or the nucleus is taken
with the Gumbel-max trick, ``argmax(logits / T + g)`` with ``g = -log(-log(u))``, ``u``
uniform, so it runs inside compiled loops and top-k = 1 is exactly greedy search.
Translation (``sample_translate``, a ``Transformer``) and text generation
(``generate_ids`` / ``generate_text``, a ``GPT``) use the same token loop as greedy search.
"""

import warnings

import numpy as np

from transformerkit.data.padding import pad_batch
from transformerkit.decoding.common import (
    NEG_INF,
    argmax_ids,
    check_max_new_tokens,
)
from transformerkit.decoding.compiled import UniformNoise, bucket, run_decoder
from transformerkit.decoding.greedy import argmax_choice, token_search, translate_ids
from transformerkit.decoding.loop_ops import loop_ops
from transformerkit.decoding.options import GenerationOptions, SearchOptions, resolve
from transformerkit.decoding.steps import make_steps
from transformerkit.decoding.texts import check_sampling
from transformerkit.special_tokens import BOS_ID, EOS_ID, PAD_ID
from transformerkit.token_ids import check_token_ids

FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
PROMPT_BUCKET = 16  # GPT buffer widths are rounded up to a multiple of this on JAX/TF


def filter_logits(logits, temperature, top_k=None, top_p=None):
    """``(rows, vocab)`` logits / ``temperature`` with ids outside the top ``top_k`` and
    outside the nucleus of probability ``top_p`` set to -inf (the order of Hugging Face's
    ``generate``: temperature, top-k, top-p). The most likely id always survives."""
    xp = loop_ops()  # keras.ops; torch's kernels on eager PyTorch
    x = logits / xp.cast(temperature, "float32")  # the loops' logits are float32
    vocab = x.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = xp.top_k(x, top_k)[0][:, -1:]  # (rows, 1)
        x = xp.where(xp.less(x, kth), NEG_INF, x)
    if top_p is not None:
        probs = xp.softmax(x, axis=-1)
        ranked = xp.top_k(probs, vocab)[0]  # (rows, vocab), descending
        before = xp.cumsum(ranked, axis=-1) - ranked  # probability of the better ids
        kept = xp.where(xp.less(before, xp.cast(top_p, "float32")), ranked, 2.0)
        cutoff = xp.min(kept, axis=-1, keepdims=True)  # smallest kept probability
        x = xp.where(xp.less(probs, cutoff), NEG_INF, x)
    return x


def sampling_choice(seed, temperature, top_k, top_p):
    """A ``choose(logits, index)`` for :func:`token_search` that samples (Gumbel-max)."""
    noise = UniformNoise(seed)
    xp = loop_ops()

    def choose(logits, index):
        x = filter_logits(logits, temperature, top_k, top_p)
        gumbel = -xp.log(-xp.log(noise(index, tuple(x.shape))))
        return argmax_ids(x + xp.cast(gumbel, "float32"))

    return choose


def _choice_args(temperature, top_k, top_p, seed):
    """``(key, extra args, make_choose)`` for the sampling or (temperature 0) greedy choice."""
    top_k, top_p, seed = check_sampling(temperature, top_k, top_p, seed)
    # the logits are float32: a temperature below its normal range is 0 (greedy, the
    # limit), one above it the largest float32 (every id alike, the limit)
    if temperature < FLOAT32_TINY:
        return "greedy", (), None
    key = ("sample", top_k, top_p is not None)
    args = (seed, np.float32(min(temperature, FLOAT32_MAX)), np.float32(top_p or 1.0))

    def make_choose(seed, temperature, top_p_value):
        return sampling_choice(seed, temperature, top_k, top_p_value if top_p else None)

    return key, args, make_choose


_GENERATION = GenerationOptions()  # the declared defaults, for the signatures below


def sample_translate(model, source_ids, options=None, *, bos_id=BOS_ID, eos_id=EOS_ID,
                     use_cache=True, precision="float32", **search):
    """Sampled translations of a batch (arguments as
    :func:`~transformerkit.decoding.greedy.greedy_translate`; of the
    :class:`~transformerkit.decoding.options.SearchOptions` also ``temperature`` (0 = greedy;
    unset: 1.0, the model's own distribution), ``top_k``, ``top_p`` and ``seed``: the same
    seed gives the same output on the same backend; and ``forced_eos`` and
    ``no_repeat_ngram_size``). Returns ``batch``
    lists of ids."""
    options = resolve(SearchOptions, options, search, "sample_translate")
    # unset, the temperature is sampling's own default (GenerationOptions'): 1.0
    temperature = options.temperature if options.samples else _GENERATION.temperature
    key, args, make_choose = _choice_args(temperature, options.top_k, options.top_p,
                                          options.seed)
    return translate_ids(model, source_ids, options.max_new_tokens, argmax_choice, key, args,
                         make_choose, bos_id=bos_id, eos_id=eos_id,
                         min_new_tokens=options.min_new_tokens, use_cache=use_cache,
                         max_len_a=options.max_len_a, max_len_b=options.max_len_b,
                         forced_eos=options.forced_eos, precision=precision,
                         no_repeat_ngram_size=options.no_repeat_ngram_size)


def generate_ids(model, prompt_ids, max_new_tokens=_GENERATION.max_new_tokens,
                 temperature=_GENERATION.temperature, top_k=_GENERATION.top_k,
                 top_p=_GENERATION.top_p, seed=_GENERATION.seed, eos_id=None,
                 min_new_tokens=_GENERATION.min_new_tokens, use_cache=True, on_token=None,
                 precision="float32",
                 no_repeat_ngram_size=_GENERATION.no_repeat_ngram_size):
    """Continue prompts with a ``GPT``; returns the new ids of each prompt.

    Args:
        model: a ``transformerkit.models.GPT``.
        prompt_ids: one prompt (a list of ids) or a list of prompts of any lengths.
        max_new_tokens, min_new_tokens, temperature, top_k, top_p, seed: the fields of
            :class:`~transformerkit.decoding.options.GenerationOptions` (defaults and checks
            from there): at most ``max_new_tokens`` new tokens per prompt, and ``eos_id``
            not before ``min_new_tokens`` of them; ``temperature`` 0
            is greedy (arg-max), otherwise the softmax temperature; keep the ``top_k`` most
            likely ids / the smallest set of probability ``top_p``; the same ``seed`` gives
            the same output (on the same backend); with ``no_repeat_ngram_size`` n, no
            token n-gram occurs twice in a prompt and its continuation (within the
            context window, beyond it).
        eos_id: stop a prompt's continuation at this id (included in the result), or None.
        on_token: None, or (PyTorch's eager loop only) a function called with the ids
            ``(rows,)`` of each decoding step, as :func:`~.greedy.token_search`'s; what it
            raises stops the generation (:mod:`.streaming`).
        precision: the products' precision, as in
            :func:`~transformerkit.decoding.greedy_translate`; a prompt's shared prefix too
            (PyTorch's step: in one pass, ``decode_prefill``; the compiled engine's
            packages standing in for an unloaded model: one step a position,
            :mod:`~transformerkit.decoding.aot_files`; the Keras call of other backends
            computes it in float32).

    Returns the new ids (a list) for one prompt, a list of lists for several. Prompts
    longer than ``max_length - 1`` tokens keep their last tokens, with a warning.

    Longer outputs than the context holds (prompt + ``max_new_tokens`` > ``max_length``, the
    usual case for a small character model) are generated in windows, as nanoGPT crops its
    context to ``block_size``: when the context is full, generation continues from its last
    ``max_length // 2`` tokens (with the seed advanced by one per window, so the same seed
    still gives the same text).
    """
    GenerationOptions(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                      temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                      no_repeat_ngram_size=no_repeat_ngram_size)  # checks each value
    single = len(prompt_ids) > 0 and np.isscalar(prompt_ids[0])
    prompts = []
    for i, prompt in enumerate([prompt_ids] if single else prompt_ids):
        prompts.append(crop_prompt(model, prompt, i, stacklevel=2))
    if not prompts:
        raise ValueError("the prompt is empty: give at least one token")
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                   eos_id=eos_id, min_new_tokens=min_new_tokens, use_cache=use_cache,
                   on_token=on_token, precision=precision,
                   no_repeat_ngram_size=no_repeat_ngram_size)
    if max_new_tokens is not None and \
            max(map(len, prompts)) + int(max_new_tokens) > model.max_length:
        results = _generate_windowed(model, prompts, int(max_new_tokens), options)
    else:
        results = generate_once(model, prompts, max_new_tokens, **options)
    return results[0] if single else results


def crop_prompt(model, prompt, index=0, stacklevel=2):
    """Prompt ``index``'s ids as a list of ints, its last ``max_length - 1`` if it is longer
    (with a warning pointing ``stacklevel`` frames above the caller, as ``warnings.warn``'s);
    an empty prompt is a ``ValueError``."""
    prompt = list(map(int, prompt))
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token")
    limit = model.max_length - 1
    if len(prompt) > limit:
        warnings.warn(f"prompt {index} has {len(prompt)} tokens; the model reads at most "
                      f"{model.max_length}, so only its last {limit} are used",
                      stacklevel=stacklevel + 1)
        prompt = prompt[-limit:]
    return prompt


def window_context(model, prompt, new, window):
    """The ids window number ``window`` of a generation beyond the context continues: the
    (cropped) prompt for the first, the last ``max_length // 2`` tokens of the text so far
    (``prompt + new``) for the others."""
    keep = max(1, model.max_length // 2)
    return (prompt + new)[-(keep if window else model.max_length - 1):]


def window_seed(seed, window):
    """The seed of window number ``window``: ``seed`` advanced by one per window."""
    return None if seed is None else int(seed) + window


def _generate_windowed(model, prompts, max_new_tokens, options):
    """:func:`generate_ids` beyond the context: windows of at most ``max_length`` tokens,
    each starting from the last ``max_length // 2`` tokens of the text so far."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    eos = options["eos_id"]
    new = [[] for _ in prompts]
    done = [False] * len(prompts)
    window = 0
    while True:
        live = [i for i, p in enumerate(prompts) if not done[i] and len(new[i]) < max_new_tokens]
        if not live:
            return new
        contexts = [window_context(model, prompts[i], new[i], window) for i in live]
        budget = max(min(max_new_tokens - len(new[i]), model.max_length - len(c))
                     for i, c in zip(live, contexts, strict=True))
        chunk_options = dict(options, min_new_tokens=max(0, options["min_new_tokens"] -
                                                         min(len(new[i]) for i in live)))
        chunk_options["seed"] = window_seed(options["seed"], window)
        outputs = generate_once(model, contexts, budget, **chunk_options)
        for i, out in zip(live, outputs, strict=True):
            out = out[: max_new_tokens - len(new[i])]
            new[i].extend(out)
            if not out or (eos is not None and out[-1] == int(eos)):
                done[i] = True
        window += 1


def generate_once(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, eos_id,
                   min_new_tokens, use_cache, on_token=None, precision="float32",
                   no_repeat_ngram_size=0):
    """One compiled decoding pass over prompts of at most ``max_length - 1`` tokens."""
    lengths = np.array([len(p) for p in prompts], dtype="int32")
    max_new = check_max_new_tokens(max_new_tokens, model.max_length - int(lengths.min()))
    total = min(int(lengths.max()) + max_new, model.max_length)
    width = bucket(total, PROMPT_BUCKET, model.max_length)
    buffer = check_token_ids(pad_batch(prompts, width), model.vocab_size, model.max_length,
                             "prompt_ids")  # every engine's step indexes tables with them
    prefill = int(lengths.min()) - 1
    if width != total:  # compiling backends: a prefill bucket too, not one per prompt length
        prefill = prefill // PROMPT_BUCKET * PROMPT_BUCKET
    key, args, make_choose = _choice_args(temperature, top_k, top_p, seed)
    steps = make_steps(model, use_cache, precision)
    eos = -1 if eos_id is None else int(eos_id)

    def decode(buffer, lengths, max_new, min_new, *extra):
        state, static = steps.start(buffer, prefill, width)
        chooser = make_choose(*extra) if make_choose is not None else argmax_choice
        active = loop_ops().full((buffer.shape[0],), True, "bool")
        return token_search(steps, static, state, buffer, prefill, lengths, max_new, min_new,
                            chooser, eos, active, on_token=on_token,
                            no_repeat_ngram_size=no_repeat_ngram_size)[0]

    out = run_decoder(model, ("generate", key, prefill, eos, use_cache, no_repeat_ngram_size,
                              getattr(steps, "precision", "float32")), decode, buffer,
                      lengths, np.int32(max_new),
                      np.int32(min(min_new_tokens, max_new + 1)), *args)
    results = []
    for row, n in enumerate(lengths):
        new = [int(i) for i in out[row, n:total] if i != PAD_ID]
        if eos in new:
            new = new[: new.index(eos) + 1]
        results.append(new)
    return results


def generate_text(model, tokenizer, prompt, max_new_tokens=_GENERATION.max_new_tokens, **kwargs):
    """Text continuation of ``prompt`` (the prompt included in the result)."""
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError("the prompt is empty: give at least one character or token")
    new = generate_ids(model, ids, max_new_tokens, eos_id=tokenizer.eos_id, **kwargs)
    return tokenizer.decode(list(ids) + [i for i in new if i != tokenizer.eos_id])


__all__ = ["filter_logits", "generate_ids", "generate_text", "sample_translate",
           "sampling_choice"]
