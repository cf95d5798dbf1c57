"""``no_repeat_ngram_size``: no token n-gram twice in an output (fairseq's
``--no-repeat-ngram-size``, ``transformers``' and CTranslate2's ``no_repeat_ngram_size``).

The ban itself equals a dict-based reference (``transformers``' algorithm) exactly, in both
loop namespaces; greedy and beam search with it equal the plain reference search of
``tests/support/reference_search.py`` (float64 full passes, the ban written with a dict),
up to near-ties, and every cache path gives the same outputs. The random-weight models here
repeat themselves without the ban, so each check sees it change the outputs.
"""

import numpy as np
import pytest
import tolerances as tol
from keras import ops
from near_ties import assert_same_ids_or_near_tie, next_logits_after
from reference_search import (
    SOURCES,
    check_against_reference,
    mixed_length_model,
    reference_beam_search,
    repeated_ngram_bans,
)

from transformerkit.decoding import beam_translate, greedy_translate, sample_translate
from transformerkit.decoding.common import ban_repeated_ngrams
from transformerkit.decoding.loop_ops import loop_ops
from transformerkit.decoding.options import SearchOptions
from transformerkit.special_tokens import BOS_ID


def has_repeat(ids, n):
    grams = [tuple(ids[j:j + n]) for j in range(len(ids) - n + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("namespace", ["loop", "keras"])
def test_the_ban_equals_the_dict_reference(namespace):
    xp = loop_ops() if namespace == "loop" else ops
    rng = np.random.default_rng(0)
    vocab, rows, width = 6, 16, 12
    tokens = rng.integers(3, vocab, (rows, width)).astype("int32")
    tokens[:, 0] = BOS_ID
    tokens[:4, 1:7] = [4, 5, 4, 5, 4, 5]  # loops, as a weak model makes them
    banned_somewhere = 0
    for n in (1, 2, 3, 4):
        for index in range(width - 1):
            scores = rng.normal(size=(rows, vocab)).astype("float32")
            out = ops.convert_to_numpy(ban_repeated_ngrams(
                xp, xp.convert_to_tensor(scores), xp.convert_to_tensor(tokens), index, n))
            expected = scores.copy()
            for row in range(rows):
                bans = repeated_ngram_bans(list(tokens[row, :index + 1]), n)
                expected[row, sorted(bans)] = -np.inf
                banned_somewhere += len(bans)
            np.testing.assert_array_equal(out, expected, err_msg=f"n={n} index={index}")
            # a scalar tensor index (the compiled loops') bans the same ids
            as_tensor = ops.convert_to_numpy(ban_repeated_ngrams(
                xp, xp.convert_to_tensor(scores), xp.convert_to_tensor(tokens),
                xp.convert_to_tensor(index, "int32"), n))
            np.testing.assert_array_equal(as_tensor, expected)
    assert banned_somewhere > 100
    # 0 is off: the scores themselves
    scores = xp.convert_to_tensor(np.zeros((rows, vocab), "float32"))
    assert ban_repeated_ngrams(xp, scores, xp.convert_to_tensor(tokens), 8, 0) is scores


@pytest.mark.parametrize("stopping", ["exact", "early"])
def test_beam_search_without_repeats_equals_the_reference(stopping):
    model = mixed_length_model(3, -1.0)  # rarely ends: long outputs that repeat themselves
    plain = beam_translate(model, SOURCES, beam_size=3, n_best=2, max_new_tokens=12)
    assert any(has_repeat(h.ids, 2) for hyps in plain for h in hyps)
    found = check_against_reference(model, SOURCES, 3, 0.6, stopping, 12, no_repeat=2)
    for hyps in found:
        for h in hyps:
            assert not has_repeat([BOS_ID] + h.ids, 2), h.ids


def test_the_check_catches_a_search_that_ignores_the_setting(monkeypatch):
    """Planted bug: beam search never bans (the reference still does)."""
    from transformerkit.decoding import beam

    monkeypatch.setattr(beam, "ban_repeated_ngrams", lambda xp, scores, *args: scores)
    tol.assert_caught(test_beam_search_without_repeats_equals_the_reference, "exact")


@pytest.mark.parametrize("n", [2, 3])
def test_greedy_search_without_repeats_equals_the_reference(n):
    model = mixed_length_model(5, -1.0)
    plain = greedy_translate(model, SOURCES, max_new_tokens=12)
    assert any(has_repeat(ids, n) for ids in plain)
    ours = greedy_translate(model, SOURCES, max_new_tokens=12, no_repeat_ngram_size=n)
    expected = []
    for row in range(len(SOURCES)):
        source = SOURCES[row][: int(np.count_nonzero(SOURCES[row]))]
        best = reference_beam_search(model, source, 1, 0.0, 12, "exact", no_repeat=n)[0][0]
        expected.append(best)
    assert_same_ids_or_near_tie(ours, expected, next_logits_after(model, SOURCES))
    assert not any(has_repeat([BOS_ID] + ids, n) for ids in ours)
    assert ours != plain


@pytest.mark.parametrize("use_cache", ["keras", False])
def test_every_cache_path_and_loop_gives_the_same_outputs(use_cache):
    model = mixed_length_model(5, -1.0)
    options = SearchOptions(max_new_tokens=12, no_repeat_ngram_size=2, beam_size=3)
    beams = beam_translate(model, SOURCES, options)
    greedy = greedy_translate(model, SOURCES, options.replace(beam_size=1))
    logits = next_logits_after(model, SOURCES)
    assert_same_ids_or_near_tie(
        greedy_translate(model, SOURCES, options.replace(beam_size=1), use_cache=use_cache),
        greedy, logits)
    other = beam_translate(model, SOURCES, options, use_cache=use_cache)
    assert [[h.ids for h in x] for x in other] == [[h.ids for h in x] for x in beams]
    kept = beam_translate(model, SOURCES, options, drop_finished=False)
    assert [[h.ids for h in x] for x in kept] == [[h.ids for h in x] for x in beams]


def test_sampled_translations_keep_the_rule_too():
    model = mixed_length_model(5, -1.0)
    for seed in range(4):
        sampled = sample_translate(model, SOURCES, max_new_tokens=12, temperature=1.0,
                                   seed=seed, no_repeat_ngram_size=1)
        assert not any(has_repeat([BOS_ID] + ids, 1) for ids in sampled)


def test_sizes_beyond_any_output_change_nothing_and_huge_values_are_no_error():
    """An n-gram longer than any output bans nothing; ``min_new_tokens`` beyond the length
    cap forbids the end token up to the cap (huge values, as a request may send, fit)."""
    model = mixed_length_model(5, -1.0)
    plain = greedy_translate(model, SOURCES, max_new_tokens=8)
    assert greedy_translate(model, SOURCES, max_new_tokens=8,
                            no_repeat_ngram_size=2**31) == plain
    beams = beam_translate(model, SOURCES, beam_size=2, max_new_tokens=8,
                           no_repeat_ngram_size=2**31, min_new_tokens=2**31)
    assert all(len(h[0].ids) == 8 and not h[0].finished for h in beams)
    assert all(len(ids) == 8 for ids in greedy_translate(model, SOURCES, max_new_tokens=8,
                                                         min_new_tokens=2**31))


def test_a_gpt_generates_without_repeats_as_the_reference_does():
    """A GPT's continuation: no n-gram twice in the prompt and its continuation, the same
    ids as a plain loop of full passes banning with the dict reference (except at a
    near-tie); the cached, recomputing and streamed paths agree."""
    import keras

    from transformerkit.decoding.sampling import generate_ids
    from transformerkit.decoding.streaming import stream_ids
    from transformerkit.models import GPT
    from transformerkit.special_tokens import PAD_ID

    keras.utils.set_random_seed(2)
    gpt = GPT(vocab_size=13, num_layers=2, d_model=16, num_heads=4, d_ff=32, max_length=24)
    gpt(np.ones((1, 3), "int32"))
    rng = np.random.default_rng(2)
    for variable in gpt.trainable_weights:
        value = ops.convert_to_numpy(variable)
        variable.assign((value + rng.normal(0.0, 0.4, value.shape)).astype(value.dtype))
    prompts, n, steps = [[5, 6, 7, 5, 6], [9, 10]], 2, 12
    plain = generate_ids(gpt, prompts, steps, temperature=0)
    assert any(has_repeat(p + new, n) for p, new in zip(prompts, plain, strict=True))
    ours = generate_ids(gpt, prompts, steps, temperature=0, no_repeat_ngram_size=n)
    expected = []
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(steps):
            logits = ops.convert_to_numpy(gpt(np.array([ids], "int32")))[0, -1]
            logits = logits.astype("float64")
            logits[[PAD_ID, BOS_ID]] = -np.inf
            logits[sorted(repeated_ngram_bans(ids, n))] = -np.inf
            ids.append(int(np.argmax(logits)))
        expected.append(ids[len(prompt):])
    assert_same_ids_or_near_tie(ours, expected, next_logits_after(gpt, prompts=prompts))
    # the prompt's own repeat (5 6 ... 5 6) stays; nothing new repeats a bigram
    for prompt, new in zip(prompts, ours, strict=True):
        grams = [tuple((prompt + new)[j:j + n]) for j in range(len(prompt + new) - n + 1)]
        assert len(set(grams[len(prompt) - n + 1:])) == len(grams) - len(prompt) + n - 1
        assert not set(grams[len(prompt) - n + 1:]) & set(grams[:len(prompt) - n + 1])
    assert generate_ids(gpt, prompts, steps, temperature=0, no_repeat_ngram_size=n,
                        use_cache=False) == ours
    streamed = [i for piece in stream_ids(gpt, prompts[0], steps, temperature=0,
                                          no_repeat_ngram_size=n) for i in piece]
    assert streamed == ours[0]
