"""Decoders: the key/value cache against full recomputation, greedy, beam search, sampling,
end tokens in a batch, bad input; and the same checks on JAX, TensorFlow and PyTorch.

Kinds of claims: logits and scores of two float32 computations (cached steps and full
passes) agree within their rounding bound (``tests/support/tolerances.py``); ids of two searches
whose kernels or shapes differ are equal except at a near-tie (the helpers of
``tests/support/near_ties.py``); ids and scores of runs through the same kernels are exact.

Run as a script (``python tests/decoding/test_decoding.py OUT.json``) this file is the per-backend
probe of :func:`test_all_backends`: it builds small models and writes its checks as JSON.
"""

import json
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tolerances as tol
from backends import BACKENDS, FAST_XLA_COMPILE
from keras import ops
from near_ties import (
    assert_same_hypotheses_or_near_tie,
    assert_same_ids_or_near_tie,
    next_logits_after,
    score_bound,
)
from paths import SUPPORT_DIR

from transformerkit import fastpath
from transformerkit.data.tokenizers import CharTokenizer
from transformerkit.decoding import (
    beam_translate,
    generate_ids,
    greedy_translate,
    sample_translate,
    sequence_log_probs,
    translate_texts,
)
from transformerkit.decoding.common import (
    TokenRules,
    argmax_ids,
    chunked_top_k,
    grouped_top_k,
    length_penalty,
    log_softmax_plus,
)
from transformerkit.decoding.sampling import filter_logits, sampling_choice
from transformerkit.models import GPT, Transformer

BOS, EOS = 1, 2
SOURCES = np.array([[5, 9, 14, 7, 21, 8, EOS], [11, 6, 19, EOS, 0, 0, 0], [23, EOS, 0, 0, 0, 0, 0]],
                   dtype="int32")
MODEL_OPTIONS = {
    "paper": dict(norm_position="post", activation="relu", positional="sinusoidal",
                  tie_embeddings="none"),
    "pre_gelu_t2t_tied": dict(norm_position="pre", activation="gelu", positional="t2t",
                              tie_embeddings="all"),
    "learned_widths_tied_decoder": dict(positional="learned", tie_embeddings="decoder",
                                        key_dim=5, value_dim=3, num_decoder_layers=1),
}


def randomize(model, seed=0, scale=0.2):
    """Perturb every weight (biases and LayerNorm parameters too) so no zero hides a bug."""
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        value = ops.convert_to_numpy(variable)
        variable.assign((value + rng.normal(0.0, scale, value.shape)).astype(value.dtype))
    return model


def make_transformer(options="paper", seed=0, max_length=12):
    opts = MODEL_OPTIONS[options]
    vocab = 30
    model = Transformer(vocab, vocab if opts["tie_embeddings"] == "all" else 27, num_layers=2,
                        d_model=16, num_heads=2, d_ff=24, dropout=0.1, max_length=max_length,
                        **opts)
    model((SOURCES, SOURCES[:, :3]))
    return randomize(model, seed)


def make_gpt(seed=0):
    model = GPT(vocab_size=17, num_layers=2, d_model=16, num_heads=4, d_ff=32, max_length=16)
    model(np.ones((1, 3), "int32"))
    return randomize(model, seed)


def full_logits(model, source, outputs, steps):
    """Logits of one forward pass over ``[BOS] + outputs`` (padded to ``steps`` inputs)."""
    decoder_input = np.zeros((len(outputs), steps), "int32")
    decoder_input[:, 0] = BOS
    for row, ids in enumerate(outputs):
        decoder_input[row, 1:1 + len(ids[: steps - 1])] = ids[: steps - 1]
    return ops.convert_to_numpy(model((source, decoder_input), training=False))


def cache_excess(model, use_cache, max_new=10):
    """Largest |cached step logits - full forward logits| over the steps each row ran, as a
    fraction of its bound (two float32 paths through the model: at most 1)."""
    outputs, logits = greedy_translate(model, SOURCES, max_new_tokens=max_new,
                                       use_cache=use_cache, return_logits=True)
    full = full_logits(model, SOURCES, outputs, max_new)
    worst = 0.0
    for row, ids in enumerate(outputs):
        steps = min(len(ids) + 1, max_new)  # the step that produced EOS is checked too
        atol = tol.chain_atol(tol.model_roundings(model, SOURCES.shape[1], steps),
                              full[row, :steps], paths=2)
        worst = max(worst, float(np.abs(full[row, :steps] - logits[row, :steps]).max()) / atol)
    return worst


def holds(check, *args):
    """True if ``check(*args)`` passes (returns without an ``AssertionError``, and not False),
    else its message (the probe's results are JSON)."""
    try:
        result = check(*args)
    except AssertionError as error:
        return str(error)[:500]
    return True if result is not False else f"{check.__name__} returned False"


# -- the cache --------------------------------------------------------------------------------

@pytest.mark.parametrize("options", MODEL_OPTIONS)
@pytest.mark.parametrize("use_cache", [True, "keras"])
def test_cached_logits_equal_full_recomputation_at_every_step(options, use_cache):
    """Two float32 paths (one position per step against the whole prefix): within the
    model's bound, twice."""
    model = make_transformer(options)
    assert cache_excess(model, use_cache) <= 1.0


def test_tolerances_still_catch_a_cache_that_stores_the_wrong_position(monkeypatch):
    """Planted bug: the one-position step (fast paths on) also writes its key and value over
    the previous position of the cache, so later steps attend to a wrong history."""
    from transformerkit.layers import MultiHeadAttention

    if keras.backend.backend() != "torch":
        pytest.skip("the one-position step is the PyTorch-eager shortcut")
    step = MultiHeadAttention.step

    def overwriting(self, x, weights, cache, index, cache_rows=None):
        out = step(self, x, weights, cache, index, cache_rows)
        if index > 0:
            for t in cache:
                t[index - 1] = t[index]
        return out

    monkeypatch.setattr(fastpath, "ENABLED", True)
    monkeypatch.setattr(MultiHeadAttention, "step", overwriting)
    tol.assert_caught(test_cached_logits_equal_full_recomputation_at_every_step, "paper", True)


def test_recomputation_and_cache_give_the_same_translations():
    """Other kernels and shapes (cached steps, the Keras cache, the whole prefix): the same
    ids except at a near-tie."""
    model = make_transformer()
    cached = greedy_translate(model, SOURCES, max_new_tokens=10)
    next_logits = next_logits_after(model, SOURCES)
    for mode in (False, "keras"):
        assert_same_ids_or_near_tie(
            greedy_translate(model, SOURCES, max_new_tokens=10, use_cache=mode), cached,
            next_logits, f"use_cache={mode}")


def test_gpt_cache_equals_recomputation_for_prompts_of_different_lengths():
    """Cached, Keras-cached and recomputed generation, a batch and each prompt alone: other
    kernels or shapes, so the same ids except at a near-tie; and each generated id is the
    arg-max of a full forward pass, up to a near-tie."""
    model = make_gpt()
    prompts = [[5, 6, 7, 8], [9, 10], [3, 4, 11]]
    next_logits = next_logits_after(model, prompts=prompts)
    cached = generate_ids(model, prompts, max_new_tokens=6, temperature=0)
    for mode in (False, "keras"):
        assert_same_ids_or_near_tie(
            generate_ids(model, prompts, max_new_tokens=6, temperature=0, use_cache=mode),
            cached, next_logits, f"use_cache={mode}")
    # a batch gives what each prompt gives alone
    assert_same_ids_or_near_tie(
        [generate_ids(model, p, max_new_tokens=6, temperature=0) for p in prompts], cached,
        next_logits, "alone")
    # and greedy generation is the arg-max of a full forward pass at every position
    for t, token in enumerate(cached[0]):
        logits, atol = next_logits(0, cached[0][:t])  # PAD and BOS are never generated
        assert logits.max() - logits[token] <= atol, (t, token, logits.argmax())


# -- greedy and end tokens --------------------------------------------------------------------

def test_batch_with_different_lengths_equals_one_sentence_at_a_time():
    """Other shapes (padding, batch rows): the same ids except at a near-tie."""
    model = make_transformer("pre_gelu_t2t_tied")
    batch = greedy_translate(model, SOURCES, max_new_tokens=10)
    alone = []
    for row in range(len(SOURCES)):
        length = int((SOURCES[row] != 0).sum())
        alone += greedy_translate(model, SOURCES[row:row + 1, :length], max_new_tokens=10)
    assert_same_ids_or_near_tie(alone, batch, next_logits_after(model, SOURCES))


def _eos_model(bias):
    model = make_transformer("paper")
    projection = model.output_projection
    value = ops.convert_to_numpy(projection.bias)
    value[EOS] = bias
    projection.bias.assign(value)
    return model


def test_end_token_stops_each_sentence_and_the_loop():
    model = _eos_model(100.0)  # EOS is always the most likely next token
    ids, logits = greedy_translate(model, SOURCES, max_new_tokens=10, return_logits=True)
    assert ids == [[], [], []]
    assert np.abs(logits[:, 1:]).max() == 0.0  # the loop stopped after one step
    forced = greedy_translate(model, SOURCES, max_new_tokens=10, min_new_tokens=4)
    assert [len(x) for x in forced] == [4, 4, 4]  # EOS forbidden before 4 tokens, then taken
    hyps = beam_translate(model, SOURCES, max_new_tokens=10, beam_size=3, min_new_tokens=4)
    assert all(h[0].finished and len(h[0].ids) == 4 for h in hyps)


def test_outputs_never_hold_pad_or_bos_and_respect_max_new_tokens():
    model = make_transformer()
    for ids in greedy_translate(model, SOURCES, max_new_tokens=5):
        assert len(ids) <= 5 and 0 not in ids and BOS not in ids and EOS not in ids
    for found in beam_translate(model, SOURCES, max_new_tokens=5, beam_size=3, n_best=3):
        assert all(len(h.ids) <= 5 and not {0, BOS, EOS} & set(h.ids) for h in found)


# -- beam search ------------------------------------------------------------------------------

@pytest.mark.parametrize("options", MODEL_OPTIONS)
def test_beam_size_one_equals_greedy(options):
    """Beam 1 picks the top of log-softmax + score (its own rounding), greedy the arg-max of
    the logits: the same ids except at a near-tie."""
    model = make_transformer(options)
    greedy = greedy_translate(model, SOURCES, max_new_tokens=10)
    beam = beam_translate(model, SOURCES, max_new_tokens=10, beam_size=1, alpha=0.0)
    assert_same_ids_or_near_tie([h[0].ids for h in beam], greedy,
                                next_logits_after(model, SOURCES))


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_results_are_sorted_and_scored_by_the_model(alpha):
    """Sorted exactly; each score is its float32 log-probability over a float32 penalty (its
    power and two divisions: a few roundings); each log-probability is the model's own, a
    full forward pass (two paths, summed over the hypothesis' tokens)."""
    model = make_transformer("pre_gelu_t2t_tied", seed=3)
    hyps = beam_translate(model, SOURCES, max_new_tokens=10, beam_size=4, n_best=4, alpha=alpha)
    for found in hyps:
        assert len(found) == 4
        scores = [h.score for h in found]
        assert scores == sorted(scores, reverse=True)
        for h in found:
            length = len(h.ids) + h.finished  # EOS counts when the hypothesis ended
            tol.assert_within(h.score, h.log_prob / length_penalty(length, alpha, "gnmt"),
                              tol.chain_atol(tol.ELEMENTWISE_ULPS + 3, h.score))
    # the reported log-probabilities are the model's own (one full forward pass)
    atol = score_bound(model, SOURCES, hyps)
    for k in range(4):
        finished = [found[k].finished for found in hyps]
        model_logp = sequence_log_probs(model, SOURCES, [found[k].ids for found in hyps])
        for row, found in enumerate(hyps):
            if finished[row]:
                tol.assert_within(found[k].log_prob, model_logp[row],
                                  atol(len(found[k].ids) + 1), f"row {row}, rank {k}")


@pytest.mark.parametrize("options", MODEL_OPTIONS)
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_best_beam_never_scores_below_greedy(options, alpha):
    """Up to two paths' bound of a score (beam's cached steps, greedy's full pass)."""
    model = make_transformer(options, seed=1)
    greedy = greedy_translate(model, SOURCES, max_new_tokens=10)
    greedy_logp = sequence_log_probs(model, SOURCES, greedy)
    best = beam_translate(model, SOURCES, max_new_tokens=10, beam_size=4, alpha=alpha)
    atol = score_bound(model, SOURCES, [[ids] for ids in greedy] + best)
    for row, ids in enumerate(greedy):
        if len(ids) == 10:  # greedy hit the limit without EOS: not a finished hypothesis
            continue
        greedy_score = greedy_logp[row] / length_penalty(len(ids) + 1, alpha, "gnmt")
        length = max(len(ids), len(best[row][0].ids)) + 1
        assert best[row][0].score >= greedy_score - atol(length), (row, greedy_score, best[row])


@pytest.mark.parametrize("options", MODEL_OPTIONS)
def test_beam_search_is_the_same_on_every_cache_path(options):
    """The backend's fast cache (on PyTorch: EagerSteps, whose ``reorder`` moves the caches
    with their beams), the Keras cache and recomputation find the same beams: other kernels,
    so scores within two paths' bound and the same hypotheses except at a near-tie."""
    model = make_transformer(options)
    found = [beam_translate(model, SOURCES, max_new_tokens=10, beam_size=4, n_best=4,
                            use_cache=mode) for mode in (True, "keras", False)]
    atol = score_bound(model, SOURCES, sum(found, []))
    for mode, other in zip(("keras", False), found[1:], strict=True):
        for row, (a, b) in enumerate(zip(found[0], other, strict=True)):
            assert_same_hypotheses_or_near_tie(a, b, atol, f"use_cache={mode}, row {row}")


@pytest.mark.parametrize("shortcuts", [True, False])
def test_chunked_top_k_equals_top_k(monkeypatch, shortcuts):
    monkeypatch.setattr(fastpath, "ENABLED", shortcuts and fastpath.ENABLED)
    rng = np.random.default_rng(0)
    for rows, n, k, chunk in [(3, 1000, 8, 16), (2, 640, 4, 32), (5, 50, 3, 8), (1, 300, 8, 4)]:
        x = rng.normal(size=(rows, n)).astype("float32")
        x[0, : n // 2] = -np.inf  # dead beams: whole regions at -inf
        x[-1, 7::9] = 5.0  # ties across chunks, and in the leftover columns
        values, indices = chunked_top_k(ops.convert_to_tensor(x), k, chunk=chunk)
        values, indices = ops.convert_to_numpy(values), ops.convert_to_numpy(indices)
        expected = -np.sort(-x, axis=1)[:, :k]
        np.testing.assert_array_equal(values, expected)
        np.testing.assert_array_equal(np.take_along_axis(x, indices, 1), values)
        assert (np.sort(indices, 1)[:, 1:] != np.sort(indices, 1)[:, :-1]).all()  # distinct



@pytest.mark.skipif(keras.backend.backend() != "torch", reason="a PyTorch function")
def test_grouped_top_k_equals_the_top_k_of_the_written_scores():
    """The compiled beam search's selection (scores computed inside the chunk maxima, never
    written) picks what ``chunked_top_k`` of the written scores picks: the same values,
    ids whose scores are those values, distinct; widths with and without leftover columns,
    dead beams (a row's offset -inf), ruled-out columns, ties across rows and chunks."""
    import torch

    rng = np.random.default_rng(3)
    for n, group, vocab, k, chunk in [(3, 4, 1000, 8, 16), (2, 2, 643, 4, 32),
                                      (1, 3, 90, 6, 4), (4, 1, 300, 2, 8)]:
        x = torch.as_tensor(rng.normal(size=(n * group, vocab)).astype("float32"))
        x[-1, 5::7] = 4.0  # ties within the row, across its chunks and its leftover columns
        offset = torch.as_tensor(rng.normal(size=(n * group, 1)).astype("float32"))
        offset[1] = -np.inf  # a dead beam
        ruled = torch.zeros(1, vocab)
        ruled[0, [0, 1, vocab - 1]] = -np.inf
        if n > 1 and group > 1:
            x[group : 2 * group] = x[group]  # a sentence whose beams tie row for row
            offset[group : 2 * group] = offset[group]

        def score(values, rows, columns, offset=offset, ruled=ruled):
            of_row = offset if rows is None else offset[rows, 0]
            of_column = ruled if columns is None else ruled[0, columns]
            return (values - 0.5) * 2.0 + of_row + of_column

        written = score(x, None, None)
        want_values, _ = chunked_top_k(written.reshape(n, group * vocab), k, chunk=chunk)
        values, ids = grouped_top_k(x, score, k, group, chunk=chunk)
        assert ids.dtype == torch.int32 and values.shape == ids.shape == (n, k)
        np.testing.assert_array_equal(values.numpy(), want_values.numpy())
        np.testing.assert_array_equal(
            torch.gather(written.reshape(n, group * vocab), 1, ids.long()).numpy(),
            values.numpy())
        assert (ids.sort(1).values[:, 1:] != ids.sort(1).values[:, :-1]).all()

def argmax_ids_equal_numpy():
    """``argmax_ids`` (on eager PyTorch: NumPy's for a float32 CPU tensor; for a bfloat16
    one ``torch.max`` for few rows, chunk maxima for many) = NumPy's argmax: the first column
    on ties (within a chunk, across chunks, in the leftover columns), rows with -inf regions,
    a row that is all -inf, one column; widths with and without leftover columns; on PyTorch
    also NaN (the first one wins; other backends' argmax leaves NaN unspecified)."""
    rng = np.random.default_rng(1)
    cases = []
    for n in (1000, 1024, 300):
        x = rng.normal(size=(12, n)).astype("float32")
        x[1, 3::50] = 9.0  # ties across chunks: the first one wins
        x[2, :] = 4.0
        x[3, : n // 2] = -np.inf
        x[4, :] = -np.inf
        x[5, [70, 71, n - 1]] = 7.0  # ties inside a chunk and in the last column
        x[6, [n - 2, n - 1]] = 8.0  # the largest value only in the last columns
        if keras.backend.backend() == "torch":
            x[7, [40, n - 1]] = np.nan  # the first NaN
            x[8, n - 1] = np.nan  # a NaN in the leftover columns only (when there are any)
        cases += [x, x[:, :1], x[1:6], x[5:9]]  # 12 rows: chunk maxima; 4-5 rows: torch.max
    same = all(np.array_equal(ops.convert_to_numpy(argmax_ids(ops.convert_to_tensor(c))),
                              np.argmax(c, axis=1).astype("int32")) for c in cases)
    if keras.backend.backend() != "torch" or not fastpath.applies():
        return same
    # a tensor NumPy cannot read (bfloat16): chunk maxima from 8 rows, torch.max below
    import torch

    rounded = [torch.from_numpy(c).bfloat16() for c in cases]
    return same and all(np.array_equal(argmax_ids(c).numpy(),
                                       np.argmax(c.float().numpy(), axis=1).astype("int32"))
                        for c in rounded)


def test_token_rules_in_place_equal_the_added_bias_and_log_softmax_plus_numpy():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 40)).astype("float32")
    rules = TokenRules(40, eos_id=2)
    for forbid in (True, False, np.bool_(True), ops.convert_to_tensor(False)):
        expected = ops.convert_to_numpy(rules.apply(ops.convert_to_tensor(x), forbid))
        owned = ops.convert_to_numpy(rules.apply(ops.convert_to_tensor(x.copy()), forbid,
                                                 owned=True))
        np.testing.assert_array_equal(owned, expected)
        assert np.isneginf(owned[:, :2]).all() and np.isneginf(owned[:, 2]).all() == bool(forbid)
    row_scores = rng.normal(size=(5,)).astype("float32")
    x64 = x.astype("float64")
    reference = x64 - x64.max(1, keepdims=True)
    reference = reference - np.log(np.exp(reference).sum(1, keepdims=True)) + row_scores[:, None]
    got = log_softmax_plus(ops.convert_to_tensor(x), ops.convert_to_tensor(row_scores))
    # a log-softmax over 40 (its sum, exp, log and shift), then the addition
    tol.assert_within(ops.convert_to_numpy(got), reference,
                      tol.chain_atol(40 + tol.SOFTMAX_EXTRA + 1, reference))


def test_shared_token_rules_are_made_once_per_vocabulary_and_kept_for_a_few(monkeypatch):
    """``TokenRules.shared``: with the PyTorch shortcuts, one object per vocabulary and end
    token (the rows of ``TokenRules(vocab, eos_id)``), the least recently used dropped past
    ``SHARED_RULES_KEPT``; elsewhere a new one each call (a traced loop builds its own)."""
    from transformerkit.decoding import common

    monkeypatch.setattr(common, "_SHARED_RULES", {})
    monkeypatch.setattr(common, "SHARED_RULES_KEPT", 3)
    first = TokenRules.shared(40, 2)
    np.testing.assert_array_equal(ops.convert_to_numpy(first.without_eos),
                                  ops.convert_to_numpy(TokenRules(40, 2).without_eos))
    if not fastpath.applies():
        assert TokenRules.shared(40, 2) is not first
        return
    assert TokenRules.shared(40, 2) is first and TokenRules.shared(40, 3) is not first
    TokenRules.shared(41, 2)
    assert TokenRules.shared(40, 2) is first  # used again: the (40, 3) rules are the oldest
    TokenRules.shared(42, 2)  # a fourth vocabulary: (40, 3) leaves
    assert len(common._SHARED_RULES) == 3 and TokenRules.shared(40, 2) is first
    assert [key[:2] for key in common._SHARED_RULES] == [(41, 2), (42, 2), (40, 2)]


def test_argmax_ids_equals_numpy():
    assert argmax_ids_equal_numpy()


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="the compiled step's choice is PyTorch's")
def test_best_allowed_is_the_eager_rules_then_argmax():
    """:func:`best_allowed` (greedy search's choice inside the compiled step, given the
    rules' bias row) gives the ids of the eager choice, :meth:`TokenRules.apply` then
    :func:`argmax_ids`, and of NumPy's argmax with the forbidden columns at -inf: with EOS
    allowed and forbidden, where the best id is a forbidden one, on ties (the first), -inf
    rows, NaN (the first NaN; one in a forbidden column does not count), in float32 and
    bfloat16 logits (taken in float32). Without the PyTorch shortcuts the eager rules add
    the bias, and a NaN in a forbidden column stays: that row is left out there."""
    import torch

    from transformerkit.decoding.common import best_allowed

    rng = np.random.default_rng(3)
    x = rng.normal(size=(9, 300)).astype("float32")
    x[0, [0, 1, 2]] = 50.0  # PAD, BOS and EOS the largest: never PAD/BOS, EOS if allowed
    x[1, [7, 90, 299]] = 9.0  # ties: the first allowed one
    x[2, 2:] = -np.inf  # only forbidden ids are finite: the first -inf column after them
    x[3, :] = -np.inf
    x[4, [40, 200]] = np.nan  # the first NaN
    x[5, [1, 60]] = np.nan  # NaN on a forbidden id (-inf added: still NaN) and an allowed one
    rules = TokenRules(300, eos_id=2)
    for forbid in (False, True):
        bias = rules.without_eos if forbid else rules.always
        for logits in (torch.as_tensor(x), torch.as_tensor(x).bfloat16()):
            got = best_allowed(logits, bias)
            assert got.dtype == torch.int32
            floats = logits.float()
            eager = argmax_ids(rules.apply(floats.clone(), forbid, owned=True)).numpy()
            # the shortcut's rules fill the forbidden columns; the plain keras.ops rules add
            # the bias, which leaves a NaN there (row 5) a NaN
            rows = slice(None) if fastpath.applies() else [0, 1, 2, 3, 4, 6, 7, 8]
            np.testing.assert_array_equal(got.numpy()[rows], eager[rows])
            numpy = np.argmax(np.where(np.isneginf(bias.numpy()), -np.inf, floats.numpy()),
                              axis=1)
            np.testing.assert_array_equal(got.numpy(), numpy)
        assert best_allowed(torch.as_tensor(x), bias)[0] == (3 + np.argmax(x[0, 3:]) if forbid
                                                             else 2)


def _plain_top_k(x, k):
    values, indices = ops.top_k(x, k)
    return values, ops.cast(indices, "int32")


def large_vocabulary_beams_equal():
    """Beam 4 over 600 words takes the chunked top-k path; a twin model (its own compiled
    decoder on JAX/TensorFlow) searching with plain ``top_k`` must find the same beams:
    exactly on eager PyTorch (the same kernels score, only the selection differs, and it
    picks the same numbers); the compiled twins are other programs (XLA may fuse the scores
    with each selection differently), so there within the bound, near-ties allowed."""
    from transformerkit.decoding import beam

    results, weights = [], None
    for top_k in (beam.chunked_top_k, _plain_top_k):
        model = Transformer(600, 600, num_layers=1, d_model=16, num_heads=2, d_ff=24,
                            max_length=12, tie_embeddings="all")
        model((SOURCES, SOURCES[:, :3]))
        if weights is None:
            weights = randomize(model, seed=5, scale=0.5).get_weights()
        model.set_weights(weights)
        chosen, beam.chunked_top_k = beam.chunked_top_k, top_k
        try:
            results.append(beam_translate(model, SOURCES, max_new_tokens=8, beam_size=4,
                                          n_best=4))
        finally:
            beam.chunked_top_k = chosen
    if keras.backend.backend() == "torch":
        for row, (a, b) in enumerate(zip(*results, strict=True)):
            assert [(h.ids, h.score, h.log_prob) for h in a] == \
                [(h.ids, h.score, h.log_prob) for h in b], f"row {row}"
        return True
    atol = score_bound(model, SOURCES, results[0] + results[1])
    for row, (a, b) in enumerate(zip(*results, strict=True)):
        assert_same_hypotheses_or_near_tie(a, b, atol, f"row {row}")
    return True


def test_beam_search_with_a_large_vocabulary_equals_plain_top_k():
    assert large_vocabulary_beams_equal()


def test_beam_arguments_are_checked():
    model = make_transformer()
    # n_best above beam_size widens the beam (SearchOptions.width), as translate always did
    widened = beam_translate(model, SOURCES, beam_size=2, n_best=3, max_new_tokens=6)
    assert all(len(found) == 3 for found in widened)
    assert [[h.ids for h in found] for found in widened] == [
        [h.ids for h in found] for found in beam_translate(model, SOURCES, beam_size=3,
                                                           n_best=3, max_new_tokens=6)]
    with pytest.raises(ValueError, match="n_best"):
        beam_translate(model, SOURCES, n_best=0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_translate(model, SOURCES, beam_size=0)
    with pytest.raises(ValueError, match="alpha"):
        beam_translate(model, SOURCES, alpha=-1.0)


# -- sampling ---------------------------------------------------------------------------------

def test_top_k_one_and_tiny_top_p_equal_greedy():
    """Sampling keeps every row, greedy drops finished ones (other shapes): the same ids
    except at a near-tie. Exact where the same kernels run: temperature 0 is the greedy
    path itself, and GPT generation keeps every row either way (top-k 1 keeps one finite
    logit: the arg-max)."""
    model = make_transformer()
    greedy = greedy_translate(model, SOURCES, max_new_tokens=10)
    next_logits = next_logits_after(model, SOURCES)
    assert_same_ids_or_near_tie(
        sample_translate(model, SOURCES, max_new_tokens=10, top_k=1, seed=5), greedy,
        next_logits, "top_k=1")
    assert_same_ids_or_near_tie(
        sample_translate(model, SOURCES, max_new_tokens=10, top_p=1e-6, seed=5), greedy,
        next_logits, "top_p=1e-6")
    assert sample_translate(model, SOURCES, max_new_tokens=10, temperature=0) == greedy
    gpt = make_gpt()
    prompts = [[5, 6, 7], [8]]
    assert generate_ids(gpt, prompts, 6, top_k=1, seed=9) == generate_ids(gpt, prompts, 6,
                                                                           temperature=0)


def test_temperatures_beyond_float32_are_its_limits():
    """Exact: a temperature below float32's normal range is 0, the greedy path itself; one
    above it runs as the largest float32 (every id alike), without an overflow warning (an
    HTTP request may send 5e-324 or 1e308)."""
    model = make_transformer()
    greedy = greedy_translate(model, SOURCES, max_new_tokens=6)
    assert sample_translate(model, SOURCES, max_new_tokens=6, temperature=1e-300,
                            seed=1) == greedy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hottest = sample_translate(model, SOURCES, max_new_tokens=6, temperature=1e308, seed=1)
    assert hottest == sample_translate(model, SOURCES, max_new_tokens=6,
                                       temperature=float(np.finfo(np.float32).max), seed=1)
    gpt = make_gpt()
    assert generate_ids(gpt, [4, 5], 5, temperature=1e-300, seed=2) == generate_ids(
        gpt, [4, 5], 5, temperature=0)


def test_same_seed_same_sample_other_seed_other_sample():
    """Exact: the same seed runs the same kernels and draws the same numbers."""
    model = make_transformer()
    first = sample_translate(model, SOURCES, max_new_tokens=10, temperature=1.5, seed=11)
    assert sample_translate(model, SOURCES, max_new_tokens=10, temperature=1.5, seed=11) == first
    others = [sample_translate(model, SOURCES, max_new_tokens=10, temperature=1.5, seed=s)
              for s in (12, 13)]
    assert any(o != first for o in others)
    gpt = make_gpt()
    sample = generate_ids(gpt, [4, 5, 6], 8, top_p=0.9, top_k=10, seed=3)
    assert generate_ids(gpt, [4, 5, 6], 8, top_p=0.9, top_k=10, seed=3) == sample


def test_filter_logits_top_k_and_top_p():
    logits = ops.convert_to_tensor(np.log(np.array([[0.5, 0.3, 0.15, 0.05]], "float32")))
    top2 = ops.convert_to_numpy(filter_logits(logits, 1.0, top_k=2))
    assert np.isfinite(top2[0, :2]).all() and np.isinf(top2[0, 2:]).all()
    nucleus = ops.convert_to_numpy(filter_logits(logits, 1.0, top_p=0.75))
    assert np.isfinite(nucleus[0, :2]).all() and np.isinf(nucleus[0, 2:]).all()  # 0.5+0.3
    everything = ops.convert_to_numpy(filter_logits(logits, 2.0, top_p=1.0))
    # exact: a division by 2 is exact in binary floating point
    np.testing.assert_array_equal(everything, ops.convert_to_numpy(logits) / 2.0)


def test_samples_follow_the_softmax():
    """The frequencies of 20,000 draws within 5 standard deviations of a binomial
    frequency (a sampling bound, not a rounding one: rounding moves a draw only at a
    boundary between two ids, far below that)."""
    probs = np.array([0.6, 0.25, 0.1, 0.05], "float32")
    logits = ops.convert_to_tensor(np.tile(np.log(probs), (20000, 1)))
    choose = sampling_choice(np.int32(0), np.float32(1.0), None, None)
    draws = ops.convert_to_numpy(choose(logits, 0))
    tol.assert_within(np.bincount(draws, minlength=4) / len(draws), probs,
                      5 * np.sqrt(probs * (1 - probs) / len(draws)))


# -- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("prompts", [[5, 17], [[4, 5], [-1, 6, 7]], [99]])
def test_prompt_ids_outside_the_vocabulary_are_a_clear_error(prompts):
    """Every engine's step indexes its tables with the prompt's ids: one outside the
    vocabulary is named before any step runs, not an index error inside one."""
    gpt = make_gpt()
    with pytest.raises(ValueError, match=r"prompt_ids contains id -?\d+, outside the "
                                         r"vocabulary \[0, 17\)"):
        generate_ids(gpt, prompts, 3, temperature=0)


def test_empty_inputs_are_clear_errors():
    model = make_transformer()
    with pytest.raises(ValueError, match="sentence 1 is empty"):
        greedy_translate(model, np.array([[5, EOS], [0, 0]]))
    with pytest.raises(ValueError, match="no sentence"):
        beam_translate(model, np.zeros((0, 4), "int32"))
    tokenizer = CharTokenizer.train(["abc def"])
    with pytest.raises(ValueError, match="text 1 is empty"):
        translate_texts(model, tokenizer, tokenizer, ["abc", "  "])
    with pytest.raises(ValueError, match="prompt is empty"):
        generate_ids(make_gpt(), [], 5)


def test_columns_of_padding_in_every_row_are_dropped_before_the_encoder():
    """A batch padded wider than its longest sentence (here past ``max_length``) decodes as
    the same batch padded to its longest sentence: the all-padding columns are dropped."""
    from transformerkit.decoding.common import prepare_sources

    model = make_transformer(max_length=12)
    wide = np.zeros((3, 20), "int32")
    wide[:, :SOURCES.shape[1]] = SOURCES
    source, active = prepare_sources(model, wide)
    tight, _ = prepare_sources(model, SOURCES)
    np.testing.assert_array_equal(source, tight)
    assert active[:3].all() and source.shape[1] < 12
    assert greedy_translate(model, wide, max_new_tokens=6) == \
        greedy_translate(model, SOURCES, max_new_tokens=6)
    assert [h[0].ids for h in beam_translate(model, wide, beam_size=2, max_new_tokens=6)] == \
        [h[0].ids for h in beam_translate(model, SOURCES, beam_size=2, max_new_tokens=6)]


def test_over_long_inputs_are_truncated_with_a_warning():
    model = make_transformer(max_length=12)
    tokenizer = CharTokenizer.train(["abcdef ghij"])
    with pytest.warns(UserWarning, match="max_length=12"):
        out = translate_texts(model, tokenizer, tokenizer, ["abcdef ghij abcdef"],
                              max_new_tokens=4)
    assert isinstance(out[0], str)
    with pytest.warns(UserWarning, match="max_length"):
        assert len(greedy_translate(model, SOURCES, max_new_tokens=50)) == 3
    with pytest.raises(ValueError, match="longer than max_length"):
        greedy_translate(model, np.ones((1, 13), "int32"))
    gpt = make_gpt()
    with pytest.warns(UserWarning, match="last 15"):
        assert len(generate_ids(gpt, list(range(4, 17)) * 2, 3, temperature=0)) <= 3


# -- all three backends -----------------------------------------------------------------------

def probe():
    """Checks of this file on the current backend, as a dict of numbers and booleans.

    Kept small: on JAX and TensorFlow every (algorithm, settings, shape) compiles once."""
    results = {"backend": keras.backend.backend()}
    modes = (True, "keras") if keras.backend.backend() == "torch" else (True,)  # same path
    for options in MODEL_OPTIONS:
        model = make_transformer(options)
        for mode in modes:
            results[f"{options}/cache={mode}/excess"] = cache_excess(model, mode)
    model = make_transformer("pre_gelu_t2t_tied")
    greedy = greedy_translate(model, SOURCES, max_new_tokens=10)
    next_logits = next_logits_after(model, SOURCES)  # ids: the same except at a near-tie
    results["recompute_equal"] = holds(
        assert_same_ids_or_near_tie, greedy_translate(
            model, SOURCES, max_new_tokens=10, use_cache=False), greedy, next_logits)
    results["beam1_equals_greedy"] = holds(
        assert_same_ids_or_near_tie, [h[0].ids for h in beam_translate(
            model, SOURCES, max_new_tokens=10, beam_size=1, alpha=0.0)], greedy, next_logits)
    results["top_k1_equals_greedy"] = holds(
        assert_same_ids_or_near_tie, sample_translate(
            model, SOURCES, max_new_tokens=10, top_k=1, seed=4), greedy, next_logits)
    found = beam_translate(model, SOURCES, max_new_tokens=10, beam_size=3, n_best=3)
    results["beam_sorted"] = all(
        [h.score for h in f] == sorted((h.score for h in f), reverse=True) for f in found)
    sample = sample_translate(model, SOURCES, max_new_tokens=10, temperature=1.5, seed=7)
    # exact: the same kernels, the same draws
    results["same_seed_same_sample"] = sample == sample_translate(
        model, SOURCES, max_new_tokens=10, temperature=1.5, seed=7)
    results["large_vocabulary_beams_equal"] = holds(large_vocabulary_beams_equal)
    results.update(stopping_and_caps_checks())
    results["argmax_ids_equal_numpy"] = argmax_ids_equal_numpy()
    gpt = make_gpt()
    prompts = [[5, 6, 7, 8], [9, 10]]
    cached = generate_ids(gpt, prompts, 6, temperature=0)
    results["gpt_recompute_equal"] = holds(
        assert_same_ids_or_near_tie, generate_ids(gpt, prompts, 6, temperature=0,
                                                  use_cache=False),
        cached, next_logits_after(gpt, prompts=prompts))
    results["gpt_same_seed"] = generate_ids(gpt, prompts, 6, seed=2, top_p=0.9) == \
        generate_ids(gpt, prompts, 6, seed=2, top_p=0.9)
    return results


def stopping_and_caps_checks():
    """Beam search's two stopping rules with length caps equal the plain reference search of
    ``tests/support/reference_search.py`` (the compiled loops freeze finished sentences; the
    eager one drops them), and greedy outputs keep to their caps."""
    from reference_search import SOURCES as MIXED
    from reference_search import check_against_reference, mixed_length_model

    from transformerkit.decoding.texts import length_caps

    model = mixed_length_model(3, 1.5)
    results = {}
    for stopping in ("exact", "early"):
        try:
            check_against_reference(model, MIXED, 3, 2.0, stopping, 10, caps_ab=(1.0, 2))
            results[f"beam_{stopping}_capped_equals_reference"] = True
        except AssertionError as error:
            results[f"beam_{stopping}_capped_equals_reference"] = str(error)[:500]
    try:  # no_repeat_ngram_size: the ban's keras.ops form inside the compiled loops
        check_against_reference(mixed_length_model(3, -1.0), MIXED, 3, 0.6, "early", 10,
                                no_repeat=2)
        results["beam_no_repeat_equals_reference"] = True
    except AssertionError as error:
        results["beam_no_repeat_equals_reference"] = str(error)[:500]
    caps = length_caps(MIXED, 10, 0.5, 1)
    capped = greedy_translate(model, MIXED, max_new_tokens=10, max_len_a=0.5, max_len_b=1)
    full = greedy_translate(model, MIXED, max_new_tokens=10)
    # rows leave the batch at other steps: the same ids except at a near-tie
    results["greedy_caps_cut_the_same_search"] = holds(
        assert_same_ids_or_near_tie, capped,
        [f[:cap] for f, cap in zip(full, caps, strict=True)], next_logits_after(model, MIXED))
    return results


@pytest.fixture(scope="module")
def backend_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoding_probe")
    # this file, run as a script, imports the helper modules of tests/ as the tests do
    path = os.pathsep.join(filter(None, [str(SUPPORT_DIR), os.environ.get("PYTHONPATH")]))
    processes = {}
    for backend in BACKENDS:
        env = dict(os.environ, KERAS_BACKEND=backend, XLA_FLAGS=FAST_XLA_COMPILE,
                   PYTHONPATH=path)
        out = folder / f"{backend}.json"
        processes[backend] = (subprocess.Popen(
            [sys.executable, __file__, str(out)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True), out)
    results = {}
    for backend, (process, out) in processes.items():
        log, _ = process.communicate(timeout=900)
        assert process.returncode == 0, f"probe failed under {backend}:\n{log[-5000:]}"
        results[backend] = json.loads(out.read_text())
    return results


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_backends(backend_results, backend):
    results = backend_results[backend]
    assert results["backend"] == backend
    for key, value in results.items():
        if key.endswith("excess"):  # |cached - full| over its bound
            assert value <= 1.0, (key, value)
        elif key != "backend":
            assert value is True, key


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    keras.utils.set_random_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        payload = probe()
    with open(sys.argv[1], "w") as f:
        json.dump(payload, f, indent=1)
