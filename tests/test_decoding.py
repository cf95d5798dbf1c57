"""Decoders: the key/value cache against full recomputation, greedy, beam search, sampling,
end tokens in a batch, bad input; and the same checks on JAX, TensorFlow and PyTorch.

Run as a script (``python tests/test_decoding.py OUT.json``) this file is the per-backend
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
from keras import ops

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
    length_penalty,
    log_softmax_plus,
)
from transformerkit.decoding.sampling import filter_logits, sampling_choice
from transformerkit.models import GPT, Transformer

TOL = 1e-5
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


def cache_differences(model, use_cache, max_new=10):
    """Largest |cached step logits - full forward logits| over the steps each row ran."""
    outputs, logits = greedy_translate(model, SOURCES, max_new_tokens=max_new,
                                       use_cache=use_cache, return_logits=True)
    full = full_logits(model, SOURCES, outputs, max_new)
    worst = 0.0
    for row, ids in enumerate(outputs):
        steps = min(len(ids) + 1, max_new)  # the step that produced EOS is checked too
        worst = max(worst, float(np.abs(full[row, :steps] - logits[row, :steps]).max()))
    return worst


# -- the cache --------------------------------------------------------------------------------

@pytest.mark.parametrize("options", MODEL_OPTIONS)
@pytest.mark.parametrize("use_cache", [True, "keras"])
def test_cached_logits_equal_full_recomputation_at_every_step(options, use_cache):
    model = make_transformer(options)
    assert cache_differences(model, use_cache) < TOL


def test_recomputation_and_cache_give_the_same_translations():
    model = make_transformer()
    cached = greedy_translate(model, SOURCES, max_new_tokens=10)
    assert greedy_translate(model, SOURCES, max_new_tokens=10, use_cache=False) == cached
    assert greedy_translate(model, SOURCES, max_new_tokens=10, use_cache="keras") == cached


def test_gpt_cache_equals_recomputation_for_prompts_of_different_lengths():
    model = make_gpt()
    prompts = [[5, 6, 7, 8], [9, 10], [3, 4, 11]]
    cached = generate_ids(model, prompts, max_new_tokens=6, temperature=0)
    assert generate_ids(model, prompts, max_new_tokens=6, temperature=0, use_cache=False) == cached
    assert generate_ids(model, prompts, max_new_tokens=6, temperature=0,
                        use_cache="keras") == cached
    # a batch gives what each prompt gives alone
    assert [generate_ids(model, p, max_new_tokens=6, temperature=0) for p in prompts] == cached
    # and greedy generation is the arg-max of a full forward pass at every position
    ids = list(prompts[0])
    for token in cached[0]:
        logits = ops.convert_to_numpy(model(np.array([ids], "int32")))[0, -1]
        logits[[0, 1]] = -np.inf  # PAD and BOS are never generated
        assert int(logits.argmax()) == token
        ids.append(token)


# -- greedy and end tokens --------------------------------------------------------------------

def test_batch_with_different_lengths_equals_one_sentence_at_a_time():
    model = make_transformer("pre_gelu_t2t_tied")
    batch = greedy_translate(model, SOURCES, max_new_tokens=10)
    for row in range(len(SOURCES)):
        length = int((SOURCES[row] != 0).sum())
        alone = greedy_translate(model, SOURCES[row:row + 1, :length], max_new_tokens=10)
        assert alone[0] == batch[row]


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
    model = make_transformer(options)
    greedy = greedy_translate(model, SOURCES, max_new_tokens=10)
    beam = beam_translate(model, SOURCES, max_new_tokens=10, beam_size=1, alpha=0.0)
    assert [h[0].ids for h in beam] == greedy


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_results_are_sorted_and_scored_by_the_model(alpha):
    model = make_transformer("pre_gelu_t2t_tied", seed=3)
    hyps = beam_translate(model, SOURCES, max_new_tokens=10, beam_size=4, n_best=4, alpha=alpha)
    for found in hyps:
        assert len(found) == 4
        scores = [h.score for h in found]
        assert scores == sorted(scores, reverse=True)
        for h in found:
            length = len(h.ids) + h.finished  # EOS counts when the hypothesis ended
            assert h.score == pytest.approx(h.log_prob / length_penalty(length, alpha), abs=1e-5)
    # the reported log-probabilities are the model's own (one full forward pass)
    for k in range(4):
        finished = [found[k].finished for found in hyps]
        model_logp = sequence_log_probs(model, SOURCES, [found[k].ids for found in hyps])
        for row, found in enumerate(hyps):
            if finished[row]:
                assert found[k].log_prob == pytest.approx(model_logp[row], abs=1e-4)


@pytest.mark.parametrize("options", MODEL_OPTIONS)
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_best_beam_never_scores_below_greedy(options, alpha):
    model = make_transformer(options, seed=1)
    greedy = greedy_translate(model, SOURCES, max_new_tokens=10)
    greedy_logp = sequence_log_probs(model, SOURCES, greedy)
    best = beam_translate(model, SOURCES, max_new_tokens=10, beam_size=4, alpha=alpha)
    for row, ids in enumerate(greedy):
        if len(ids) == 10:  # greedy hit the limit without EOS: not a finished hypothesis
            continue
        greedy_score = greedy_logp[row] / length_penalty(len(ids) + 1, alpha)
        assert best[row][0].score >= greedy_score - 1e-4


@pytest.mark.parametrize("options", MODEL_OPTIONS)
def test_beam_search_is_the_same_on_every_cache_path(options):
    """The backend's fast cache (on PyTorch: TorchSteps, whose ``reorder`` moves the caches
    with their beams), the Keras cache and recomputation find the same beams."""
    model = make_transformer(options)
    found = [beam_translate(model, SOURCES, max_new_tokens=10, beam_size=4, n_best=4,
                            use_cache=mode) for mode in (True, "keras", False)]
    for other in found[1:]:
        for a, b in zip(found[0], other, strict=True):
            assert [h.ids for h in a] == [h.ids for h in b]
            np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-5)


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


def argmax_ids_equal_numpy():
    """``argmax_ids`` (``torch.max`` on PyTorch) = NumPy's argmax: the first column on ties,
    rows with -inf regions, a row that is all -inf, one column."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 1000)).astype("float32")
    x[1, 3::50] = 9.0  # ties: the first one wins
    x[2, :] = 4.0
    x[3, :500] = -np.inf
    x[4, :] = -np.inf
    cases = [x, x[:, :1]]
    return all(np.array_equal(ops.convert_to_numpy(argmax_ids(ops.convert_to_tensor(c))),
                              np.argmax(c, axis=1).astype("int32")) for c in cases)


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
    np.testing.assert_allclose(ops.convert_to_numpy(got), reference, atol=1e-5)


def test_argmax_ids_equals_numpy():
    assert argmax_ids_equal_numpy()


def _plain_top_k(x, k):
    values, indices = ops.top_k(x, k)
    return values, ops.cast(indices, "int32")


def large_vocabulary_beams_equal():
    """Beam 4 over 600 words takes the chunked top-k path; a twin model (its own compiled
    decoder on JAX/TensorFlow) searching with plain ``top_k`` must find the same beams."""
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
    return all([h.ids for h in a] == [h.ids for h in b] and
               np.allclose([h.score for h in a], [h.score for h in b], atol=1e-5)
               for a, b in zip(*results, strict=True))


def test_beam_search_with_a_large_vocabulary_equals_plain_top_k():
    assert large_vocabulary_beams_equal()


def test_beam_arguments_are_checked():
    model = make_transformer()
    with pytest.raises(ValueError, match="n_best"):
        beam_translate(model, SOURCES, beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="beam_size"):
        beam_translate(model, SOURCES, beam_size=0)
    with pytest.raises(ValueError, match="alpha"):
        beam_translate(model, SOURCES, alpha=-1.0)


# -- sampling ---------------------------------------------------------------------------------

def test_top_k_one_and_tiny_top_p_equal_greedy():
    model = make_transformer()
    greedy = greedy_translate(model, SOURCES, max_new_tokens=10)
    assert sample_translate(model, SOURCES, max_new_tokens=10, top_k=1, seed=5) == greedy
    assert sample_translate(model, SOURCES, max_new_tokens=10, top_p=1e-6, seed=5) == greedy
    assert sample_translate(model, SOURCES, max_new_tokens=10, temperature=0) == greedy
    gpt = make_gpt()
    prompts = [[5, 6, 7], [8]]
    assert generate_ids(gpt, prompts, 6, top_k=1, seed=9) == generate_ids(gpt, prompts, 6,
                                                                           temperature=0)


def test_same_seed_same_sample_other_seed_other_sample():
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
    np.testing.assert_allclose(everything, ops.convert_to_numpy(logits) / 2.0, rtol=1e-6)


def test_samples_follow_the_softmax():
    probs = np.array([0.6, 0.25, 0.1, 0.05], "float32")
    logits = ops.convert_to_tensor(np.tile(np.log(probs), (20000, 1)))
    choose = sampling_choice(np.int32(0), np.float32(1.0), None, None)
    draws = ops.convert_to_numpy(choose(logits, 0))
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / len(draws), probs, atol=0.015)


# -- bad input --------------------------------------------------------------------------------

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
            results[f"{options}/cache={mode}/max_diff"] = cache_differences(model, mode)
    model = make_transformer("pre_gelu_t2t_tied")
    greedy = greedy_translate(model, SOURCES, max_new_tokens=10)
    results["recompute_equal"] = \
        greedy_translate(model, SOURCES, max_new_tokens=10, use_cache=False) == greedy
    results["beam1_equals_greedy"] = [h[0].ids for h in beam_translate(
        model, SOURCES, max_new_tokens=10, beam_size=1, alpha=0.0)] == greedy
    results["top_k1_equals_greedy"] = sample_translate(
        model, SOURCES, max_new_tokens=10, top_k=1, seed=4) == greedy
    found = beam_translate(model, SOURCES, max_new_tokens=10, beam_size=3, n_best=3)
    results["beam_sorted"] = all(
        [h.score for h in f] == sorted((h.score for h in f), reverse=True) for f in found)
    sample = sample_translate(model, SOURCES, max_new_tokens=10, temperature=1.5, seed=7)
    results["same_seed_same_sample"] = sample == sample_translate(
        model, SOURCES, max_new_tokens=10, temperature=1.5, seed=7)
    results["large_vocabulary_beams_equal"] = large_vocabulary_beams_equal()
    results.update(stopping_and_caps_checks())
    results["argmax_ids_equal_numpy"] = argmax_ids_equal_numpy()
    gpt = make_gpt()
    prompts = [[5, 6, 7, 8], [9, 10]]
    cached = generate_ids(gpt, prompts, 6, temperature=0)
    results["gpt_recompute_equal"] = cached == generate_ids(gpt, prompts, 6, temperature=0,
                                                            use_cache=False)
    results["gpt_same_seed"] = generate_ids(gpt, prompts, 6, seed=2, top_p=0.9) == \
        generate_ids(gpt, prompts, 6, seed=2, top_p=0.9)
    return results


def stopping_and_caps_checks():
    """Beam search's two stopping rules with length caps equal the plain reference search of
    ``test_search_stopping.py`` (the compiled loops freeze finished sentences; the eager one
    drops them), and greedy outputs keep to their caps."""
    from test_search_stopping import SOURCES as MIXED
    from test_search_stopping import check_against_reference, mixed_length_model

    from transformerkit.decoding.common import length_caps

    model = mixed_length_model(3, 1.5)
    results = {}
    for stopping in ("exact", "early"):
        try:
            check_against_reference(model, MIXED, 3, 2.0, stopping, 10, caps_ab=(1.0, 2))
            results[f"beam_{stopping}_capped_equals_reference"] = True
        except AssertionError as error:
            results[f"beam_{stopping}_capped_equals_reference"] = str(error)[:500]
    caps = length_caps(MIXED, 10, 0.5, 1)
    capped = greedy_translate(model, MIXED, max_new_tokens=10, max_len_a=0.5, max_len_b=1)
    full = greedy_translate(model, MIXED, max_new_tokens=10)
    results["greedy_caps_cut_the_same_search"] = all(
        c == f[:cap] for c, f, cap in zip(capped, full, caps, strict=True))
    return results


BACKENDS = ("jax", "tensorflow", "torch")


@pytest.fixture(scope="module")
def backend_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoding_probe")
    fast_xla = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    processes = {}
    for backend in BACKENDS:
        env = dict(os.environ, KERAS_BACKEND=backend, XLA_FLAGS=fast_xla)
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
        if key.endswith("max_diff"):
            assert value < TOL, (key, value)
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
