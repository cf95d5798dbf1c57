"""Pieces every decoder shares: input checks and bucketing, length caps, token rules, output
cleanup."""


import numpy as np

from transformerkit import fastpath
from transformerkit.backend import keras_ops as ops
from transformerkit.decoding.compiled import batch_bucket, bucket
from transformerkit.decoding.loop_ops import loop_ops
from transformerkit.decoding.texts import (  # noqa: F401 (named here too)
    check_count,
    check_max_new_tokens,
    check_number,
    length_caps,
)
from transformerkit.special_tokens import BOS_ID, EOS_ID, PAD_ID

NEG_INF = float("-inf")
SOURCE_BUCKET = 8  # source lengths are rounded up to a multiple of this on JAX/TensorFlow


def prepare_sources(model, source_ids):
    """Check ``(batch, source_len)`` ids and pad them to a shape bucket.

    Returns ``(source, active)``: int32 ids without the trailing columns that are padding in
    every row (a batch padded wider than its longest sentence: the encoder would run those
    positions and every step attend over them, all masked), whose rows and columns are
    rounded up on compiling backends (extra rows hold just EOS; extra columns are padding),
    and a bool ``(rows,)`` array that is False for the extra rows.
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
    source = source[:, : int(np.flatnonzero(np.any(source != PAD_ID, axis=0))[-1]) + 1]
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


def log_softmax_plus(logits, row_scores):
    """``log_softmax(logits) + row_scores[:, None]`` for ``(rows, vocab)`` logits and
    ``(rows,)`` scores: a fresh tensor (on eager PyTorch, a :mod:`transformerkit.fastpath`
    shortcut, the addition is made in place)."""
    if fastpath.applies(logits):
        import torch

        return torch.log_softmax(logits, -1).add_(row_scores.reshape(-1, 1))
    return ops.log_softmax(logits, axis=-1) + ops.reshape(row_scores, (-1, 1))


class TokenRules:
    """Which ids may be chosen: never PAD or BOS, and not EOS while ``min_new_tokens`` is
    not reached. Built once per decode; :meth:`apply` adds a 0 / -inf bias to the logits,
    :meth:`force_eos` leaves only the end token to rows at their length cap.

    Args:
        vocab: vocabulary size.
        eos_id: the end token, or None / -1 when there is none.
    """

    def __init__(self, vocab, eos_id):
        always = np.zeros((1, vocab), dtype="float32")
        always[0, [PAD_ID, BOS_ID]] = NEG_INF
        without_eos = always.copy()
        if eos_id is not None and eos_id >= 0:
            without_eos[0, eos_id] = NEG_INF
        only_eos = np.full((1, vocab), NEG_INF, dtype="float32")
        if eos_id is not None and eos_id >= 0:
            only_eos[0, eos_id] = 0.0
        xp = self.xp = loop_ops()
        self.always = xp.convert_to_tensor(always)
        self.without_eos = xp.convert_to_tensor(without_eos)
        self.only_eos = xp.convert_to_tensor(only_eos)
        self.columns = None  # the forbidden columns, for apply(..., owned=True) on PyTorch
        if fastpath.applies():
            import torch

            device = self.always.device  # the model's (CPU or GPU)
            self.columns = {flag: torch.as_tensor(np.flatnonzero(row[0] == NEG_INF),
                                                  device=device)
                            for flag, row in ((False, always), (True, without_eos))}

    @classmethod
    def shared(cls, vocab, eos_id):
        """``TokenRules(vocab, eos_id)``, made once per vocabulary, end token and device in
        the eager PyTorch loop (a one-sentence translation would otherwise build its rows
        every call; nothing writes to them), the :data:`SHARED_RULES_KEPT` last used kept.
        Elsewhere a new one: a JAX/TensorFlow loop builds its rules inside the function it
        traces."""
        if not fastpath.applies():
            return cls(vocab, eos_id)
        from transformerkit.decoding.loop_ops import tensor_device

        key = (vocab, eos_id, str(tensor_device()))
        rules = _SHARED_RULES.pop(key, None)
        if rules is None:
            rules = cls(vocab, eos_id)
            while len(_SHARED_RULES) >= SHARED_RULES_KEPT:  # the least recently used leaves
                del _SHARED_RULES[next(iter(_SHARED_RULES))]
        _SHARED_RULES[key] = rules  # last: the most recently used
        return rules

    def force_eos(self, scores, row_scores, rows):
        """``(rows, vocab)`` candidate ``scores`` where the rows of ``rows`` (a ``(rows,)``
        bool tensor) may only end: their end token scores ``row_scores`` (the prefix's
        log-probability plus 0, as ``transformers``' ``ForcedEOSTokenLogitsProcessor``
        sets it), every other id -inf."""
        xp = self.xp
        only_eos = xp.expand_dims(row_scores, 1) + self.only_eos
        return xp.where(xp.expand_dims(rows, 1), only_eos, scores)

    def apply(self, logits, forbid_eos, owned=False):
        """``(rows, vocab)`` logits with the forbidden ids at -inf. ``forbid_eos`` is a
        Python/NumPy bool (decided on the host: no work per row), a scalar tensor, or a
        ``(rows,)`` tensor. ``owned=True``: ``logits`` is a fresh tensor of the caller's,
        which PyTorch may overwrite: its forbidden columns are filled in place (no pass over
        the whole vocabulary; a :mod:`transformerkit.fastpath` shortcut)."""
        if owned and self.columns is not None and fastpath.applies(logits) \
                and len(getattr(forbid_eos, "shape", ())) == 0:
            return logits.index_fill_(1, self.columns[bool(forbid_eos)], NEG_INF)
        if isinstance(forbid_eos, (bool, np.bool_)):
            return logits + (self.without_eos if forbid_eos else self.always)
        forbid_eos = self.xp.convert_to_tensor(forbid_eos)  # a NumPy array in eager loops
        if len(forbid_eos.shape) == 1:
            forbid_eos = self.xp.expand_dims(forbid_eos, 1)
        return logits + self.xp.where(forbid_eos, self.without_eos, self.always)


_SHARED_RULES = {}  # TokenRules.shared: (vocab, eos_id, device) -> TokenRules
SHARED_RULES_KEPT = 8  # the vocabularies a process keeps rules for (servers of many models)


def ban_repeated_ngrams(xp, scores, tokens, index, n):
    """``(rows, vocab)`` ``scores`` of the token after position ``index`` with -inf at every
    id that would complete an ``n``-gram the row already holds: fairseq's
    ``--no-repeat-ngram-size``, ``transformers``' ``NoRepeatNGramLogitsProcessor`` and
    CTranslate2's ``no_repeat_ngram_size`` (token n-grams, the start token included).

    Args:
        xp: the loop's array functions (:func:`~.loop_ops.loop_ops`).
        scores: ``(rows, vocab)`` float32 logits or log-probabilities (not written to).
        tokens: ``(rows, width)`` int32, each row's tokens at positions ``0..index`` (BOS
            first); later positions are ignored.
        index: the last filled position: an int, or a scalar tensor in a compiled loop.
        n: the n-gram size; 0 changes nothing, 1 bans every id the row holds.

    The ids banned in row ``r`` are ``tokens[r, j + n - 1]`` for each ``j <= index - n + 1``
    where ``tokens[r, j:j + n - 1]`` equals the row's last ``n - 1`` tokens. Fixed shapes:
    every window of the buffer is compared (``n - 1`` comparisons of ``(rows, width - n +
    1)``), those not yet complete masked out.
    """
    rows, width = tokens.shape
    windows = width - n + 1
    if n <= 0 or windows < 1 or (isinstance(index, int) and index < n - 1):
        return scores
    start = xp.cast(index, "int32") - (n - 2)  # where the last n - 1 tokens begin
    last = xp.take(tokens, xp.maximum(xp.arange(n - 1, dtype="int32") + start, 0), axis=1)
    starts = xp.expand_dims(xp.arange(windows, dtype="int32"), 0)
    following = xp.slice(tokens, [0, n - 1], [rows, windows])  # the id after each window
    # the windows complete before ``index`` (1, windows), as (rows, windows): ids are >= 0
    match = xp.logical_and(xp.less(starts, start), xp.greater_equal(following, 0))
    for k in range(n - 1):
        window = xp.slice(tokens, [0, k], [rows, windows])
        match = xp.logical_and(match, xp.equal(window, xp.slice(last, [0, k], [rows, 1])))
    return ban_ids(scores, following, match)


def ban_ids(scores, ids, banned):
    """``scores`` ``(rows, vocab)`` with ``-inf`` at ``(r, ids[r, j])`` wherever
    ``banned[r, j]`` (``ids``, ``banned``: ``(rows, m)``; an id may repeat). A fresh tensor."""
    if fastpath.applies(scores):
        import torch

        cut = torch.where(banned, NEG_INF, float("inf"))
        return scores.scatter_reduce(1, ids.long(), cut.to(scores.dtype), "amin")
    rows, m = ids.shape
    row_of = ops.broadcast_to(ops.expand_dims(ops.arange(rows, dtype="int32"), 1), (rows, m))
    indices = ops.reshape(ops.stack([row_of, ops.cast(ids, "int32")], axis=-1), (-1, 2))
    hits = ops.scatter(indices, ops.reshape(ops.cast(banned, "float32"), (-1,)),
                       tuple(scores.shape))  # sums repeated ids
    return ops.where(ops.greater(hits, 0), NEG_INF, scores)


def length_penalty(length, alpha, form):
    """What a beam search divides a hypothesis' log-probability by, for ``length`` tokens
    (its end token included): ``form`` ``"gnmt"``, ``((5 + length) / 6) ** alpha`` (Wu et
    al. 2016, eq. 14, the Transformer paper's), or ``"power"``, ``length ** alpha``
    (``transformers``' and CTranslate2's ``length_penalty``, which a checkpoint's
    generation config names). ``length``: a number or a float32 tensor."""
    if form == "power":
        return length ** alpha
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


# Chunks of the vocabulary that :func:`argmax_ids` takes maxima of on eager PyTorch where
# NumPy cannot read the tensor (another device, bfloat16), and the fewest rows for which that
# beats one ``torch.max`` (below it the few extra calls cost more).
ARGMAX_CHUNK = 64
CHUNKED_ARGMAX_MIN_ROWS = 8


def argmax_ids(x):
    """``(rows,)`` int32: the column of each row's largest value in ``(rows, n)`` ``x``, the
    first one on ties (as ``ops.argmax``; a NaN counts as the largest). On eager PyTorch (a
    :mod:`transformerkit.fastpath` shortcut) greedy decoding takes one per step over the
    vocabulary, where ``torch.argmax`` and ``torch.max(x, -1)`` are slow on CPU: a CPU
    tensor NumPy can read is given to NumPy's arg-max (vectorised, the same first-on-ties
    and first-NaN rule; one thread, 64 rows of 8000: 297 against 497 us for the chunk
    maxima below and 662 for ``torch.max``, 6.6 against 13.7 us at one row,
    ``bench/argmax_ids.py``); other tensors with at least :data:`CHUNKED_ARGMAX_MIN_ROWS`
    rows go as :func:`chunked_top_k` for ``k = 1`` (each row's largest chunk maximum by
    ``amax``, then the first largest column inside that chunk, against the ``n % chunk``
    leftover columns), fewer rows to ``torch.max``."""
    if fastpath.applies(x):
        import torch

        rows, n = x.shape
        if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64, torch.float16):
            return torch.from_numpy(np.argmax(x.detach().numpy(), axis=-1).astype(np.int32))
        chunks = n // ARGMAX_CHUNK
        if rows < CHUNKED_ARGMAX_MIN_ROWS or chunks < 4:
            return torch.max(x, dim=-1).indices.int()
        return _chunked_argmax(x, chunks).int()
    return ops.cast(ops.argmax(x, axis=-1), "int32")


def best_allowed(logits, bias):
    """``(rows,)`` int32: each row's most likely id among those ``bias`` allows (``logits``
    ``(rows, vocab)``, any float dtype, taken in float32; ``bias`` ``(1, vocab)`` float32, 0
    where an id may be chosen and -inf where not: a row of :class:`TokenRules`). Greedy
    search's choice as the compiled step computes it inside its own graph (:mod:`.aot_step`,
    PyTorch): the forbidden columns set to -inf (even a NaN there), then the first largest
    column, a NaN counting as the largest: the ids of :meth:`TokenRules.apply` then
    :func:`argmax_ids`."""
    import torch

    return torch.argmax(torch.where(bias < 0, NEG_INF, logits.float()), dim=-1).int()


def _chunked_argmax(x, chunks):
    """:func:`argmax_ids` by chunk maxima (``torch``; ``chunks`` whole chunks of
    :data:`ARGMAX_CHUNK` columns, then the leftover columns). The first chunk holding the
    row's largest value (or its first NaN: ``amax`` and ``max`` propagate NaN) holds the
    first column of it; the leftover columns come after every chunk, so they win only with
    a strictly larger value (or a NaN where the chunks have none)."""
    import torch

    rows, n = x.shape
    width = chunks * ARGMAX_CHUNK
    body = x[:, :width].reshape(rows, chunks, ARGMAX_CHUNK)
    best = body.amax(2).max(1)  # each row's largest chunk maximum, its first chunk
    inside = body[torch.arange(rows, device=x.device), best.indices].max(1).indices
    ids = best.indices * ARGMAX_CHUNK + inside
    if n > width:
        tail = x[:, width:].max(1)
        later = (tail.values > best.values) | (tail.values.isnan() & ~best.values.isnan())
        ids = torch.where(later, tail.indices + width, ids)
    return ids


def chunked_top_k(x, k, chunk=64):
    """``ops.top_k(x, k)`` over the last axis of a wide ``(rows, n)`` tensor, exactly, by
    looking at few of its values: the maxima of chunks of ``chunk`` columns (one cheap
    vectorised pass), then the ``k`` chunks with the largest maxima (plus the ``n % chunk``
    leftover columns) in full. Every value above the k-th largest lies in a chunk whose
    maximum is above it, and fewer than ``k`` chunks have such a maximum, so the top ``k``
    values are among those columns. Beam search takes the best ``2 * beam`` of
    ``beam * vocab`` scores every step, where a full ``top_k`` is slow on CPU
    (docs/benchmarks.md, "Decoding").

    Returns ``(values (rows, k), indices (rows, k) int32)``, largest first (ties in any
    order, as ``ops.top_k``).
    """
    rows, n = x.shape
    chunks = n // chunk
    if chunks < 4 * k:  # too narrow to gain anything
        values, indices = ops.top_k(x, k)
        return values, ops.cast(indices, "int32")
    if fastpath.applies(x):  # the same steps with torch's kernels, without ops' wrappers
        import torch

        maxima = x[:, : chunks * chunk].reshape(rows, chunks, chunk).amax(2)
        best_chunks = maxima.topk(k, 1).indices  # (rows, k) int64
        columns = (best_chunks.unsqueeze(2) * chunk
                   + torch.arange(chunk, device=x.device)).reshape(rows, k * chunk)
        if n > chunks * chunk:
            tail = torch.arange(chunks * chunk, n, device=x.device).expand(rows, -1)
            columns = torch.cat([columns, tail], 1)
        values, picked = torch.gather(x, 1, columns).topk(k, 1)
        return values, torch.gather(columns, 1, picked).int()
    maxima = ops.max(ops.reshape(x[:, : chunks * chunk], (rows, chunks, chunk)), axis=2)
    _, best_chunks = ops.top_k(maxima, k)  # (rows, k)
    columns = ops.reshape(ops.expand_dims(ops.cast(best_chunks, "int32") * chunk, 2)
                          + ops.arange(chunk, dtype="int32"), (rows, k * chunk))
    if n > chunks * chunk:  # the leftover columns are always looked at
        tail = ops.broadcast_to(ops.arange(chunks * chunk, n, dtype="int32"),
                                (rows, n - chunks * chunk))
        columns = ops.concatenate([columns, tail], axis=1)
    values, picked = ops.top_k(ops.take_along_axis(x, columns, axis=1), k)
    return values, ops.take_along_axis(columns, ops.cast(picked, "int32"), axis=1)


def grouped_top_k(x, score, k, group, chunk=64):
    """:func:`chunked_top_k` of scores that are never written: the best ``k`` of
    ``score(x)`` over each ``group`` adjacent rows of ``x`` ``(n * group, vocab)`` taken as
    one row of ``group * vocab`` (a sentence's beams), for a ``score`` computed element by
    element. The scores' chunk maxima (chunks of ``chunk`` columns within each row) are
    reduced from ``score`` as it is computed, which a captured graph fuses into one pass
    over ``x``; then only the ``k`` best chunks of each group and every row's leftover
    columns are gathered from ``x`` and scored again (the same operations on the same
    numbers: the same values). Where ``chunked_top_k`` is given the scores written out,
    this saves writing ``(n * group, vocab)`` floats and reading them back: what a beam
    search's compiled step work spends most of its time on (:mod:`.aot_search`).

    ``score(values, rows, columns)``: the scores of ``values`` ``x[rows, columns]``, where
    ``rows`` and ``columns`` are int64 index tensors of ``values``' shape, or ``None`` for
    all of them in order (``values`` is ``x``). PyTorch only (the eager loop and its
    captured graphs).

    Returns ``(values (n, k), ids (n, k) int32)`` as :func:`chunked_top_k` of the scores
    reshaped to ``(n, group * vocab)``: ids ``beam_row * vocab + column``, largest first
    (ties in any order)."""
    import torch

    rows, vocab = x.shape
    n, chunks = rows // group, vocab // chunk
    maxima = score(x, None, None)[:, : chunks * chunk].reshape(rows, chunks, chunk).amax(2)
    best = maxima.reshape(n, group * chunks).topk(k, 1).indices  # (n, k), in the group's chunks
    first_row = torch.arange(n, device=x.device).unsqueeze(1) * group  # (n, 1)
    offsets = torch.arange(chunk, device=x.device)
    row = (first_row + best // chunks).unsqueeze(2).expand(n, k, chunk).reshape(n, k * chunk)
    column = ((best % chunks).unsqueeze(2) * chunk + offsets).reshape(n, k * chunk)
    if vocab > chunks * chunk:  # every row's leftover columns are always looked at
        tail = vocab - chunks * chunk
        tail_rows = (first_row + torch.arange(group, device=x.device)).unsqueeze(2)
        row = torch.cat([row, tail_rows.expand(n, group, tail).reshape(n, group * tail)], 1)
        tail_columns = torch.arange(chunks * chunk, vocab, device=x.device)
        column = torch.cat([column, tail_columns.repeat(group).expand(n, group * tail)], 1)
    values, picked = score(x[row, column], row, column).topk(k, 1)
    ids = (torch.gather(row, 1, picked) - first_row) * vocab + torch.gather(column, 1, picked)
    return values, ids.int()
