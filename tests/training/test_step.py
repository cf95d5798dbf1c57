"""The training step (``transformerkit.training.step``): attached to a model, not saved with
it, and its gradient exchange called between the backward pass and ``optimizer.apply`` on
both of its paths. The step's numbers are tested in ``test_fast_paths.py`` (the PyTorch
shortcut against Keras' step), ``test_accumulation.py`` (the accumulation weighting) and
``test_multiprocess.py`` (the exchange between processes)."""

import keras
import numpy as np
import pytest

from transformerkit import fastpath
from transformerkit.models import GPT
from transformerkit.saving import load_model
from transformerkit.training import MaskedCrossEntropy, TrainStep, attach_train_step

SMALL = dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=12, dropout=0.0)


def batch(seed=0):
    x = np.random.default_rng(seed).integers(1, 30, (4, 10)).astype("int32")
    x[1, 6:] = 0  # a padded row
    return x[:, :-1], x[:, 1:]


def compiled_gpt(seed=3):
    keras.utils.set_random_seed(seed)
    model = GPT(30, **SMALL)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=MaskedCrossEntropy(0.1))
    return model


def test_without_a_step_fit_is_keras_own_and_attaching_one_takes_over(monkeypatch):
    """A compiled model fits with Keras' own ``train_step`` (tests/models/test_plain_keras.py
    runs it as a user does); once a step is attached, ``fit`` runs the step's."""
    model = compiled_gpt()
    x, y = batch()
    assert np.isfinite(model.evaluate(x, y, verbose=0))
    assert np.isfinite(model.train_on_batch(x, y))
    step = attach_train_step(model)
    assert isinstance(step, TrainStep) and model.training_step is step
    calls = []
    original = TrainStep.train_step
    monkeypatch.setattr(TrainStep, "train_step",
                        lambda self, *args: calls.append(1) or original(self, *args))
    assert np.isfinite(model.train_on_batch(x, y))
    assert calls == [1]


def test_the_step_is_not_saved(tmp_path):
    """A ``.keras`` file holds the same config with a step attached; the loaded model has
    none until one is attached."""
    model = compiled_gpt()
    attach_train_step(model)
    model.train_on_batch(*batch())
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = load_model(path, compile=True)
    assert loaded.training_step is None
    assert loaded.get_config() == model.get_config()


class RecordingSync:
    """A gradient exchange of one process: returns the gradients unchanged, records calls."""

    replicas = 1

    def __init__(self):
        self.calls = []

    def __call__(self, grads, variables, optimizer):
        self.calls.append((len(grads), [v.path for v in variables], optimizer))
        return grads


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the exchange is PyTorch's")
@pytest.mark.parametrize("fast", [True, False], ids=["shortcut", "keras-step"])
def test_the_exchange_runs_before_the_update_and_changes_no_number(monkeypatch, fast):
    """With an exchange that returns the gradients unchanged the step trains exactly as
    without one: on the PyTorch shortcut, and with the shortcuts off (then the step is Keras'
    own PyTorch step with the exchange inserted, against Keras' step itself)."""
    monkeypatch.setattr(fastpath, "ENABLED", fast)
    x, y = batch()
    synced, plain = compiled_gpt(), compiled_gpt()
    sync = RecordingSync()
    attach_train_step(synced, gradient_sync=sync)
    attach_train_step(plain)
    for seed in range(3):
        x, y = batch(seed)
        assert float(synced.train_on_batch(x, y)) == float(plain.train_on_batch(x, y))
    for a, b in zip(synced.weights, plain.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a),
                                      keras.ops.convert_to_numpy(b), err_msg=a.path)
    weights = [v.path for v in synced.trainable_weights]
    assert [(n, paths, opt) for n, paths, opt in sync.calls] == \
        [(len(weights), weights, synced.optimizer)] * 3
