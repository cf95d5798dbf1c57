"""Bounds and comparisons of search results, for every test that compares two searches.

Beam scores and sequence log-probabilities are sums of per-token log-probabilities, within
their rounding bound (built on ``tolerances.py``'s float32 bounds); a search's ids may differ
from another's at a near-tie of its logits, which :func:`assert_same_ids_or_near_tie` and
:func:`assert_same_hypotheses_or_near_tie` check against a third pass instead of failing.
Used by the decoding, decoder-step, CTranslate2 export and serving tests.
"""

import numpy as np
import tolerances as tol
from keras import ops

from transformerkit.data.padding import pad_batch
from transformerkit.special_tokens import BOS_ID, EOS_ID, PAD_ID


def output_vocab(model):
    return getattr(model, "target_vocab_size", None) or model.vocab_size


def logp_roundings(model, source_len, target_len):
    """One token's log-probability: twice the logits' roundings (a log-softmax moves by at
    most twice its logits' largest error: the logit's and the log-sum-exp's) and its own
    (the sum over the vocabulary, exp, log, the max shift)."""
    return (2 * tol.model_roundings(model, source_len, target_len) + output_vocab(model)
            + tol.SOFTMAX_EXTRA)


def score_atol(model, source_len, length, magnitude, paths=2):
    """A beam score or sequence log-probability of ``length`` tokens: ``length`` times one
    token's bound, whose chain also holds the running sum (``length`` additions) and the
    length penalty (its power and two divisions), relative to ``magnitude``, the largest
    |logit| or |log-probability| along the sequences (:func:`sequence_magnitude`)."""
    n = logp_roundings(model, source_len, length) + length + tol.ELEMENTWISE_ULPS + 2
    return length * tol.chain_atol(n, magnitude, paths)


def sequence_magnitude(model, source_ids, outputs):
    """The largest |logit| and |log-probability of a label| of one teacher-forced pass of a
    ``Transformer`` over ``[BOS] + ids`` (labels ``ids + [EOS]``) of each output (source row
    ``i`` of ``source_ids`` for output ``i``): what a score's roundings are relative to."""
    labels = pad_batch([[int(i) for i in y] + [EOS_ID] for y in outputs])[:, :model.max_length]
    decoder_input = np.concatenate([np.full((len(labels), 1), BOS_ID, "int32"),
                                    labels[:, :-1]], axis=1)
    decoder_input[labels == PAD_ID] = PAD_ID
    logits = ops.convert_to_numpy(model((np.asarray(source_ids, "int32"), decoder_input),
                                        training=False)).astype("float64")
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    real = labels != PAD_ID
    picked = np.take_along_axis(logp, labels[..., None], axis=-1)[..., 0][real]
    return max(float(np.abs(logits[real]).max()), float(np.abs(picked).max()))


def score_bound(model, source_ids, hypotheses, paths=2):
    """``atol(length)`` for :func:`assert_same_hypotheses_or_near_tie`: :func:`score_atol`
    relative to the magnitude of every hypothesis given (``hypotheses[row]``: the ids lists
    or hypotheses of source row ``row``; several lists may be added together)."""
    source_ids = np.asarray(source_ids)
    rows, outputs = [], []
    for row, found in enumerate(hypotheses):
        for h in found:
            rows.append(row % len(source_ids))
            outputs.append(list(h) if isinstance(h, (list, np.ndarray)) else _hypothesis(h)[0])
    magnitude = sequence_magnitude(model, source_ids[rows], outputs)
    return lambda length: score_atol(model, source_ids.shape[1], length, magnitude, paths)


def next_logits_after(model, source_ids=None, prompts=None):
    """``next_logits(row, prefix)`` for :func:`assert_same_ids_or_near_tie`: one forward
    pass's float64 logits of the token after ``[BOS] + prefix`` (a ``Transformer``, source
    row ``row``) or after ``prompts[row] + prefix`` (a ``GPT``), PAD and BOS at -inf (never
    chosen), and the gap a near-tie may have there: four paths' bound (each search chose its
    token by logits within one path's bound, so the exact logits of the two tokens are within
    two paths' of each other and of the best; this pass adds one path's on each side)."""
    def next_logits(row, prefix):
        if prompts is None:
            source = np.asarray(source_ids, "int32")[row:row + 1]
            ids = np.array([[BOS_ID, *prefix]], "int32")
            logits = model((source, ids), training=False)
            lengths = (source.shape[1], ids.shape[1])
        else:
            ids = np.array([[*prompts[row], *prefix]], "int32")
            logits = model(ids, training=False)
            lengths = (0, ids.shape[1])
        logits = ops.convert_to_numpy(logits)[0, -1].astype("float64")
        logits[[PAD_ID, BOS_ID]] = -np.inf
        atol = tol.chain_atol(tol.model_roundings(model, *lengths), logits[2:], paths=4)
        return logits, atol

    return next_logits


def first_difference(x, y):
    """The first step where id lists ``x`` and ``y`` differ (the shorter one's length if
    one is a prefix of the other)."""
    n = min(len(x), len(y))
    return next((t for t in range(n) if x[t] != y[t]), n)


def assert_same_ids_or_near_tie(a, b, next_logits, err_msg=""):
    """Token ids ``a[row]``, ``b[row]`` of two decodings whose float32 kernels (or shapes)
    differ: equal, except that from a first differing step on a row may differ where the
    two tokens chosen there (the end token where one row ends) are a near-tie, both within
    the bound of the best logit of a third pass, ``next_logits(row, prefix) -> (logits,
    atol)`` (:func:`next_logits_after`); later steps follow other prefixes and are not
    compared. Returns the rows that differ at a near-tie."""
    assert len(a) == len(b), (err_msg, a, b)
    ties = []
    for row, (x, y) in enumerate(zip(a, b, strict=True)):
        x, y = [int(i) for i in x], [int(i) for i in y]
        if x == y:
            continue
        step = first_difference(x, y)
        logits, atol = next_logits(row, x[:step])
        chosen = [ids[step] if step < len(ids) else EOS_ID for ids in (x, y)]
        behind = logits.max() - logits[chosen]
        assert (behind <= atol).all(), (
            f"{err_msg + ': ' if err_msg else ''}row {row} differs at step {step} (ids "
            f"{chosen[0]} / {chosen[1]}, {behind[0]:.3g} / {behind[1]:.3g} below the best "
            f"logit), no near-tie within {atol:.3g}:\n{x}\n{y}")
        ties.append(row)
    return ties


def assert_same_texts_or_near_tie(run, sources, a, b, err_msg=""):
    """Translations ``a``, ``b`` of the texts ``sources`` by a run (``transformerkit.load``)
    through other kernels (another engine, another batch): their target ids equal except at
    a near-tie of the run's Keras model (:func:`assert_same_ids_or_near_tie`)."""
    tok = run.target_tokenizer
    source_ids = pad_batch([run.source_tokenizer.encode(t, add_eos=True) for t in sources])
    return assert_same_ids_or_near_tie([tok.encode(t) for t in a], [tok.encode(t) for t in b],
                                       next_logits_after(run.model, source_ids), err_msg)


def _hypothesis(h):
    """``(ids, score, finished or None)`` of a ``Hypothesis`` or an ``(ids, score)`` pair."""
    if isinstance(h, tuple):
        return [int(i) for i in h[0]], float(h[1]), None
    return [int(i) for i in h.ids], float(h.score), h.finished


def assert_same_hypotheses_or_near_tie(a, b, atol, err_msg=""):
    """n-best lists of one sentence, best first, from two beam searches whose float32 kernels
    (or shapes) differ (``Hypothesis`` or ``(ids, score)``): rank by rank the same ids (and
    ``finished``) with scores within ``atol(length)`` (two paths' bound of a score of
    ``length`` tokens, :func:`score_bound`), up to a first rank where they differ, which must
    be a near-tie: the two scores within twice that (each search ranked by scores within one
    path's bound, so the exact scores are within two paths' of each other, the reported ones
    within four). Later ranks are not compared: a near-tie may also have kept another
    candidate in a beam. Returns whether a near-tie was met."""
    assert len(a) == len(b), (err_msg, a, b)
    for rank, (x, y) in enumerate(zip(a, b, strict=True)):
        (ids_x, score_x, done_x), (ids_y, score_y, done_y) = _hypothesis(x), _hypothesis(y)
        same = ids_x == ids_y and (None in (done_x, done_y) or done_x == done_y)
        length = max(len(ids_x), len(ids_y)) + 1  # the end token's step too
        bound = atol(length) * (1 if same else 2)
        assert abs(score_x - score_y) <= bound, (
            f"{err_msg + ': ' if err_msg else ''}rank {rank}: "
            f"{'scores' if same else 'other hypotheses, no near-tie:'} {score_x:.7g} / "
            f"{score_y:.7g} ({abs(score_x - score_y):.3g} apart, bound {bound:.3g}):\n"
            f"{ids_x} ({done_x})\n{ids_y} ({done_y})")
        if not same:
            return True
    return False
