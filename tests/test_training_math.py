"""Masked loss and accuracy against hand computations, inside and outside ``model.fit``;
the paper's learning-rate schedule and optimizer."""

import math

import keras
import numpy as np
import pytest
from reference import cross_entropy_per_token, to_numpy

from transformerkit.models import GPT
from transformerkit.training import (
    MaskedAccuracy,
    MaskedCrossEntropy,
    TransformerSchedule,
    masked_cross_entropy,
    paper_optimizer,
)

LABELS = np.array([[3, 1, 4, 0, 0], [2, 0, 0, 0, 0], [1, 2, 3, 4, 1]])


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
    assert got == pytest.approx(_hand_loss(LABELS, logits, label_smoothing), rel=1e-5)


def test_masked_cross_entropy_by_hand_for_one_token():
    logits = np.log(np.array([[[0.5, 0.25, 0.25]]], "float32"))
    assert float(to_numpy(masked_cross_entropy(np.array([[1]]), logits))) == \
        pytest.approx(math.log(4), rel=1e-6)
    # smoothing eps = 0.3 over V = 3: target = 0.7 onehot + 0.1 everywhere
    expected = -(0.8 * math.log(0.25) + 0.1 * math.log(0.5) + 0.1 * math.log(0.25))
    assert float(to_numpy(masked_cross_entropy(np.array([[1]]), logits, 0.3))) == \
        pytest.approx(expected, rel=1e-6)


def test_masked_cross_entropy_ignores_padding_amount_and_values(logits, rng):
    base = float(to_numpy(masked_cross_entropy(LABELS, logits)))
    more_padding = np.pad(LABELS, [(0, 0), (0, 4)])
    more_logits = np.concatenate([logits, rng.normal(size=(3, 4, 6)).astype("float32")], 1)
    assert float(to_numpy(masked_cross_entropy(more_padding, more_logits))) == \
        pytest.approx(base, rel=1e-6)
    other = logits.copy()
    other[LABELS == 0] = 100.0  # anything at padding positions
    assert float(to_numpy(masked_cross_entropy(LABELS, other))) == pytest.approx(base, rel=1e-6)


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


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_compiled_loss_equals_the_function(label_smoothing):
    model, ids, labels = _model_and_data()
    expected = float(to_numpy(masked_cross_entropy(labels, model(ids), label_smoothing)))
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=MaskedCrossEntropy(label_smoothing=label_smoothing))
    evaluated = model.evaluate(ids, labels, batch_size=len(ids), verbose=0)
    assert evaluated == pytest.approx(expected, rel=1e-6)
    # fit reports the loss of the forward pass before its (single) update
    history = model.fit(ids, labels, batch_size=len(ids), epochs=1, shuffle=False, verbose=0)
    assert history.history["loss"][0] == pytest.approx(expected, rel=1e-6)
    assert float(to_numpy(masked_cross_entropy(labels, model(ids), label_smoothing))) != \
        pytest.approx(expected, rel=1e-6)  # the update happened


def test_compiled_loss_is_not_reweighted_by_a_keras_mask():
    """Logits carry no Keras mask, so ``Loss.__call__`` cannot reduce a second time."""
    model, ids, labels = _model_and_data()
    assert keras.src.backend.get_keras_mask(model(ids)) is None
    loss = MaskedCrossEntropy()
    expected = masked_cross_entropy(labels, model(ids))
    np.testing.assert_allclose(to_numpy(loss(labels, model(ids))), to_numpy(expected), rtol=1e-6)


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
    assert float(to_numpy(metric.result())) == pytest.approx(3 / 5)  # not (3/4 + 0) / 2
    metric.reset_state()
    assert float(to_numpy(metric.result())) == 0.0


def test_masked_accuracy_in_evaluate_over_several_batches():
    model, ids, labels = _model_and_data()
    predicted = to_numpy(keras.ops.argmax(model(ids), axis=-1))
    real = labels != 0
    expected = (predicted == labels)[real].sum() / real.sum()
    model.compile(loss=MaskedCrossEntropy(), metrics=[MaskedAccuracy()])
    result = model.evaluate(ids, labels, batch_size=3, verbose=0, return_dict=True)
    assert result["masked_accuracy"] == pytest.approx(expected, rel=1e-6)


def test_masked_accuracy_with_per_sequence_sample_weight():
    metric = MaskedAccuracy()
    labels = np.array([[1, 2, 0], [3, 1, 1]])
    predicted = np.array([[1, 1, 0], [3, 1, 1]])
    metric.update_state(labels, np.eye(4, dtype="float32")[predicted],
                        sample_weight=np.array([1.0, 0.0]))
    assert float(to_numpy(metric.result())) == pytest.approx(1 / 2)


# -- schedule and optimizer ------------------------------------------------------------------


def _paper_rate(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize("iterations", [0, 1, 99, 3999, 4000, 10000, 100000])
def test_schedule_matches_paper_formula(iterations):
    schedule = TransformerSchedule(512, warmup_steps=4000)
    # Keras passes the optimizer's iteration count (0 for the first update); step = it + 1
    got = float(to_numpy(schedule(iterations)))
    assert got == pytest.approx(_paper_rate(iterations + 1, 512, 4000), rel=1e-5)


def test_schedule_peak_scale_and_config():
    schedule = TransformerSchedule(256, warmup_steps=100, scale=2.0)
    rates = [float(to_numpy(schedule(i))) for i in range(300)]
    assert int(np.argmax(rates)) == 99  # step 100 == warmup
    assert max(rates) == pytest.approx(2.0 * (256 * 100) ** -0.5, rel=1e-5)
    clone = TransformerSchedule.from_config(schedule.get_config())
    assert clone.get_config() == {"d_model": 256, "warmup_steps": 100, "scale": 2.0}
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert float(to_numpy(restored(7))) == pytest.approx(rates[7], rel=1e-6)


def test_paper_optimizer():
    optimizer = paper_optimizer(512, warmup_steps=4000)
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(optimizer._learning_rate, TransformerSchedule)
    assert float(to_numpy(optimizer.learning_rate)) == \
        pytest.approx(_paper_rate(1, 512, 4000), rel=1e-5)
    variable = keras.Variable(np.ones(3, "float32"))
    optimizer.apply_gradients([(keras.ops.ones(3), variable)])
    assert float(to_numpy(optimizer.learning_rate)) == \
        pytest.approx(_paper_rate(2, 512, 4000), rel=1e-5)
