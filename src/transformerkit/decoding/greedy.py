"""Greedy decoding, and the token-by-token loop it shares with sampling.

Each step costs one new position (the key/value cache, :mod:`.steps`); the loop stops as
soon as every row has produced the end token or its token budget, and the whole loop is
one compiled function per shape bucket on JAX and TensorFlow (:mod:`.compiled`).

Live rows: in the eager PyTorch loop a sentence that has finished leaves the batch (its
rows are dropped from the key/value caches and the encoder memory), so each step runs on
the sentences still being decoded, as CTranslate2 does; finished rows leave together, once
they are :data:`DROP_SHARE` of the batch. The compiled JAX/TensorFlow loops
keep fixed shapes (``lax.while_loop`` / ``tf.while_loop`` need loop-invariant shapes; a
shrinking batch would mean one compiled function per batch size and a loop outside XLA),
so there a finished row keeps running and its output is padding. Both give the same
tokens. Sampling keeps every row too, so a seed draws the same random numbers either way.
"""

import numpy as np

from transformerkit import fastpath
from transformerkit.decoding.common import (
    TokenRules,
    argmax_ids,
    ban_repeated_ngrams,
    check_max_new_tokens,
    cut_at_eos,
    length_caps,
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
from transformerkit.decoding.steps import make_steps, token_at
from transformerkit.special_tokens import BOS_ID, EOS_ID, PAD_ID

DROP_SHARE = 1 / 8  # finished rows leave the batch once they are this share of its rows


def argmax_choice(logits, index):
    """Greedy choice: the most likely id of each row, ``(rows,)`` int32."""
    return argmax_ids(logits)


def step_and_choose(steps, rules, choose, buffer, index, state, static, forbid_eos,
                    no_repeat_ngram_size=0, keep_logits=False):
    """One step of a token search and its choice: ``(logits (rows, vocab) float32, ids
    (rows,), state)``. The logits come from ``steps.step``; ``rules`` (a
    :class:`~.common.TokenRules`, ``forbid_eos`` as its ``apply`` takes it) and the
    n-gram ban leave the ids ``choose`` may take. Where the step can choose greedily itself
    (a compiled step's ``step_choosing``: the arg-max inside the small-rows package's native
    call) and the rules are the same for every row with no n-gram ban, it does, given the
    rules' bias row: the same ids, without the eager calls. ``keep_logits``: the caller keeps
    the logits (they are not written to)."""
    xp = rules.xp
    fold = getattr(steps, "step_choosing", None)
    logits = None
    if fold is not None and choose is argmax_choice and not no_repeat_ngram_size:
        if isinstance(forbid_eos, bool):
            uniform, forbid = True, forbid_eos
        else:
            flags = np.asarray(to_numpy(forbid_eos))
            forbid = bool(flags.any())
            uniform = not forbid or bool(flags.all())
        if uniform:  # one rule for every row
            bias = rules.without_eos if forbid else rules.always
            logits, token, state = fold(buffer, index, state, static, bias)
            logits = xp.cast(logits, "float32")
            if token is not None:
                return logits, token, state
            # the step did not choose (a many-rows package): the loop does, on its logits
    if logits is None:
        logits, state = steps.step(buffer, index, state, static)
        logits = xp.cast(logits, "float32")
    allowed = rules.apply(logits, forbid_eos, owned=not keep_logits)
    token = choose(ban_repeated_ngrams(xp, allowed, buffer, index, no_repeat_ngram_size),
                   index)
    return logits, token, state


def token_search(steps, static, state, buffer, first_index, prompt_lengths, max_new, min_new,
                 choose, eos_id, active, collect_logits=False, drop_finished=False,
                 on_token=None, forced_eos=False, no_repeat_ngram_size=0):
    """Extend each row of ``buffer`` one token per step until EOS or ``max_new`` tokens.

    Args:
        steps, static, state: a step adapter from :mod:`.steps` and what its ``start`` gave.
        buffer: ``(rows, width)`` int32, the prompt (BOS for translation) then zeros.
        first_index: first position fed to the model (earlier ones are in the cache).
        prompt_lengths: ``(rows,)`` int32 (positions below it are copied, not chosen), or
            one Python int for every row (translation: 1, the BOS).
        max_new, min_new: at most / at least this many new tokens (EOS counts; it is
            forbidden until ``min_new`` tokens exist): int32 scalars, or ``max_new`` per row
            ``(rows,)`` (length caps relative to the source).
        choose: ``(logits (rows, vocab), index) -> (rows,)`` int32 ids.
        eos_id: end token, or -1 for none.
        active: ``(rows,)`` bool; inactive rows (bucket padding) count as finished.
        collect_logits: also return the raw logits of every step ``(rows, width - 1, vocab)``.
        drop_finished: in the eager loop, finished rows leave the batch (see the module
            docstring; ``choose`` must not depend on which rows are in it); ignored by the
            compiled loops.
        on_token: None, or (eager loop only, and not with ``drop_finished``) a function
            called after each step with that step's ids ``(rows,)`` (NumPy int32; PAD for
            finished rows, the prompt's id for rows still in their prompt); whatever it
            raises stops the search and propagates (streamed generation,
            :mod:`.streaming`).
        forced_eos: a row's last allowed token (its ``max_new``-th) is ``eos_id`` whatever
            was chosen (``transformers``' ``forced_eos_token_id``; a sampled row draws its
            random numbers all the same).
        no_repeat_ngram_size: no row gets an n-gram of this many tokens twice (0: off;
            :func:`~.common.ban_repeated_ngrams`, the prompt's tokens included).

    Returns ``(buffer, logits or None)``; after a row's EOS it holds padding.
    """
    if on_token is not None and (drop_finished or not is_eager_loop()):
        raise ValueError("on_token needs the eager loop (PyTorch) without drop_finished; "
                         "compiled loops cannot call Python between steps")
    if drop_finished and is_eager_loop():
        return _live_rows_search(steps, static, state, buffer, first_index, prompt_lengths,
                                 max_new, min_new, choose, eos_id, active, collect_logits,
                                 forced_eos, no_repeat_ngram_size)
    rows, width = buffer.shape
    rules = TokenRules.shared(steps.vocab_size, eos_id)
    per_row_prompts = not isinstance(prompt_lengths, int)
    xp = loop_ops()  # keras.ops; torch's kernels on eager PyTorch (no Keras import needed)

    def cond(s):
        return xp.logical_and(xp.less(s["index"] + 1, width),
                              xp.logical_not(xp.all(s["finished"])))

    def body(s):
        index, buf = s["index"], s["buffer"]
        position = index + 1
        made = position - prompt_lengths  # tokens generated before this one (per row)
        logits, token, new_state = step_and_choose(
            steps, rules, choose, buf, index, s["state"], static, made < min_new,
            no_repeat_ngram_size, collect_logits)
        if forced_eos:
            token = xp.where(xp.convert_to_tensor(made + 1 >= max_new), eos_id, token)
        if per_row_prompts:  # rows still inside their prompt copy it
            in_prompt = xp.convert_to_tensor(xp.less(position, prompt_lengths))
            token = xp.where(in_prompt, xp.squeeze(token_at(buf, position), 1), token)
        token = xp.where(s["finished"], PAD_ID, token)
        if on_token is not None:
            on_token(to_numpy(token))
        out = dict(index=index + 1, state=new_state, buffer=xp.slice_update(
            buf, [0, position], xp.expand_dims(xp.cast(token, "int32"), 1)))
        ends = xp.logical_or(xp.equal(token, eos_id), xp.convert_to_tensor(made + 1 >= max_new))
        if per_row_prompts:
            ends = xp.logical_and(xp.logical_not(in_prompt), ends)
        out["finished"] = xp.logical_or(s["finished"], ends)
        if collect_logits:
            out["logits"] = xp.slice_update(s["logits"], [0, index, 0],
                                            xp.expand_dims(logits, 1))
        return out

    init = dict(index=start_index(first_index), state=state,
                buffer=xp.convert_to_tensor(buffer, "int32"),
                finished=xp.logical_not(xp.convert_to_tensor(active, "bool")))
    if collect_logits:
        vocab = steps.vocab_size
        init["logits"] = xp.zeros((rows, width - 1, vocab), "float32")
    final = while_loop(cond, body, init)
    return final["buffer"], final.get("logits")


def _live_rows_search(steps, static, state, buffer, first_index, prompt_lengths, max_new,
                      min_new, choose, eos_id, active, collect_logits, forced_eos,
                      no_repeat_ngram_size=0):
    """:func:`token_search` in the eager loop where finished rows leave the batch: the same
    steps on the live rows only (which rows are live is known on the host every step, as
    the fixed-shape loop's stop test knows it). Returns NumPy ``(buffer, logits or None)``.

    A finished row's output is taken at once, and the row leaves the batch once the
    finished rows still in it make up :data:`DROP_SHARE` of it: dropping gathers the
    caches' rows (or their table) and the encoder memory of the rows kept, which costs more
    than running a few finished rows a few steps more (their tokens are not used)."""
    xp = loop_ops()  # keras.ops; torch's kernels on eager PyTorch
    rows, width = buffer.shape
    rules = TokenRules.shared(steps.vocab_size, eos_id)
    per_row_prompts = not isinstance(prompt_lengths, int)
    prompts = np.broadcast_to(np.asarray(to_numpy(prompt_lengths)), (rows,))
    limits = np.broadcast_to(np.asarray(to_numpy(max_new)), (rows,))
    min_new = int(to_numpy(min_new))
    out = np.zeros((rows, width), "int32")
    logits_out = np.zeros((rows, width - 1, steps.vocab_size), "float32") \
        if collect_logits else None
    buf = xp.convert_to_tensor(buffer, "int32")
    out[:] = to_numpy(buf)
    in_place = fastpath.applies(buf)  # PyTorch: the token written into the loop's own copy
    if in_place:
        buf = buf.clone()
    live = np.arange(rows)  # the batch's rows (finished ones among them until dropped)
    done = np.zeros(rows, bool)  # which of them have finished (their output taken)
    index = first_index
    # the rows' prompt lengths, and the position of the last token each one's cap allows
    # (a row's ``made + 1 >= cap`` is ``position >= prompt + cap - 1``); before the first of
    # those positions no row is capped (no array test a step)
    live_prompts, last_positions = prompts, prompts + limits - 1
    first_cap = int(last_positions.min())

    def keep_only(keep):
        nonlocal buf, state, static, live, done, live_prompts, last_positions, first_cap
        kept = xp.convert_to_tensor(keep, "int32")
        buf = xp.take(buf, kept, axis=0)
        state = steps.reorder(state, kept, index)  # positions 0..index-1 are filled
        static = steps.select_sources(static, kept)
        live, done = live[keep], done[keep]
        live_prompts, last_positions = prompts[live], prompts[live] + limits[live] - 1
        first_cap = int(last_positions.min())

    active = np.asarray(to_numpy(active), bool)
    if not active.all():
        keep_only(np.flatnonzero(active))
    while index + 1 < width and live.size:
        position = index + 1
        if per_row_prompts:
            forbid = position - live_prompts < min_new  # (rows,): their tokens made so far
            in_prompt = position < live_prompts
        else:  # one prompt length: Python bools
            forbid = position - prompt_lengths < min_new
            in_prompt = position < prompt_lengths
        logits, token, state = step_and_choose(steps, rules, choose, buf, index, state, static,
                                               forbid, no_repeat_ngram_size, collect_logits)
        # the rows at the last token their cap allows (None: none yet)
        capped = position >= last_positions if position >= first_cap else None
        if forced_eos and capped is not None and capped.any():
            token = xp.where(xp.convert_to_tensor(capped), eos_id, token)
        if per_row_prompts and in_prompt.any():  # rows still inside their prompt copy it
            token = xp.where(xp.convert_to_tensor(in_prompt),
                              xp.squeeze(token_at(buf, position), 1), token)
        token = xp.cast(token, "int32")
        if in_place:
            buf[:, position] = token
        else:
            buf = xp.slice_update(buf, [0, position], xp.expand_dims(token, 1))
        if collect_logits:
            running = ~done
            logits_out[live[running], index] = to_numpy(logits)[running]
        ends = to_numpy(token) == eos_id
        if capped is not None:
            ends |= capped
        if per_row_prompts:
            ends &= ~in_prompt
        elif in_prompt:
            ends[:] = False
        ends &= ~done
        index = position
        if ends.any():
            out[live[ends]] = to_numpy(buf)[ends]
            done |= ends
            if done.all():  # the batch is done: nothing to keep
                live, done = live[:0], done[:0]
            elif done.sum() >= DROP_SHARE * live.size:
                keep_only(np.flatnonzero(~done))
    running = live[~done]
    if running.size:
        out[running] = to_numpy(buf)[~done]
    return out, logits_out


def translate_ids(model, source_ids, max_new_tokens, choose, key, extra_args=(),
                  make_choose=None, bos_id=BOS_ID, eos_id=EOS_ID, min_new_tokens=0,
                  use_cache=True, return_logits=False, max_len_a=None, max_len_b=None,
                  drop_finished=True, forced_eos=False, precision="float32",
                  no_repeat_ngram_size=0):
    """Run :func:`token_search` for a ``Transformer``; used by greedy and sampling.
    ``drop_finished`` applies to the greedy choice only (``make_choose`` None)."""
    max_new = check_max_new_tokens(max_new_tokens, model.max_length)
    source, active = prepare_sources(model, source_ids)
    batch = np.asarray(source_ids).shape[0]
    caps = length_caps(source, max_new, max_len_a, max_len_b)
    if is_eager_loop() and not return_logits:  # no buffer or cache longer than needed
        max_new = int(caps.max())
    steps = make_steps(model, use_cache, precision)
    drop = bool(drop_finished) and make_choose is None

    def decode(source, active, caps, min_new, *extra):
        state, static = steps.start(source, max_new)
        rows = source.shape[0]
        xp = loop_ops()
        buffer = xp.concatenate([xp.full((rows, 1), bos_id, "int32"),
                                 xp.zeros((rows, max_new), "int32")], axis=1)
        chooser = make_choose(*extra) if make_choose is not None else choose
        return token_search(steps, static, state, buffer, 0, 1, caps, min_new, chooser,
                            eos_id, active, return_logits, drop, forced_eos=forced_eos,
                            no_repeat_ngram_size=no_repeat_ngram_size)

    full_key = (key, max_new, bos_id, eos_id, use_cache, return_logits, forced_eos,
                no_repeat_ngram_size, getattr(steps, "precision", "float32"))
    buffer, logits = run_decoder(model, full_key, decode, source, active, caps,
                                 np.int32(min(min_new_tokens, max_new + 1)), *extra_args)
    ids = [cut_at_eos(row[1:], eos_id) for row in buffer[:batch]]
    if return_logits:
        return ids, logits[:batch]
    return ids


def greedy_translate(model, source_ids, options=None, *, bos_id=BOS_ID, eos_id=EOS_ID,
                     use_cache=True, return_logits=False, drop_finished=True,
                     precision="float32", **search):
    """Translate a batch greedily with a ``Transformer``.

    Args:
        model: a ``transformerkit.models.Transformer``.
        source_ids: ``(batch, source_len)`` int ids, 0 = padding (sentences of different
            lengths padded at the end).
        options: a :class:`~transformerkit.decoding.options.SearchOptions` (None: its
            defaults), ``search`` any of its fields in its place. Used here:
            ``max_new_tokens`` (at most this many tokens per sentence, EOS included; default
            and upper limit: the model's ``max_length``, more is cut with a warning) and
            ``max_len_a``, ``max_len_b`` (cap each output at ``floor(max_len_a * source_len +
            max_len_b)`` tokens, EOS included, ``source_len`` counting the source's real
            tokens and its EOS, as fairseq; both None: only ``max_new_tokens``),
            ``min_new_tokens`` (EOS is not chosen before this many tokens),
            ``forced_eos`` (the last token a cap allows is EOS) and
            ``no_repeat_ngram_size`` (no n-gram of that many tokens twice in an output).
        bos_id, eos_id: start and end ids of the target vocabulary (1 and 2).
        use_cache: True (the key/value cache, fastest path for the backend),
            ``"compiled"`` (that step compiled ahead of time, PyTorch:
            :mod:`transformerkit.decoding.aot_step`), ``"keras"`` (the model's own Keras
            cache API) or False (recompute the whole prefix every step, the reference the
            cached paths are tested against; same output).
        return_logits: also return the raw logits ``(batch, max_new_tokens, vocab)`` of
            every step (steps after a sentence ended, or after the loop stopped, are 0 where
            finished rows leave the batch; with fixed shapes a finished row's later logits
            are those of the step it kept running).
        drop_finished: in the eager (PyTorch) loop, finished sentences leave the batch (their
            cache rows and encoder memory are dropped; the same tokens, fewer rows per step);
            False keeps every row to the end, as the compiled JAX/TensorFlow loops do.
        precision: the products' precision, ``float32`` (default), ``bfloat16``, ``int8`` or
            ``auto`` (:mod:`transformerkit.kernels.lowprec`; other than float32 on the
            PyTorch backend's cached step only), passed to the step's weights.

    Returns:
        ``batch`` lists of ids, without BOS, cut before EOS; with ``return_logits``, the
        pair ``(ids, logits)``. PAD and BOS are never produced.

    Example:
    >>> greedy_translate(model, np.array([[45, 7, 2], [9, 2, 0]]), max_new_tokens=20)
    [[12, 88, 5], [31, 4]]
    """
    options = resolve(SearchOptions, options, search, "greedy_translate")
    return translate_ids(model, source_ids, options.max_new_tokens, argmax_choice, "greedy",
                         bos_id=bos_id, eos_id=eos_id, min_new_tokens=options.min_new_tokens,
                         use_cache=use_cache, return_logits=return_logits,
                         max_len_a=options.max_len_a, max_len_b=options.max_len_b,
                         drop_finished=drop_finished, forced_eos=options.forced_eos,
                         precision=precision,
                         no_repeat_ngram_size=options.no_repeat_ngram_size)
