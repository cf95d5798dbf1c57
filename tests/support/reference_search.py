"""A plain reference beam search over full forward passes (float64 log-softmax, one
sentence at a time) and the random-weight models of mixed output lengths it is checked on:
used by ``decoding/test_search_stopping.py`` and the per-backend probe of
``decoding/test_decoding.py``."""

import keras
import numpy as np
from keras import ops
from near_ties import assert_same_hypotheses_or_near_tie, score_bound

from transformerkit.decoding import beam_translate
from transformerkit.decoding.common import length_penalty
from transformerkit.decoding.texts import length_caps
from transformerkit.models import Transformer
from transformerkit.special_tokens import BOS_ID, EOS_ID, PAD_ID

SOURCES = np.array([[5, 9, 14, 7, 21, 8, EOS_ID], [11, 6, 19, EOS_ID, 0, 0, 0],
                    [23, EOS_ID, 0, 0, 0, 0, 0], [4, 4, 13, 12, 18, EOS_ID, 0],
                    [7, 17, EOS_ID, 0, 0, 0, 0]], dtype="int32")


def mixed_length_model(seed, eos_bias, max_length=14, norm_position="post"):
    """A random-weight Transformer whose end-token bias makes sentences end at different
    steps (some early, some at the length limit)."""
    keras.utils.set_random_seed(seed)
    model = Transformer(30, 27, num_layers=2, d_model=16, num_heads=2, d_ff=24, dropout=0.0,
                        max_length=max_length, norm_position=norm_position)
    model((SOURCES, SOURCES[:, :3]))
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        value = ops.convert_to_numpy(variable)
        variable.assign((value + rng.normal(0.0, 0.3, value.shape)).astype(value.dtype))
    bias = ops.convert_to_numpy(model.output_projection.bias)
    bias[EOS_ID] += eos_bias
    model.output_projection.bias.assign(bias)
    return model


def repeated_ngram_bans(ids, n):
    """The ids that would complete an ``n``-gram already in ``ids`` (a list, BOS first):
    ``transformers``' ``NoRepeatNGramLogitsProcessor`` written with a dict."""
    if n <= 0 or len(ids) < n:
        return set()
    seen = {}
    for j in range(len(ids) - n + 1):
        seen.setdefault(tuple(ids[j:j + n - 1]), set()).add(ids[j + n - 1])
    return seen.get(tuple(ids[len(ids) - n + 1:]), set())


def reference_beam_search(model, source, beam, alpha, cap, stopping, n_best=1, no_repeat=0):
    """Beam search of one sentence ``source`` ``(len,)`` by full forward passes: the same
    rules as :func:`beam_translate` written plainly (candidates are the best ``2 * beam``
    extensions; an end token among the best ``beam`` finishes a hypothesis; ``exact``: stop
    when no live beam can beat the worst of ``beam`` finished ones, ``early``: stop once
    ``beam`` have finished; at ``cap`` tokens the live beams join; ``no_repeat``: no
    n-gram of that size twice, :func:`repeated_ngram_bans`). Returns ``[(ids,
    score)]``, best first."""
    alive = [([], 0.0)]
    finished = []  # (ids, score, logp)
    max_penalty = length_penalty(cap, alpha, "gnmt")
    steps = 0
    while steps < cap:
        decoder_input = np.array([[BOS_ID] + ids for ids, _ in alive], "int32")
        logits = ops.convert_to_numpy(model((np.repeat(source[None], len(alive), 0),
                                             decoder_input), training=False))[:, -1]
        shifted = logits.astype("float64") - logits.max(1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))  # log-softmax
        logp[:, [PAD_ID, BOS_ID]] = -np.inf
        for row, (ids, _) in enumerate(alive):
            logp[row, sorted(repeated_ngram_bans([BOS_ID] + ids, no_repeat))] = -np.inf
        total = logp + np.array([s for _, s in alive])[:, None]
        flat = total.reshape(-1)
        order = np.argsort(-flat, kind="stable")[: 2 * beam]
        steps += 1
        new_alive = []
        for rank, k in enumerate(order):
            parent, token = divmod(int(k), logp.shape[1])
            ids, score = alive[parent][0] + [token], float(flat[k])
            if not np.isfinite(score):
                continue
            if token == EOS_ID:
                if rank < beam:
                    finished.append((ids[:-1], score / length_penalty(steps, alpha, "gnmt"), score))
            elif len(new_alive) < beam:
                new_alive.append((ids, score))
        finished = sorted(finished, key=lambda f: -f[1])[:beam]
        alive = new_alive
        full = len(finished) == beam
        if full and stopping == "early":
            break
        if full and finished[-1][1] >= max(s for _, s in alive) / max_penalty:
            break
    found = [(ids, score) for ids, score, _ in finished]
    if steps >= cap or len(found) < n_best:
        found += [(ids, s / length_penalty(steps, alpha, "gnmt")) for ids, s in alive]
    return sorted(found, key=lambda f: -f[1])[:n_best]


def check_against_reference(model, sources, beam, alpha, stopping, max_new, caps_ab=None,
                            no_repeat=0):
    """Our beam search (live sentences leaving the batch) == the reference, per sentence:
    other kernels (cached steps against full passes), so scores within their bound and
    hypotheses equal except at a near-tie."""
    a, b = caps_ab or (None, None)
    ours = beam_translate(model, sources, beam_size=beam, alpha=alpha, stopping=stopping,
                          max_new_tokens=max_new, max_len_a=a, max_len_b=b, n_best=2,
                          no_repeat_ngram_size=no_repeat)
    caps = length_caps(sources, max_new, a, b)
    expected = []
    for row in range(len(ours)):
        source = sources[row][: int(np.count_nonzero(sources[row]))]
        expected.append(reference_beam_search(model, source, beam, alpha, int(caps[row]),
                                              stopping, n_best=2, no_repeat=no_repeat))
    atol = score_bound(model, sources, ours + expected)
    for row, (found, reference) in enumerate(zip(ours, expected, strict=True)):
        assert_same_hypotheses_or_near_tie(found, reference, atol, f"sentence {row}")
    return ours
