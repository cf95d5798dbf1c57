"""Search to the end token: finished sentences leave the batch (same results as keeping
them), beam search's two stopping rules and the output-length cap, each against a plain
reference beam search over full forward passes (float64 log-softmax, one sentence at a
time), on random-weight and briefly trained models with outputs of mixed lengths.

Kinds of claims: where the two searches run other float32 kernels or other shapes (the
reference's full passes, a batch with fewer rows), scores agree within their rounding bound
and ids are equal except at a near-tie (:func:`assert_same_ids_or_near_tie`,
:func:`assert_same_hypotheses_or_near_tie`); where they run the same kernels (the two loop
namespaces), everything is exact.

The reference search is in ``tests/support/reference_search.py`` (also used by the per-backend
probe of ``test_decoding.py``), the bounds and comparisons of search results in
``tests/support/near_ties.py``.
"""

import warnings

import keras
import numpy as np
import pytest
import tolerances as tol
from keras import ops
from near_ties import (
    assert_same_hypotheses_or_near_tie,
    assert_same_ids_or_near_tie,
    first_difference,
    next_logits_after,
    score_bound,
)
from reference_search import (
    SOURCES,
    check_against_reference,
    mixed_length_model,
)

from transformerkit.decoding import beam_translate, greedy_translate, translate_texts
from transformerkit.decoding.common import length_penalty
from transformerkit.decoding.options import SearchOptions
from transformerkit.decoding.texts import length_caps
from transformerkit.models import Transformer
from transformerkit.special_tokens import BOS_ID, EOS_ID, PAD_ID


@pytest.fixture(scope="module")
def trained_model():
    """A copy-task Transformer trained for a few dozen steps: it ends its outputs at many
    different lengths (and sometimes not at all), as a weak real model does."""
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(3)
    vocab, longest, n = 14, 8, 64 * 40
    lengths = rng.integers(2, longest + 1, n)
    source = np.zeros((n, longest + 1), "int32")
    for row, length in enumerate(lengths):
        source[row, :length] = rng.integers(3, vocab, length)
        source[row, length] = EOS_ID
    labels = source.copy()
    target_input = np.concatenate([np.full((n, 1), BOS_ID, "int32"), source[:, :-1]], axis=1)
    target_input[labels == PAD_ID] = PAD_ID
    from transformerkit.training import MaskedCrossEntropy, attach_train_step

    model = Transformer(vocab, vocab, num_layers=1, d_model=32, num_heads=4, d_ff=64,
                        dropout=0.0, max_length=16)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=MaskedCrossEntropy())
    attach_train_step(model)
    model.fit((source, target_input), labels, batch_size=64, epochs=1, verbose=0)
    return model, source[:24]


# -- live rows: the same results as keeping every row ------------------------------------------

def _same_beams(model, sources, a, b):
    """Beams of a batch that kept its finished rows and of one that dropped them: other
    shapes (fewer rows: the products may take other code paths), so near-ties allowed."""
    atol = score_bound(model, sources, a + b)
    for row, (x, y) in enumerate(zip(a, b, strict=True)):
        assert_same_hypotheses_or_near_tie(x, y, atol, f"sentence {row}")


@pytest.mark.parametrize("use_cache", [True, "keras", False])
def test_dropping_finished_rows_changes_no_result(use_cache):
    """Ids and scores with and without the finished rows: other batch shapes, so near-ties
    allowed."""
    for seed, eos_bias in ((0, 2.0), (3, 1.5)):
        model = mixed_length_model(seed, eos_bias)
        next_logits = next_logits_after(model, SOURCES)
        kept = greedy_translate(model, SOURCES, use_cache=use_cache, drop_finished=False)
        assert len({len(x) for x in kept}) > 2  # the sentences end at different steps
        assert_same_ids_or_near_tie(greedy_translate(model, SOURCES, use_cache=use_cache), kept,
                                    next_logits)
        capped = dict(max_len_a=1.0, max_len_b=2)
        assert_same_ids_or_near_tie(
            greedy_translate(model, SOURCES, use_cache=use_cache, **capped),
            greedy_translate(model, SOURCES, use_cache=use_cache, drop_finished=False, **capped),
            next_logits)
        for stopping in ("exact", "early"):
            options = dict(beam_size=3, n_best=3, stopping=stopping, use_cache=use_cache)
            _same_beams(model, SOURCES, beam_translate(model, SOURCES, **options),
                        beam_translate(model, SOURCES, drop_finished=False, **options))


def test_finished_rows_leave_the_batch_once_they_are_its_drop_share(monkeypatch):
    """Greedy search takes a finished row's output at once and drops the finished rows once
    they are ``DROP_SHARE`` of the batch: the ids and every step's logits are the same
    whatever the share (the same kernels on fewer or more rows: near-ties allowed for the
    ids, the logits within their rounding bound), and a larger share drops less often
    (1: never before the batch is done)."""
    from transformerkit.decoding import greedy

    model = mixed_length_model(0, 2.0)
    next_logits = next_logits_after(model, SOURCES)
    step_and_choose = greedy.step_and_choose
    rows = []  # the rows of each step of the search under way

    def counted(steps, rules, choose, buffer, *args, **kwargs):
        rows[-1].append(buffer.shape[0])
        return step_and_choose(steps, rules, choose, buffer, *args, **kwargs)

    monkeypatch.setattr(greedy, "step_and_choose", counted)
    found = {}
    for share in (0.0, 0.25, 1.0):
        monkeypatch.setattr(greedy, "DROP_SHARE", share)
        rows.append([])
        found[share] = greedy_translate(model, SOURCES, return_logits=True)
    drops = [sum(b < a for a, b in zip(steps, steps[1:], strict=False)) for steps in rows]
    ids, logits = found[0.0]
    assert len({len(x) for x in ids}) > 2  # the sentences end at different steps
    assert drops[0] > drops[1] > drops[2] == 0
    atol = tol.chain_atol(tol.model_roundings(model, SOURCES.shape[1], logits.shape[1]),
                          logits, paths=2)
    for share in (0.25, 1.0):
        assert_same_ids_or_near_tie(found[share][0], ids, next_logits)
        same = [row for row, out in enumerate(ids) if found[share][0][row] == out]
        assert same  # the logits of the rows whose ids agree (after a near-tie they part)
        tol.assert_within(found[share][1][same], logits[same], atol, f"share {share}")
    for row, out in enumerate(ids):  # a row's steps after its end token are zeros
        assert not found[1.0][1][row, len(out) + 1:].any()


def test_dropping_finished_rows_on_a_trained_model(trained_model):
    """As above on a trained model (near-ties allowed), and the logits of the steps each row
    ran agree within two paths' bound."""
    model, sources = trained_model
    kept = greedy_translate(model, sources, drop_finished=False)
    assert len({len(x) for x in kept}) > 3
    assert_same_ids_or_near_tie(greedy_translate(model, sources), kept,
                                next_logits_after(model, sources))
    ids, logits = greedy_translate(model, sources, return_logits=True)
    kept_ids, kept_logits = greedy_translate(model, sources, return_logits=True,
                                             drop_finished=False)
    for row, (x, y) in enumerate(zip(ids, kept_ids, strict=True)):
        # the steps both ran on the same prefix (all of them, unless a near-tie parted them)
        steps = first_difference(x, y) + 1
        atol = tol.chain_atol(tol.model_roundings(model, sources.shape[1], steps),
                              kept_logits[row, :steps], paths=2)
        tol.assert_within(logits[row, :steps], kept_logits[row, :steps], atol, f"row {row}")
    for stopping in ("exact", "early"):
        _same_beams(model, sources,
                    beam_translate(model, sources, beam_size=4, n_best=2, stopping=stopping),
                    beam_translate(model, sources, beam_size=4, n_best=2, stopping=stopping,
                                   drop_finished=False))


# -- stopping rules and caps against the reference ----------------------------------------------

@pytest.mark.parametrize("stopping", ["exact", "early"])
def test_beam_search_equals_the_reference(stopping):
    model = mixed_length_model(3, 1.5)
    # alpha 2 favours long outputs: here the two rules give different results (checked below)
    check_against_reference(model, SOURCES, 3, 2.0, stopping, 10)
    check_against_reference(model, SOURCES, 2, 0.0, stopping, 10, caps_ab=(0.5, 2))


def test_tolerances_still_catch_a_length_penalty_with_the_wrong_alpha(monkeypatch):
    """Planted bug: beam search's GNMT penalty takes 1.1 alpha (the reference keeps the right
    one): the scores move by a few percent, beyond their bound."""
    from transformerkit.decoding import beam

    monkeypatch.setattr(beam, "length_penalty",
                        lambda length, alpha, form: length_penalty(length, 1.1 * alpha, form))
    tol.assert_caught(test_beam_search_equals_the_reference, "exact")


def test_the_two_stopping_rules_differ_where_the_reference_is_checked():
    model = mixed_length_model(3, 1.5)
    exact, early = (beam_translate(model, SOURCES, beam_size=3, alpha=2.0, n_best=2,
                                   max_new_tokens=10, stopping=rule)
                    for rule in ("exact", "early"))
    differ = [[h.ids for h in x] != [h.ids for h in e]
              for x, e in zip(exact, early, strict=True)]
    assert sum(differ) >= 2


def test_trained_model_equals_the_reference(trained_model):
    model, sources = trained_model
    for stopping in ("exact", "early"):
        check_against_reference(model, sources[:8], 3, 0.6, stopping, 12, caps_ab=(1.0, 1))


def test_early_stopping_ends_sooner_and_exact_never_scores_lower(trained_model):
    """Exact search within the beam is never worse, up to two paths' bound of a score (the
    early search drops sentences sooner: other batch shapes)."""
    model, sources = trained_model
    exact = beam_translate(model, sources, beam_size=4, stopping="exact")
    early = beam_translate(model, sources, beam_size=4, stopping="early")
    atol = score_bound(model, sources, exact + early)
    for e, x in zip(early, exact, strict=True):
        length = max(len(e[0].ids), len(x[0].ids)) + 1
        assert x[0].score >= e[0].score - atol(length), (x[0], e[0], atol(length))


# -- length caps ---------------------------------------------------------------------------------

def test_length_caps_follow_the_source_and_stay_below_max_new_tokens():
    caps = length_caps(SOURCES, 9, 1.5, 1)  # source lengths 7, 4, 2, 6, 3 (EOS included)
    np.testing.assert_array_equal(caps, [9, 7, 4, 9, 5])
    np.testing.assert_array_equal(length_caps(SOURCES, 9, None, None), [9] * 5)
    np.testing.assert_array_equal(length_caps(SOURCES, 9, 0.0, 3), [3] * 5)
    model = mixed_length_model(0, -5.0)  # rarely ends: outputs run to their cap
    for ids, cap in zip(greedy_translate(model, SOURCES, max_len_a=1.0, max_len_b=1),
                        length_caps(SOURCES, 14, 1.0, 1), strict=True):
        assert len(ids) == cap  # no end token: exactly the cap
    for found, cap in zip(beam_translate(model, SOURCES, beam_size=2, n_best=2, max_len_a=1.0,
                                         max_len_b=1), length_caps(SOURCES, 14, 1.0, 1),
                          strict=True):
        assert all(len(h.ids) <= cap for h in found) and not found[0].finished


def test_length_caps_of_huge_options_are_max_new_tokens():
    """Any finite ``max_len_a`` and any int ``max_len_b`` (an HTTP request may send 1e308 or
    10**400) give caps within ``max_new``, without overflow."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow in the arithmetic or the cast
        np.testing.assert_array_equal(length_caps(SOURCES, 9, 1e308, 1), [9] * 5)
        np.testing.assert_array_equal(length_caps(SOURCES, 9, 0.0, 10 ** 400), [9] * 5)
        np.testing.assert_array_equal(length_caps(SOURCES, 9, 1e308, 10 ** 400), [9] * 5)


@pytest.mark.parametrize("a, b, error, message", [
    (-1.0, 5, ValueError, "max_len_a must be a finite number >= 0"),
    (float("nan"), 5, ValueError, "max_len_a must be a finite number >= 0"),
    ("x", 5, TypeError, "max_len_a must be a number"),
    (1.0, -2, ValueError, "max_len_b must be at least 0"),
    (1.0, 2.5, TypeError, "max_len_b must be an int"),
    (0.0, 0, ValueError, "allow no output token"),
])
def test_bad_length_caps_and_stopping_rules_are_clear_errors(a, b, error, message):
    """The searches check their options as SearchOptions does (decoding/options.py)."""
    model = mixed_length_model(0, 0.0)
    with pytest.raises(error, match=message):
        greedy_translate(model, SOURCES, max_len_a=a, max_len_b=b)
    with pytest.raises(error, match=message):
        beam_translate(model, SOURCES, max_len_a=a, max_len_b=b)
    with pytest.raises(ValueError, match="stopping must be one of 'early', 'exact'"):
        beam_translate(model, SOURCES, stopping="greedy")


@pytest.mark.parametrize("a, b, error, message", [
    (-1.0, 5, ValueError, "max_len_a must be a finite number >= 0"),
    ("x", 5, TypeError, "max_len_a must be a number"),
    (1.0, 2.5, TypeError, "max_len_b must be an int"),
    (0.0, 0, ValueError, "allow no output token"),
])
def test_the_length_cap_is_checked_once_by_search_options(a, b, error, message):
    """``length_caps`` (which the CTranslate2 engine also uses) takes the values of a
    ``SearchOptions``, whose check is the only one of the cap."""
    with pytest.raises(error, match=message):
        SearchOptions(max_len_a=a, max_len_b=b)


def test_text_translation_checks_its_search_options_before_decoding():
    from transformerkit.data.tokenizers import CharTokenizer

    tok = CharTokenizer.train(["abc def"])
    model = mixed_length_model(0, 0.0)
    with pytest.raises(ValueError, match="stopping must be"):
        translate_texts(model, tok, tok, ["abc"], beam_size=2, stopping="soon")
    with pytest.raises(ValueError, match="max_len_b must be"):
        translate_texts(model, tok, tok, ["abc"], max_len_b=-1)


def test_cli_search_options_parse_and_refuse_bad_values(capsys):
    from transformerkit.cli import build_parser
    from transformerkit.cli.common import options_of
    from transformerkit.decoding.options import SearchOptions

    for command in ("translate", "evaluate"):
        args = build_parser().parse_args([command, "RUN"])  # the run's own, else these:
        assert options_of(args, SearchOptions) == SearchOptions()
        base = SearchOptions(stopping="heuristic", max_len_a=None)  # a run's search section
        assert options_of(args, SearchOptions, base) == base
        args = build_parser().parse_args([command, "RUN", "--stopping", "exact", "--max-len-a",
                                     "none", "--max-len-b", "none"])
        assert (args.stopping, args.max_len_a, args.max_len_b) == ("exact", None, None)
        for bad in (["--stopping", "soon"], ["--max-len-a", "x"], ["--max-len-b", "1.5"]):
            with pytest.raises(SystemExit):
                build_parser().parse_args([command, "RUN", *bad])
    assert "expected an integer or none, got '1.5'" in capsys.readouterr().err


# -- the loops' bookkeeping: keras.ops or torch's kernels (decoding/loop_ops.py) ----------------

torch_only = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="TorchLoopOps is the eager PyTorch loop's namespace")


@torch_only
def test_torch_loop_ops_equal_keras_ops():
    from transformerkit.decoding.loop_ops import TorchLoopOps

    xp, rng = TorchLoopOps(), np.random.default_rng(0)
    a = rng.normal(size=(4, 6)).astype("float32")
    a[1, 2:] = -np.inf
    ids = rng.integers(0, 50, size=(4, 6)).astype("int32")
    rows = np.array([3, 0, 0, 2], "int32")
    flags, other = a > 0, rng.normal(size=(4, 6)) > 0
    cases = [
        ("convert_to_tensor", (a,), {}), ("convert_to_tensor", (rows, "int32"), {}),
        ("cast", (ids, "float32"), {}), ("cast", (7, "float32"), {}),
        ("full", ((2, 3), -np.inf, "float32"), {}), ("zeros", ((2, 3), "int32"), {}),
        ("arange", (5,), {"dtype": "int32"}), ("arange", (2, 7), {"dtype": "int32"}),
        ("reshape", (ids, (-1,)), {}), ("expand_dims", (rows, 1), {}),
        ("squeeze", (ids[:, :1], 1), {}),
        ("concatenate", ([a, a[:, :2]],), {"axis": 1}), ("take", (ids, rows), {"axis": 0}),
        ("take", (a, rows), {"axis": 1}), ("take", (ids.reshape(-1), rows[:, None]), {"axis": 0}),
        ("slice_update", (ids, [0, 4], ids[:, :2] + 100), {}),
        ("repeat", (rows, 3), {"axis": 0}), ("where", (flags, a, -1.0), {}),
        ("top_k", (np.where(np.isinf(a), -np.inf, a), 3), {}),
        ("min", (a, 1), {}), ("max", (a, 1), {}), ("all", (flags,), {}),
        ("floor_divide", (ids, 7), {}), ("mod", (ids, 7), {}), ("equal", (ids, 3), {}),
        ("less", (ids, 20), {}), ("greater", (a, 0.5), {}), ("greater_equal", (5, rows), {}),
        ("logical_and", (flags, other), {}), ("logical_or", (flags, other), {}),
        ("logical_not", (flags,), {}),
    ]
    import torch

    for name, args, kwargs in cases:
        as_torch = [torch.as_tensor(x) if isinstance(x, np.ndarray) else
                    [torch.as_tensor(y) for y in x] if isinstance(x, list) and
                    isinstance(x[0], np.ndarray) else x for x in args]
        expected = keras.tree.flatten(getattr(ops, name)(*args, **kwargs))
        found = keras.tree.flatten(getattr(xp, name)(*as_torch, **kwargs))
        for e, f in zip(expected, found, strict=True):
            e, f = ops.convert_to_numpy(e), f.numpy()
            assert e.shape == f.shape and e.dtype.kind == f.dtype.kind, (name, e, f)
            np.testing.assert_array_equal(e, f, err_msg=name)


@torch_only
@pytest.mark.parametrize("drop_finished", [True, False])
def test_beam_search_is_the_same_with_either_loop_namespace(monkeypatch, trained_model,
                                                            drop_finished):
    """The whole search with its bookkeeping in ``keras.ops`` and in torch's kernels: the
    same hypotheses, scores and log-probabilities, for both stopping rules, n-best lists,
    length caps, a minimum length and a length penalty."""
    from transformerkit.decoding import beam
    from transformerkit.decoding.loop_ops import TorchLoopOps

    model, sources = trained_model
    searches = [dict(beam_size=4, n_best=4, stopping="exact"),
                dict(beam_size=3, n_best=2, stopping="early", alpha=1.5, max_len_a=1.0,
                     max_len_b=1),
                dict(beam_size=2, min_new_tokens=5, max_new_tokens=9)]
    for options in searches:
        found = {}
        for name, namespace in (("torch", TorchLoopOps), ("keras", lambda: ops)):
            monkeypatch.setattr(beam, "loop_ops", namespace)
            found[name] = beam_translate(model, sources, drop_finished=drop_finished, **options)
        for x, y in zip(found["torch"], found["keras"], strict=True):
            # exact: the model's steps are the same kernels, the bookkeeping only moves them
            assert [h.ids for h in x] == [h.ids for h in y]
            assert [h.finished for h in x] == [h.finished for h in y]
            assert [h.score for h in x] == [h.score for h in y]
            assert [h.log_prob for h in x] == [h.log_prob for h in y]
