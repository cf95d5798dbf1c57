"""Masked loss and accuracy against hand computations, inside and outside ``model.fit``;
the paper's learning-rate schedule and optimizer.

Tolerances (``tests/support/tolerances.py``): a float32 loss against the float64 reference
within the cross-entropy's rounding bound on the log-probabilities' size; the compiled loss
against the function (two float32 forward passes) within two model bounds; accuracies are
integer counts and one float32 division; the schedule is a few float32 roundings of eq. 3.
The power check
plants the schedule's step off by one (``iterations`` for ``iterations + 1``): at step 1e5
it moves the rate by 5e-6 relative, which the old ``rel=1e-5`` let pass.
"""

import math

import keras
import numpy as np
import pytest
import tolerances as tol
from keras import ops
from reference import cross_entropy_per_token, to_numpy

from transformerkit.models import GPT
from transformerkit.training import (
    MaskedAccuracy,
    MaskedCrossEntropy,
    TransformerSchedule,
    attach_train_step,
    masked_cross_entropy,
    paper_optimizer,
)

LABELS = np.array([[3, 1, 4, 0, 0], [2, 0, 0, 0, 0], [1, 2, 3, 4, 1]])
# eq. 3 in float32: rsqrt, d_model^-0.5 and warmup^-1.5 rounded to float32, two products
SCHEDULE_ROUNDINGS = tol.ELEMENTWISE_ULPS + 4


def log_probs_size(logits):
    """Largest |log softmax| (float64): the size of the terms the loss's roundings act on."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return np.abs(shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))).max()


def loss_atol(labels, logits, paths=1, forward_roundings=0):
    """Bound of a float32 masked cross-entropy of ``logits`` (after ``forward_roundings``
    computing them): the loss's roundings on terms of the size of the log-probabilities and
    logits (label smoothing averages all of them)."""
    size = max(log_probs_size(logits), float(np.abs(logits).max()))
    roundings = forward_roundings + tol.cross_entropy_roundings(
        np.shape(logits)[-1], int(np.count_nonzero(labels)))
    return tol.chain_atol(roundings, size, paths)


@pytest.fixture
def logits(rng):
    return (rng.normal(size=(3, 5, 6)) * 3).astype("float32")


def _hand_loss(labels, logits, label_smoothing=0.0):
    per_token = cross_entropy_per_token(labels, logits, label_smoothing)
    real = labels != 0
    return per_token[real].sum() / real.sum()


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.5])
def test_masked_cross_entropy_is_token_mean_over_real_tokens(logits, label_smoothing):
    got = float(to_numpy(masked_cross_entropy(LABELS, logits, label_smoothing)))
    tol.assert_within(got, _hand_loss(LABELS, logits, label_smoothing),
                      loss_atol(LABELS, logits))


def test_masked_cross_entropy_by_hand_for_one_token():
    logits = np.log(np.array([[[0.5, 0.25, 0.25]]], "float32"))
    atol = loss_atol([[1]], logits, forward_roundings=1)  # 1: the logits rounded to float32
    tol.assert_within(float(to_numpy(masked_cross_entropy(np.array([[1]]), logits))),
                      math.log(4), atol)
    # smoothing eps = 0.3 over V = 3: target = 0.7 onehot + 0.1 everywhere
    expected = -(0.8 * math.log(0.25) + 0.1 * math.log(0.5) + 0.1 * math.log(0.25))
    tol.assert_within(float(to_numpy(masked_cross_entropy(np.array([[1]]), logits, 0.3))),
                      expected, atol)


def test_masked_cross_entropy_ignores_padding_amount_and_values(logits, rng):
    base = float(to_numpy(masked_cross_entropy(LABELS, logits)))
    more_padding = np.pad(LABELS, [(0, 0), (0, 4)])
    more_logits = np.concatenate([logits, rng.normal(size=(3, 4, 6)).astype("float32")], 1)
    # another shape: the sum over positions may run in another order (two float32 paths)
    tol.assert_within(float(to_numpy(masked_cross_entropy(more_padding, more_logits))), base,
                      loss_atol(LABELS, logits, paths=2))
    other = logits.copy()
    other[LABELS == 0] = 100.0  # anything at padding positions
    # exact: the same shape and kernels, the same real terms, padding terms exactly 0
    assert float(to_numpy(masked_cross_entropy(LABELS, other))) == base


def test_masked_cross_entropy_of_all_padding_is_zero(logits):
    assert float(to_numpy(masked_cross_entropy(np.zeros((3, 5), "int32"), logits))) == 0.0


def _model_and_data():
    ids = np.array([[3, 4, 5, 6, 0, 0], [7, 8, 9, 0, 0, 0], [1, 2, 3, 4, 5, 6],
                    [9, 0, 0, 0, 0, 0]])
    labels = np.array([[4, 5, 6, 0, 0, 0], [8, 9, 0, 0, 0, 0], [2, 3, 4, 5, 6, 7],
                       [0, 0, 0, 0, 0, 0]])
    model = GPT(12, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8)
    model(ids)
    return model, ids, labels


def _forward_loss_atol(model, ids, labels, logits):
    """Two float32 paths (``evaluate``/``fit`` and a direct call), each a forward pass of the
    model and the loss."""
    return loss_atol(labels, logits, paths=2,
                     forward_roundings=tol.model_roundings(model, target_len=ids.shape[1]))


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_compiled_loss_equals_the_function(label_smoothing):
    model, ids, labels = _model_and_data()
    logits = to_numpy(model(ids))
    expected = float(to_numpy(masked_cross_entropy(labels, logits, label_smoothing)))
    atol = _forward_loss_atol(model, ids, labels, logits)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=MaskedCrossEntropy(label_smoothing=label_smoothing))
    attach_train_step(model)
    evaluated = model.evaluate(ids, labels, batch_size=len(ids), verbose=0)
    tol.assert_within(evaluated, expected, atol)
    # fit reports the loss of the forward pass before its (single) update
    history = model.fit(ids, labels, batch_size=len(ids), epochs=1, shuffle=False, verbose=0)
    tol.assert_within(history.history["loss"][0], expected, atol)
    after = float(to_numpy(masked_cross_entropy(labels, model(ids), label_smoothing)))
    assert abs(after - expected) > atol  # the update happened


def test_compiled_loss_is_not_reweighted_by_a_keras_mask():
    """Logits carry no Keras mask, so ``Loss.__call__`` cannot reduce a second time."""
    model, ids, labels = _model_and_data()
    assert keras.src.backend.get_keras_mask(model(ids)) is None
    loss = MaskedCrossEntropy()
    expected = masked_cross_entropy(labels, model(ids))
    # exact: the same function on logits of the same kernels; a "sum" of a scalar is itself
    np.testing.assert_array_equal(to_numpy(loss(labels, model(ids))), to_numpy(expected))


def test_masked_cross_entropy_loss_config_round_trip():
    loss = MaskedCrossEntropy(label_smoothing=0.2)
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(clone, MaskedCrossEntropy) and clone.label_smoothing == 0.2


def test_masked_accuracy_counts_tokens_across_batches():
    metric = MaskedAccuracy()
    # batch 1: 4 real tokens, 3 right; batch 2: 1 real token, 0 right
    labels_1 = np.array([[1, 2, 0], [3, 1, 0]])
    predicted_1 = np.array([[1, 2, 2], [3, 2, 1]])
    labels_2 = np.array([[2, 0, 0]])
    predicted_2 = np.array([[1, 2, 2]])
    for labels, predicted in ((labels_1, predicted_1), (labels_2, predicted_2)):
        metric.update_state(labels, np.eye(4, dtype="float32")[predicted])
    # counts are exact in float32, the result is one float32 division
    assert float(to_numpy(metric.result())) == pytest.approx(3 / 5, rel=tol.relative(1))
    metric.reset_state()
    assert float(to_numpy(metric.result())) == 0.0


def test_masked_accuracy_in_evaluate_over_several_batches():
    model, ids, labels = _model_and_data()
    predicted = to_numpy(keras.ops.argmax(model(ids), axis=-1))
    real = labels != 0
    expected = (predicted == labels)[real].sum() / real.sum()
    model.compile(loss=MaskedCrossEntropy(), metrics=[MaskedAccuracy()])
    result = model.evaluate(ids, labels, batch_size=3, verbose=0, return_dict=True)
    # integer counts over the batches (exact in float32), one float32 division; the argmax of
    # evaluate's forward pass is the direct call's unless two logits tie within rounding
    assert result["masked_accuracy"] == pytest.approx(expected, rel=tol.relative(1))


def test_masked_accuracy_with_per_sequence_sample_weight():
    metric = MaskedAccuracy()
    labels = np.array([[1, 2, 0], [3, 1, 1]])
    predicted = np.array([[1, 1, 0], [3, 1, 1]])
    metric.update_state(labels, np.eye(4, dtype="float32")[predicted],
                        sample_weight=np.array([1.0, 0.0]))
    assert float(to_numpy(metric.result())) == 1 / 2  # exact: 1 / 2 in float32


# -- schedule and optimizer ------------------------------------------------------------------


def _paper_rate(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize("iterations", [0, 1, 99, 3999, 4000, 10000, 100000])
def test_schedule_matches_paper_formula(iterations):
    schedule = TransformerSchedule(512, warmup_steps=4000)
    # Keras passes the optimizer's iteration count (0 for the first update); step = it + 1
    got = float(to_numpy(schedule(iterations)))
    assert got == pytest.approx(_paper_rate(iterations + 1, 512, 4000),
                                rel=tol.relative(SCHEDULE_ROUNDINGS))


def test_schedule_peak_scale_and_config():
    schedule = TransformerSchedule(256, warmup_steps=100, scale=2.0)
    rates = [float(to_numpy(schedule(i))) for i in range(300)]
    assert int(np.argmax(rates)) == 99  # step 100 == warmup
    assert max(rates) == pytest.approx(2.0 * (256 * 100) ** -0.5,
                                       rel=tol.relative(SCHEDULE_ROUNDINGS))
    clone = TransformerSchedule.from_config(schedule.get_config())
    assert clone.get_config() == {"d_model": 256, "warmup_steps": 100, "scale": 2.0}
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert float(to_numpy(restored(7))) == rates[7]  # exact: the same float32 operations


def test_paper_optimizer():
    optimizer = paper_optimizer(512, warmup_steps=4000)
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(optimizer._learning_rate, TransformerSchedule)
    assert float(to_numpy(optimizer.learning_rate)) == \
        pytest.approx(_paper_rate(1, 512, 4000), rel=tol.relative(SCHEDULE_ROUNDINGS))
    variable = keras.Variable(np.ones(3, "float32"))
    optimizer.apply_gradients([(keras.ops.ones(3), variable)])
    assert float(to_numpy(optimizer.learning_rate)) == \
        pytest.approx(_paper_rate(2, 512, 4000), rel=tol.relative(SCHEDULE_ROUNDINGS))


def test_tolerances_still_catch_a_schedule_off_by_one_step(monkeypatch):
    """The schedule evaluated at ``iterations`` instead of ``iterations + 1``: at step 1e5
    a relative change of 5e-6, beyond the schedule's rounding bound."""

    def off_by_one(self, step):
        step = ops.cast(step, "float32")  # the bug: no + 1.0
        return (self.scale * self.d_model ** -0.5
                * ops.minimum(ops.rsqrt(step), step * self.warmup_steps ** -1.5))

    monkeypatch.setattr(TransformerSchedule, "__call__", off_by_one)
    tol.assert_caught(test_schedule_matches_paper_formula, 100000)


# -- bad arguments: clear errors naming the value ---------------------------------------------

@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_label_smoothing_out_of_range(value):
    labels, logits = np.array([[1, 2]]), np.zeros((1, 2, 4), "float32")
    with pytest.raises(ValueError, match=rf"label_smoothing must be in \[0, 1\), got {value}"):
        masked_cross_entropy(labels, logits, label_smoothing=value)
    with pytest.raises(ValueError, match=rf"label_smoothing must be in \[0, 1\), got {value}"):
        MaskedCrossEntropy(label_smoothing=value)


def test_bad_warmup():
    with pytest.raises(ValueError, match=r"warmup_steps must be >= 1, got 0"):
        TransformerSchedule(512, warmup_steps=0)
