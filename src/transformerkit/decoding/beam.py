"""Beam search with the GNMT length penalty, n-best lists and an exact early stop.

The beams of all sentences are rows of one batch, ``(batch * beam, ...)``: one decoder
step scores every beam at once, and the self-attention caches follow their beams by
``ops.take`` on the row axis. Every step keeps ``2 * beam`` candidates, so that even if
``beam`` of them end with EOS there are ``beam`` live ones left; an EOS candidate becomes
a finished hypothesis only if it is among the best ``beam`` candidates (as in fairseq, so
beam size 1 is exactly greedy search with ``alpha=0``).

A finished hypothesis ``y`` scores ``log p(y | x) / lp(|y|)`` with
``lp(n) = ((5 + n) / 6) ** alpha`` (Wu et al. 2016; the Transformer paper used beam 4 and
alpha 0.6). A sentence is done when its worst kept finished score beats the best score
any live beam could still reach (its log-probability can only fall, and its penalty is at
most ``lp(max_new_tokens)``), so stopping early never changes the result; the loop stops
when every sentence is done or at ``max_new_tokens``.
"""

from dataclasses import dataclass

import numpy as np
from keras import ops

from transformerkit.decoding.common import (
    NEG_INF,
    TokenRules,
    check_max_new_tokens,
    chunked_top_k,
    cut_at_eos,
    length_penalty,
    log_softmax_plus,
    prepare_sources,
)
from transformerkit.decoding.compiled import run_decoder, start_index, while_loop
from transformerkit.decoding.steps import make_steps
from transformerkit.special_tokens import BOS_ID, EOS_ID


@dataclass(frozen=True)
class Hypothesis:
    """One beam-search result: ``ids`` (no BOS, cut before EOS), ``score`` (length-
    penalised), ``log_prob`` (sum of token log-probabilities, EOS included when
    ``finished``), ``finished`` (False: it reached ``max_new_tokens`` without EOS)."""

    ids: list
    score: float
    log_prob: float
    finished: bool


def _flat_rows(indices, group):
    """``(batch, k)`` indices into groups of ``group`` rows -> flat row numbers ``(batch*k,)``."""
    batch = indices.shape[0]
    offsets = ops.expand_dims(ops.arange(batch, dtype="int32") * group, 1)
    return ops.reshape(offsets + ops.cast(indices, "int32"), (-1,))


def beam_search_loop(steps, static, state, batch, beam, width, alpha, min_new, eos_id, active):
    """The batched beam search; returns the final loop state (NumPy-convertible dict)."""
    max_new = width - 1
    vocab = steps.vocab_size
    max_penalty = length_penalty(float(max_new), alpha)
    rules = TokenRules(vocab, eos_id)

    def cond(s):
        worst_finished = ops.min(s["finished_score"], axis=1)
        best_alive = ops.max(s["alive_logp"], axis=1) / max_penalty
        done = ops.logical_or(ops.greater_equal(worst_finished, best_alive),
                              ops.logical_not(active))
        return ops.logical_and(ops.less(s["index"] + 1, width),
                               ops.logical_not(ops.all(done)))

    def body(s):
        index = s["index"]
        position = index + 1
        logits, new_state = steps.step(s["alive"], index, s["state"], static)
        logits = ops.cast(logits, "float32")
        # log p(prefix) + log softmax(logits) (one fused pass; logsumexp takes several)
        scores = log_softmax_plus(logits, s["alive_logp"])
        candidates = rules.apply(scores, index < min_new, owned=True)  # (batch * beam, vocab)
        top_logp, top_ids = chunked_top_k(ops.reshape(candidates, (batch, beam * vocab)),
                                          2 * beam)
        parent, token = ops.floor_divide(top_ids, vocab), ops.mod(top_ids, vocab)
        # (batch * 2beam, width): the parents' sequences with the new token written in
        grown = ops.take(s["alive"], _flat_rows(parent, beam), axis=0)
        grown = ops.slice_update(grown, [0, position],
                                 ops.reshape(token, (batch * 2 * beam, 1)))
        is_eos = ops.equal(token, eos_id)

        # finished: the best `beam` of the kept ones and the candidates that end here, if
        # among the best `beam` candidates (as in fairseq: so beam 1 is greedy search)
        penalty = length_penalty(ops.cast(position, "float32"), alpha)
        in_beam = ops.expand_dims(ops.less(ops.arange(2 * beam), beam), 0)
        new_scores = ops.where(ops.logical_and(is_eos, in_beam), top_logp / penalty, NEG_INF)
        scores = ops.concatenate([s["finished_score"], new_scores], axis=1)
        finished_score, pick = ops.top_k(scores, beam)
        pool = ops.concatenate([ops.reshape(s["finished"], (batch, beam, width)),
                                ops.reshape(grown, (batch, 2 * beam, width))], axis=1)
        pool = ops.reshape(pool, (batch * 3 * beam, width))
        pick_rows = _flat_rows(pick, 3 * beam)
        logps = ops.concatenate([s["finished_logp"], top_logp], axis=1)
        lengths = ops.concatenate(
            [s["finished_length"], ops.full((batch, 2 * beam), position, "int32")], axis=1)

        # alive: the best `beam` candidates that did not end
        alive_logp, keep = ops.top_k(ops.where(is_eos, NEG_INF, top_logp), beam)
        keep_rows = _flat_rows(keep, 2 * beam)
        parents = ops.take(ops.reshape(parent, (-1,)), keep_rows, axis=0)
        parent_rows = ops.reshape(
            ops.expand_dims(ops.arange(batch, dtype="int32") * beam, 1)
            + ops.reshape(parents, (batch, beam)), (-1,))
        return dict(
            index=index + 1,
            state=steps.reorder(new_state, parent_rows, position),
            alive=ops.take(grown, keep_rows, axis=0),
            alive_logp=alive_logp,
            finished=ops.take(pool, pick_rows, axis=0),
            finished_score=finished_score,
            finished_logp=ops.reshape(ops.take(ops.reshape(logps, (-1,)), pick_rows, axis=0),
                                      (batch, beam)),
            finished_length=ops.reshape(
                ops.take(ops.reshape(lengths, (-1,)), pick_rows, axis=0), (batch, beam)),
        )

    rows = batch * beam
    alive = ops.concatenate([ops.full((rows, 1), BOS_ID, "int32"),
                             ops.zeros((rows, width - 1), "int32")], axis=1)
    first = np.full((batch, beam), NEG_INF, dtype="float32")
    first[:, 0] = 0.0  # all beams start equal: expand only the first one
    init = dict(index=start_index(0), state=state, alive=alive,
                alive_logp=ops.convert_to_tensor(first),
                finished=ops.zeros((rows, width), "int32"),
                finished_score=ops.full((batch, beam), NEG_INF, "float32"),
                finished_logp=ops.full((batch, beam), NEG_INF, "float32"),
                finished_length=ops.zeros((batch, beam), "int32"))
    final = while_loop(cond, body, init)
    final.pop("state")
    return final


def beam_translate(model, source_ids, bos_id=BOS_ID, eos_id=EOS_ID, max_new_tokens=None,
                   beam_size=4, alpha=0.6, n_best=1, min_new_tokens=0, use_cache=True):
    """Beam-search translations of a batch with a ``Transformer``.

    Args:
        model, source_ids, bos_id, eos_id, max_new_tokens, min_new_tokens, use_cache: as in
            :func:`~transformerkit.decoding.greedy_translate`.
        beam_size: int >= 1, hypotheses kept per sentence.
        alpha: float >= 0, length penalty exponent (0 = plain log-probability).
        n_best: int in ``[1, beam_size]``, hypotheses returned per sentence.

    Returns:
        ``batch`` lists of ``n_best`` :class:`Hypothesis`, best first (sorted by score).
        Sentences that reach ``max_new_tokens`` without EOS also offer their live beams,
        marked ``finished=False``.
    """
    if bos_id != BOS_ID:
        raise ValueError(f"beam search starts every target with id {BOS_ID}, got bos_id={bos_id}")
    beam_size, n_best = int(beam_size), int(n_best)
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size={beam_size}, got {n_best}")
    if alpha < 0:
        raise ValueError(f"alpha (length penalty) must be >= 0, got {alpha}")
    max_new = check_max_new_tokens(max_new_tokens, model.max_length)
    source, active = prepare_sources(model, source_ids)
    batch = np.asarray(source_ids).shape[0]
    steps = make_steps(model, use_cache)
    alpha = float(alpha)

    def decode(source, active, min_new):
        state, static = steps.start(source, max_new, copies=beam_size)
        return beam_search_loop(steps, static, state, source.shape[0], beam_size, max_new + 1,
                                alpha, min_new, eos_id, active)

    key = ("beam", beam_size, alpha, max_new, eos_id, use_cache)
    out = run_decoder(model, key, decode, source, active, np.int32(min_new_tokens))
    return [_n_best(out, row, beam_size, n_best, alpha, eos_id) for row in range(batch)]


def _n_best(out, row, beam, n_best, alpha, eos_id):
    """The ``n_best`` hypotheses of sentence ``row``: finished ones and, when the length
    limit was hit, the live beams (scored as if they ended there)."""
    found = []
    for k in range(beam):
        score = float(out["finished_score"][row, k])
        if np.isfinite(score):
            found.append(Hypothesis(cut_at_eos(out["finished"][row * beam + k, 1:], eos_id),
                                    score, float(out["finished_logp"][row, k]), True))
    steps = int(out["index"])
    if len(found) < n_best or steps + 1 >= out["alive"].shape[1]:
        for k in range(beam):
            logp = float(out["alive_logp"][row, k])
            if np.isfinite(logp):
                found.append(Hypothesis(cut_at_eos(out["alive"][row * beam + k, 1:], eos_id),
                                        logp / length_penalty(steps, alpha), logp, False))
    found.sort(key=lambda h: -h.score)
    return found[:n_best]
