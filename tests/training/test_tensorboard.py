"""``training/tensorboard.py``: per-epoch scalars written without TensorFlow, read back with
TensorBoard's own ``EventAccumulator``."""

import glob
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tolerances as tol

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from transformerkit.training.tensorboard import TensorBoardScalars  # noqa: E402


class FakeBleu(keras.callbacks.Callback):
    """Adds ``val_bleu`` to the epoch logs the way ``training/monitors.py`` does."""

    def on_epoch_end(self, epoch, logs=None):
        logs["val_bleu"] = 10.0 + epoch


class FailAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise FloatingPointError("simulated crash")


def tiny_fit(log_dir, epochs=3, extra=()):
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)
    model.compile(keras.optimizers.Adam(schedule),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callback = TensorBoardScalars(log_dir)
    history = model.fit(x, y, batch_size=16, epochs=epochs, validation_data=(x[:8], y[:8]),
                        callbacks=[*extra, FakeBleu(), callback], verbose=0)
    return model, history.history, callback


def scalars(directory):
    accumulator = EventAccumulator(str(directory))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def test_scalars_equal_the_epoch_logs(tmp_path):
    model, history, callback = tiny_fit(tmp_path / "logs")
    train, validation = scalars(tmp_path / "logs/train"), scalars(tmp_path / "logs/validation")
    assert set(train) == {"epoch_loss", "epoch_accuracy", "epoch_learning_rate"}
    assert set(validation) == {"epoch_loss", "epoch_accuracy", "epoch_bleu"}
    for name in ("loss", "accuracy"):
        assert [s for s, _ in train[f"epoch_{name}"]] == [0, 1, 2]
        # exact: the float32 values of the epoch logs, written and read back as float32
        np.testing.assert_array_equal([v for _, v in train[f"epoch_{name}"]], history[name])
        np.testing.assert_array_equal([v for _, v in validation[f"epoch_{name}"]],
                                      history[f"val_{name}"])
    assert [v for _, v in validation["epoch_bleu"]] == [10.0, 11.0, 12.0]
    # ExponentialDecay(0.05, 2, 0.5) after 2, 4, 6 optimizer steps (2 batches per epoch)
    # float32: 0.05 rounded, step / decay_steps, the power and the product
    np.testing.assert_allclose([v for _, v in train["epoch_learning_rate"]],
                               [0.025, 0.0125, 0.00625],
                               rtol=tol.relative(tol.ELEMENTWISE_ULPS + 3))
    assert callback._writers == {}  # closed on train end
    assert sorted(os.listdir(tmp_path / "logs")) == ["train", "validation"]


def test_a_second_fit_adds_event_files(tmp_path):
    tiny_fit(tmp_path / "logs", epochs=1)
    tiny_fit(tmp_path / "logs", epochs=1)
    assert len(glob.glob(str(tmp_path / "logs/train/events.out.tfevents.*"))) == 2


def test_a_crash_keeps_the_finished_epochs(tmp_path):
    with pytest.raises(FloatingPointError):
        tiny_fit(tmp_path / "logs", epochs=4, extra=[FailAt(2)])
    train = scalars(tmp_path / "logs/train")
    assert [s for s, _ in train["epoch_loss"]] == [0, 1]


def test_non_finite_values_are_skipped_and_tags_are_keras_ones(tmp_path):
    callback = TensorBoardScalars(tmp_path)
    callback.set_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
    callback.on_train_begin()
    callback.on_epoch_end(0, {"loss": float("nan"), "masked_accuracy": 0.5, "note": "x",
                              "epoch_seconds": 2.0, "val_loss": float("inf")})
    callback.on_train_end()
    assert scalars(tmp_path / "train") == {"epoch_masked_accuracy": [(0, 0.5)],
                                           "epoch_seconds": [(0, 2.0)]}
    assert not os.path.exists(tmp_path / "validation")


def test_writes_without_importing_tensorflow(tmp_path):
    code = (
        "import sys\n"
        "from transformerkit.training.tensorboard import TensorBoardScalars\n"
        f"c = TensorBoardScalars({str(tmp_path)!r})\n"
        "c.on_train_begin(); c.on_epoch_end(0, {'loss': 1.5, 'val_loss': 2.0}); c.on_train_end()\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
    )
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert scalars(tmp_path / "train") == {"epoch_loss": [(0, 1.5)]}
    assert scalars(tmp_path / "validation") == {"epoch_loss": [(0, 2.0)]}
