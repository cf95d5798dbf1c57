"""Beam search with a length penalty, n-best lists, three stopping rules, length caps.

The beams of all sentences are rows of one batch, ``(batch * beam, ...)``: one decoder
step scores every beam at once, and the self-attention caches follow their beams by
``ops.take`` on the row axis. Every step keeps ``2 * beam`` candidates, so that even if
``beam`` of them end with EOS there are ``beam`` live ones left; an EOS candidate becomes
a finished hypothesis only if it is among the best ``beam`` candidates (as in fairseq and
``transformers``, so beam size 1 is exactly greedy search with ``alpha=0``).

A finished hypothesis ``y`` scores ``log p(y | x) / lp(|y|)``, ``|y|`` counting its end
token, with the GNMT ``lp(n) = ((5 + n) / 6) ** alpha`` (Wu et al. 2016; the Transformer
paper used beam 4 and alpha 0.6) or, with ``penalty="power"``, ``lp(n) = n ** alpha``
(``transformers``' and CTranslate2's ``length_penalty``). When a sentence's search is over
(``stopping``):

- ``"exact"``: when its worst kept finished score beats the best score any live beam could
  still reach (its log-probability can only fall, and its penalty is at most
  ``lp(cap)``), so stopping never changes the result of searching to the length cap
  (``transformers``' ``early_stopping="never"``);
- ``"early"``: as soon as ``beam`` hypotheses have finished (the rule of CTranslate2 and of
  ``transformers``' ``early_stopping=True``), or when the exact rule holds;
- ``"heuristic"``: when ``beam`` hypotheses have finished and the best live beam, scored
  at its current length, does not beat the worst of them (``transformers``' default,
  ``early_stopping=False``: a longer hypothesis may still have won);

and in all cases when it reaches its length cap (``max_new_tokens``, or
``max_len_a * source_len + max_len_b``). With ``forced_eos`` the token at the cap can only
be the end token, with log-probability 0 (``transformers``' ``forced_eos_token_id``); with
``renormalize`` PAD and BOS are ruled out before the softmax (``renormalize_logits``), else
after it, and so are, with ``no_repeat_ngram_size`` n, the ids that would give a hypothesis
an n-gram twice (:func:`~.common.ban_repeated_ngrams`). In the eager PyTorch loop a
sentence whose search is over leaves the batch: its beams' rows are dropped from the caches
and its encoder memory with them, in the same row gather that reorders the surviving beams.
The compiled JAX/TensorFlow loops keep fixed shapes (their while loops need loop-invariant
shapes) and freeze a finished sentence's beams instead; both give the same hypotheses.
"""

from dataclasses import dataclass

import numpy as np

from transformerkit import fastpath
from transformerkit.decoding.common import (
    NEG_INF,
    TokenRules,
    ban_repeated_ngrams,
    check_max_new_tokens,
    chunked_top_k,
    cut_at_eos,
    grouped_top_k,
    length_caps,
    length_penalty,
    log_softmax_plus,
    prepare_sources,
)
from transformerkit.decoding.compiled import (
    is_eager_loop,
    run_decoder,
    start_index,
    to_numpy,
    while_loop,
)
from transformerkit.decoding.loop_ops import loop_ops
from transformerkit.decoding.options import SearchOptions, resolve
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


def _flat_rows(xp, indices, group):
    """``(batch, k)`` indices into groups of ``group`` rows -> flat row numbers ``(batch*k,)``."""
    batch = indices.shape[0]
    offsets = xp.expand_dims(xp.arange(batch, dtype="int32") * group, 1)
    return xp.reshape(offsets + xp.cast(indices, "int32"), (-1,))


_SENTENCE_FIELDS = ("alive_logp", "finished_score", "finished_logp", "finished_length",
                    "max_penalty", "cap", "active")  # (batch, ...) arrays of the loop state
_ROW_FIELDS = ("alive", "finished")  # (batch * beam, width) arrays
SCORE_CHUNK = 64  # the chunk width of a captured search's top-k (grouped_top_k)


def beam_search_loop(steps, static, state, batch, options, min_new, eos_id, active, caps,
                     width, drop_finished=True):
    """The batched beam search; returns the final loop state (NumPy-convertible dict).

    ``options``: the :class:`SearchOptions` (its ``width`` beams per sentence; ``alpha``,
    ``penalty``, ``stopping``, ``forced_eos``, ``renormalize``). ``active`` ``(batch,)``
    bool (False: bucket padding; the compiled loops also clear it for a sentence whose
    search is over), ``caps`` ``(batch,)`` int32: the most tokens of each
    sentence (at most ``width - 1``, the buffer's width without BOS). ``drop_finished``:
    finished sentences leave the batch in the eager loop (ignored by compiled loops)."""
    xp = loop_ops()  # keras.ops; torch's kernels on eager PyTorch
    vocab = steps.vocab_size
    rules = TokenRules.shared(vocab, eos_id)
    beam, alpha, form = options.width, options.alpha, options.penalty
    stopping = options.stopping

    def penalty_at(length):
        """``lp(length)`` of an int or an int32 tensor (float32)."""
        return length_penalty(xp.cast(length, "float32"), alpha, form)

    def over(s, index):
        """``(n,)`` bool: whose search is over after ``index`` steps."""
        worst_finished = xp.min(s["finished_score"], axis=1)
        if stopping == "heuristic":  # the live beams' current length (at least 1 token)
            bound = penalty_at(max(index, 1) if isinstance(index, int)
                               else xp.maximum(index, 1))
        else:  # exact: the most any live beam's penalty can become
            bound = s["max_penalty"]
        done = xp.greater_equal(worst_finished, xp.max(s["alive_logp"], axis=1) / bound)
        if stopping == "early":
            done = xp.logical_or(done, xp.greater(worst_finished, NEG_INF))
        done = xp.logical_or(done, xp.greater_equal(index, s["cap"]))
        return xp.logical_or(done, xp.logical_not(s["active"]))

    def candidates_of(logits, s, index):
        """``(n * beam, vocab)`` scores of every extension: log p(prefix) + log p(token),
        the ruled-out ids and those that would repeat an n-gram
        (``no_repeat_ngram_size``) -inf (before or after the softmax, ``renormalize``), only EOS
        where a sentence reaches its cap (``forced_eos``)."""
        prefix = xp.reshape(s["alive_logp"], (-1,))
        forbid_eos = index < min_new

        def ruled(x):  # the token rules, then the repeated n-grams
            return ban_repeated_ngrams(xp, rules.apply(x, forbid_eos, owned=True), s["alive"],
                                       index, options.no_repeat_ngram_size)

        # log p(prefix) + log softmax(logits) is one fused pass (logsumexp takes several)
        if options.renormalize:
            scores = log_softmax_plus(ruled(logits), prefix)
        else:
            scores = ruled(log_softmax_plus(logits, prefix))
        if options.forced_eos:
            at_cap = xp.greater_equal(index + 1, s["cap"])  # (n,)
            if not isinstance(index, int) or not bool(xp.all(xp.logical_not(at_cap))):
                scores = rules.force_eos(scores, prefix, xp.repeat(at_cap, beam, axis=0))
        return scores

    def scores_of(logits, s, index):
        """``score(values, rows, columns)`` of :func:`~.common.grouped_top_k`: the scores
        :func:`candidates_of` gives (without n-gram bans), element by element, in its order
        of operations: each row's log-softmax normalizer computed once as the captured
        log-softmax computes it (the row's maximum, the log of the sum of the exponentials
        of the row less it), the prefix's log-probability and the token rules."""
        import torch

        prefix = xp.reshape(s["alive_logp"], (-1, 1))
        zeros = xp.zeros((1, vocab), "float32")
        ruled = rules.apply(zeros, False)  # (1, vocab): 0, or -inf where ruled out
        only_eos = rules.force_eos(zeros, xp.zeros((1,), "float32"), xp.full((1,), True, "bool"))
        normalized = logits + ruled if options.renormalize else logits
        peak = normalized.amax(1, keepdim=True)
        log_sum = torch.log(torch.exp(normalized - peak).sum(1, keepdim=True))
        at_cap = None
        if options.forced_eos:
            at_cap = xp.reshape(xp.repeat(xp.greater_equal(index + 1, s["cap"]), beam, axis=0),
                                (-1, 1))

        def score(values, rows, columns):
            def of_row(t):
                return t if rows is None else t[rows, 0]

            def of_column(t):
                return t if columns is None else t[0, columns]

            if options.renormalize:
                out = (values + of_column(ruled) - of_row(peak) - of_row(log_sum)) + of_row(prefix)
            else:
                out = ((values - of_row(peak)) - of_row(log_sum)) + of_row(prefix) \
                    + of_column(ruled)
            if at_cap is not None:
                out = torch.where(of_row(at_cap), of_row(prefix) + of_column(only_eos), out)
            return out

        return score

    def top_candidates(logits, s, index):
        """The best ``2 * beam`` extensions of each of the ``n`` sentences of ``s``:
        ``(log-probabilities (n, 2 * beam), ids (n, 2 * beam) int32 into beam * vocab)``, the
        :func:`~.common.chunked_top_k` of :func:`candidates_of`'s scores. A captured graph
        (the compiled engine's step work: ``fastpath.exporting``) without n-gram bans
        takes the same best of the same scores without writing them
        (:func:`~.common.grouped_top_k`; the package's call at 256 rows of 8,000 words took
        0.63x the time of the one that writes them: ``bench/results/search_work.*``)."""
        n, k = s["alive_logp"].shape[0], 2 * beam
        if fastpath.exporting() and not options.no_repeat_ngram_size and int(min_new) == 0 \
                and beam * (vocab // SCORE_CHUNK) >= 2 * k:
            return grouped_top_k(logits, scores_of(logits, s, index), k, beam, SCORE_CHUNK)
        candidates = candidates_of(logits, s, index)
        return chunked_top_k(xp.reshape(candidates, (n, beam * vocab)), k)

    def choose(logits, s, index):
        """The search's work of one step of the ``n`` sentences of ``s`` after the model's:
        from the logits ``(n * beam, vocab)`` of the step at ``index``, the new fields and
        the parent row of each new live beam ``(n * beam,)``."""
        n = s["alive_logp"].shape[0]
        position = index + 1
        top_logp, top_ids = top_candidates(xp.cast(logits, "float32"), s, index)
        parent, token = xp.floor_divide(top_ids, vocab), xp.mod(top_ids, vocab)
        # (n * 2beam, width): the parents' sequences with the new token written in
        grown = xp.take(s["alive"], _flat_rows(xp, parent, beam), axis=0)
        grown = xp.slice_update(grown, [0, position], xp.reshape(token, (n * 2 * beam, 1)))
        is_eos = xp.equal(token, eos_id)

        # finished: the best `beam` of the kept ones and the candidates that end here, if
        # among the best `beam` candidates (as in fairseq: so beam 1 is greedy search)
        penalty = penalty_at(position)
        in_beam = xp.expand_dims(xp.less(xp.arange(2 * beam), beam), 0)
        new_scores = xp.where(xp.logical_and(is_eos, in_beam), top_logp / penalty, NEG_INF)
        scores = xp.concatenate([s["finished_score"], new_scores], axis=1)
        finished_score, pick = xp.top_k(scores, beam)
        length = s["alive"].shape[1]  # the buffers' width (a captured dimension)
        pool = xp.concatenate([xp.reshape(s["finished"], (n, beam, length)),
                                xp.reshape(grown, (n, 2 * beam, length))], axis=1)
        pool = xp.reshape(pool, (n * 3 * beam, length))
        pick_rows = _flat_rows(xp, pick, 3 * beam)
        logps = xp.concatenate([s["finished_logp"], top_logp], axis=1)
        lengths = xp.concatenate(
            [s["finished_length"], xp.full((n, 2 * beam), position, "int32")], axis=1)

        # alive: the best `beam` candidates that did not end
        alive_logp, keep = xp.top_k(xp.where(is_eos, NEG_INF, top_logp), beam)
        keep_rows = _flat_rows(xp, keep, 2 * beam)
        parents = xp.take(xp.reshape(parent, (-1,)), keep_rows, axis=0)
        parent_rows = xp.reshape(
            xp.expand_dims(xp.arange(n, dtype="int32") * beam, 1)
            + xp.reshape(parents, (n, beam)), (-1,))
        new = dict(s, index=index + 1, alive=xp.take(grown, keep_rows, axis=0),
                   alive_logp=alive_logp, finished=xp.take(pool, pick_rows, axis=0),
                   finished_score=finished_score,
                   finished_logp=xp.reshape(
                       xp.take(xp.reshape(logps, (-1,)), pick_rows, axis=0), (n, beam)),
                   finished_length=xp.reshape(
                       xp.take(xp.reshape(lengths, (-1,)), pick_rows, axis=0), (n, beam)))
        return new, parent_rows

    def step(s, static):
        """The model's step at ``s["index"]``: logits ``(n * beam, vocab)``, caches."""
        index = s["index"]
        if beam > 1 and isinstance(index, int) and index == 0 \
                and hasattr(steps, "first_step_of_copies"):
            # every beam of a sentence holds the same prefix (BOS): one row per sentence
            return steps.first_step_of_copies(s["alive"], s["state"], static)
        return steps.step(s["alive"], index, s["state"], static)

    def expand(s, static):
        """One step of the ``n`` sentences of ``s``: the new fields, the parent row of each
        new live beam ``(n * beam,)`` and the caches before reordering."""
        logits, new_state = step(s, static)
        new, parent_rows = choose(logits, s, s["index"])
        return new, parent_rows, new_state

    def advance(logits, s, index):
        """:func:`choose`, and whose search is over after it ``(n,)`` bool: all of a step's
        search work in the eager loop, which the compiled engine runs as one native call
        (``steps.search_work``)."""
        new, parent_rows = choose(logits, s, index)
        return new, parent_rows, over(new, index + 1)

    rows = batch * beam
    caps = xp.convert_to_tensor(caps, "int32")
    first = np.full((batch, beam), NEG_INF, dtype="float32")
    first[:, 0] = 0.0  # all beams start equal: expand only the first one
    init = dict(index=start_index(0), state=state,
                alive=xp.concatenate([xp.full((rows, 1), BOS_ID, "int32"),
                                       xp.zeros((rows, width - 1), "int32")], axis=1),
                alive_logp=xp.convert_to_tensor(first),
                finished=xp.zeros((rows, width), "int32"),
                finished_score=xp.full((batch, beam), NEG_INF, "float32"),
                finished_logp=xp.full((batch, beam), NEG_INF, "float32"),
                finished_length=xp.zeros((batch, beam), "int32"),
                max_penalty=penalty_at(caps),
                cap=caps,
                active=xp.convert_to_tensor(active, "bool"))
    if drop_finished and is_eager_loop():
        work = advance
        if hasattr(steps, "search_work") and int(min_new) == 0:  # the compiled engine's
            work = steps.search_work(advance, {
                "search": "beam", "vocab": vocab, "eos_id": eos_id, "beam": beam,
                "alpha": alpha, "penalty": form, "stopping": stopping,
                "forced_eos": options.forced_eos, "renormalize": options.renormalize,
                "no_repeat_ngram_size": options.no_repeat_ngram_size,
                "score_chunk": SCORE_CHUNK})
        return _live_sentences_loop(xp, steps, static, init, beam, width, step, work)

    def cond(s):
        return xp.logical_and(xp.less(s["index"] + 1, width),
                               xp.logical_not(xp.all(over(s, s["index"]))))

    def body(s):
        done = over(s, s["index"])  # these sentences keep what they have (fixed shapes)
        new, parent_rows, new_state = expand(s, static)
        rows_done = xp.expand_dims(xp.repeat(done, beam, axis=0), 1)
        for name in _SENTENCE_FIELDS:
            new[name] = xp.where(xp.reshape(done, (-1,) + (1,) * (len(new[name].shape) - 1)),
                                  s[name], new[name])
        for name in _ROW_FIELDS:
            new[name] = xp.where(rows_done, s[name], new[name])
        # over stays over: the heuristic rule's bound moves with the index, which a frozen
        # sentence would otherwise meet again (transformers keeps the same flag)
        new["active"] = xp.logical_and(s["active"], xp.logical_not(done))
        new["state"] = steps.reorder(new_state, parent_rows, s["index"] + 1)
        return new

    final = while_loop(cond, body, init)
    final.pop("state")
    return final


def _live_sentences_loop(xp, steps, static, s, beam, width, step, work):
    """The eager loop of :func:`beam_search_loop` where a sentence whose search is over
    leaves the batch: its final fields are copied out (NumPy) and the next step runs on the
    other sentences' beams only. ``step(s, static)``: the model's logits and caches;
    ``work(logits, s, index)``: the search's work of the step (``advance``)."""
    batch = s["alive_logp"].shape[0]
    out = {name: np.array(to_numpy(s[name])) for name in _SENTENCE_FIELDS + _ROW_FIELDS}
    live = np.arange(batch)
    active = out["active"]
    if not active.all():  # bucket padding: never decoded
        kept = np.flatnonzero(active)
        rows = xp.convert_to_tensor((kept[:, None] * beam + np.arange(beam)).reshape(-1),
                                     "int32")
        static = steps.select_sources(static, rows)
        s = dict(s, state=steps.reorder(s["state"], rows, 0),
                 **{k: xp.take(s[k], xp.convert_to_tensor(kept, "int32"), axis=0)
                    for k in _SENTENCE_FIELDS},
                 **{k: xp.take(s[k], rows, axis=0) for k in _ROW_FIELDS})
        live = kept
    while live.size and s["index"] + 1 < width:
        logits, new_state = step(s, static)
        s, parent_rows, done = work(logits, s, s["index"])
        index = s["index"]
        done = np.asarray(to_numpy(done), bool)
        if index + 1 >= width:
            done[:] = True
        if done.any():
            row_done = np.repeat(done, beam)
            for name in _SENTENCE_FIELDS:
                out[name][live[done]] = to_numpy(s[name])[done]
            for name in _ROW_FIELDS:
                out[name][np.repeat(live[done] * beam, beam) + np.tile(np.arange(beam),
                                                                       int(done.sum()))] = \
                    to_numpy(s[name])[row_done]
            if done.all():
                live = live[:0]
                break
            kept = np.flatnonzero(~done)
            kept_t = xp.convert_to_tensor(kept, "int32")
            rows = xp.convert_to_tensor(np.flatnonzero(~row_done), "int32")
            static = steps.select_sources(static, rows)
            parent_rows = xp.take(parent_rows, rows, axis=0)
            s = dict(s, **{k: xp.take(s[k], kept_t, axis=0) for k in _SENTENCE_FIELDS},
                     **{k: xp.take(s[k], rows, axis=0) for k in _ROW_FIELDS})
            live = live[kept]
        s["state"] = steps.reorder(new_state, parent_rows, index)
    out["index"] = np.int32(s["index"])
    return out


def beam_translate(model, source_ids, options=None, *, bos_id=BOS_ID, eos_id=EOS_ID,
                   use_cache=True, drop_finished=True, precision="float32", **search):
    """Beam-search translations of a batch with a ``Transformer``.

    Args:
        model, source_ids, bos_id, eos_id, use_cache, drop_finished, precision: as in
            :func:`~transformerkit.decoding.greedy_translate`.
        options: a :class:`~transformerkit.decoding.options.SearchOptions` (None: its
            defaults), ``search`` any of its fields in its place. Used here: ``beam_size``
            (the beam widens to ``n_best`` when that is larger), ``alpha`` and ``penalty``
            (the length penalty's exponent and form, see the module docstring; alpha 0 =
            plain log-probability), ``n_best`` (hypotheses returned per sentence),
            ``max_new_tokens``, ``min_new_tokens``, ``max_len_a`` / ``max_len_b`` (each
            output has at most ``floor(max_len_a * source_len + max_len_b)`` tokens, EOS
            included, as fairseq;
            both None: only ``max_new_tokens``), ``forced_eos``, ``renormalize``,
            ``no_repeat_ngram_size`` (no n-gram of that many tokens twice in a hypothesis) and
            ``stopping``: ``"exact"`` (a sentence's search ends when no live beam can beat
            its finished hypotheses: the best result within the length cap), ``"early"``
            (it also ends once ``beam_size`` hypotheses have finished, as CTranslate2 and
            ``transformers``' ``early_stopping=True``; faster, rarely different) or
            ``"heuristic"`` (``transformers``' default rule).

    Returns:
        ``batch`` lists of ``n_best`` :class:`Hypothesis`, best first (sorted by score).
        Sentences that reach their length cap without EOS also offer their live beams,
        marked ``finished=False``.
    """
    options = resolve(SearchOptions, options, search, "beam_translate")
    if bos_id != BOS_ID:
        raise ValueError(f"beam search starts every target with id {BOS_ID}, got bos_id={bos_id}")
    beam_size = options.width
    max_new = check_max_new_tokens(options.max_new_tokens, model.max_length)
    source, active = prepare_sources(model, source_ids)
    batch = np.asarray(source_ids).shape[0]
    caps = length_caps(source, max_new, options.max_len_a, options.max_len_b)
    if is_eager_loop():  # no buffer or cache longer than needed
        max_new = int(caps.max())
    steps = make_steps(model, use_cache, precision)

    def decode(source, active, caps, min_new):
        state, static = steps.start(source, max_new, copies=beam_size)
        return beam_search_loop(steps, static, state, source.shape[0], options, min_new,
                                eos_id, active, caps, max_new + 1, drop_finished)

    key = ("beam", beam_size, options.alpha, options.penalty, options.stopping,
           options.forced_eos, options.renormalize, options.no_repeat_ngram_size, max_new,
           eos_id, use_cache,
           getattr(steps, "precision", "float32"))
    # more than the cap is the cap (and an int32: huge values from a request fit)
    least = np.int32(min(options.min_new_tokens, max_new + 1))
    out = run_decoder(model, key, decode, source, active, caps, least)
    return [_n_best(out, row, options, eos_id) for row in range(batch)]


def _n_best(out, row, options, eos_id):
    """The ``options.n_best`` hypotheses of sentence ``row``: finished ones and, when its
    length cap was hit, the live beams (scored as if they ended there)."""
    beam, n_best = options.width, options.n_best
    found = []
    for k in range(beam):
        score = float(out["finished_score"][row, k])
        if np.isfinite(score):
            found.append(Hypothesis(cut_at_eos(out["finished"][row * beam + k, 1:], eos_id),
                                    score, float(out["finished_logp"][row, k]), True))
    # live beams hold no padding: their length is the steps this sentence ran
    steps = int(np.count_nonzero(out["alive"][row * beam, 1:]))
    if len(found) < n_best or steps >= int(out["cap"][row]):
        for k in range(beam):
            logp = float(out["alive_logp"][row, k])
            if np.isfinite(logp):
                found.append(Hypothesis(cut_at_eos(out["alive"][row * beam + k, 1:], eos_id),
                                        logp / length_penalty(steps, options.alpha,
                                                                options.penalty),
                                        logp, False))
    found.sort(key=lambda h: -h.score)
    return found[:n_best]
