"""Long runs: checkpoints inside an epoch and exact resume from them, checkpoint averaging,
early stopping (in-process, tiny model; the SIGKILL test runs the CLI, marked slow).

Tolerances (``tests/support/tolerances.py``): a resumed run repeats the same float32 steps (the same
kernels, batches, order and RNG state), so its weights equal the uninterrupted run's, bit
for bit; the averaged checkpoint is the float64 mean rounded to float32 once. Mutations
tried by hand for the slow SIGKILL test: none (its check is exact equality, which any
change of the resumed state breaks).
"""

import json
import os

import numpy as np
import pytest
import tolerances as tol
from kill_and_resume import assert_killed_run_resumes_exactly
from tiny_run import tiny_config, write_corpus

from transformerkit.config import ConfigError, resolve
from transformerkit.run_directory import CheckpointDirectory, RunDirectory
from transformerkit.saving import load_model
from transformerkit.training.averaging import average_checkpoints
from transformerkit.training.trainer import train


def _config(folder, **train_keys):
    # dropout 0.1: so that the dropout RNG state matters on resume
    return tiny_config(folder, **train_keys).replace(model={"dropout": 0.1})


def _weights(path):
    return [np.asarray(w) for w in load_model(path).get_weights()]


def test_checkpoint_names_order_by_position(tmp_path):
    folder = CheckpointDirectory(tmp_path)
    names = ["epoch-0001.keras", "epoch-0001-batch-0000004.keras", "epoch-0000-batch-0000010.keras",
             "epoch-0002.keras", "best.keras"]
    for name in names:
        (tmp_path / name).write_text("x")
    assert folder.epoch_names() == ["epoch-0000-batch-0000010.keras", "epoch-0001.keras",
                                    "epoch-0001-batch-0000004.keras", "epoch-0002.keras"]
    assert folder.position_name(1, 4) == "epoch-0001-batch-0000004.keras"
    assert folder.position_name(3, 0) == folder.epoch_name(3)
    assert (folder.epoch_of("epoch-0001-batch-0000004.keras"),
            folder.batch_of("epoch-0001-batch-0000004.keras")) == (1, 4)


def test_resume_inside_an_epoch_is_exact(tmp_path):
    """Straight 2 epochs == stopped by max_steps inside epoch 2 (a checkpoint there), then
    --resume to the end: the same weights, bit for bit (position, optimizer, dropout RNG)."""
    straight = tmp_path / "straight"
    train(_config(tmp_path, checkpoint_every=2, checkpoints_to_keep=10), straight)

    stopped = tmp_path / "stopped"
    # max_steps stands for an interruption here: no cooldown towards it
    metrics = train(_config(tmp_path, checkpoint_every=2, checkpoints_to_keep=10, max_steps=8,
                            cooldown=0), stopped)
    assert metrics["stopped_by"] == "max_steps" and metrics["steps"] == 8
    state = json.loads((stopped / "checkpoints" / "latest.json").read_text())
    assert (state["epoch"], state["batch"], state["step"]) == (1, 2, 8)  # 6 batches per epoch
    assert state["checkpoint"] == "epoch-0001-batch-0000002.keras"
    os.remove(stopped / "model.keras")
    resumed = train(_config(tmp_path, checkpoint_every=2, checkpoints_to_keep=10), stopped,
                    resume=True)
    assert resumed["steps"] == 12
    for a, b in zip(_weights(straight / "model.keras"), _weights(stopped / "model.keras"),
                    strict=True):  # exact: the same steps, kernels and order, resumed
        np.testing.assert_array_equal(a, b)
    # the mid-epoch checkpoints of both runs are the same files' weights
    for name in ("epoch-0000-batch-0000002.keras", "epoch-0001-batch-0000004.keras"):
        for a, b in zip(_weights(straight / "checkpoints" / name),
                        _weights(stopped / "checkpoints" / name), strict=True):  # exact, as above
            np.testing.assert_array_equal(a, b)


def test_a_stop_at_an_epochs_end_resumes_exactly(tmp_path):
    """max_steps at the last batch of epoch 1 (6 batches per epoch), then --resume: the
    weights of the straight run, bit for bit. Keras' data iterator draws from the global
    RNG when an epoch runs out; a stop that cut the epoch short of that left the saved
    state one draw behind the straight run's (StopConditions stops at the epoch's end)."""
    straight = tmp_path / "straight"
    train(_config(tmp_path), straight)
    stopped = tmp_path / "stopped"
    metrics = train(_config(tmp_path, max_steps=6, cooldown=0), stopped)  # an interruption
    assert metrics["stopped_by"] == "max_steps" and metrics["steps"] == 6
    state = json.loads((stopped / "checkpoints" / "latest.json").read_text())
    assert (state["epoch"], state["batch"]) == (1, 0)
    os.remove(stopped / "model.keras")
    assert train(_config(tmp_path), stopped, resume=True)["steps"] == 12
    for a, b in zip(_weights(straight / "model.keras"), _weights(stopped / "model.keras"),
                    strict=True):  # exact: the same steps, kernels and order, resumed
        np.testing.assert_array_equal(a, b)


def test_an_interrupted_run_resumes_its_cooldown_exactly(tmp_path, monkeypatch):
    """A run of max_steps 12 cools its rate down to zero over its last fifth; interrupted
    after update 9 (an exception out of ``train``, as a kill leaves it: the checkpoint of
    update 8 kept) and resumed, it ends with the straight run's weights and rate, bit for
    bit."""
    from transformerkit.training import callbacks

    straight = tmp_path / "straight"
    config = _config(tmp_path, checkpoint_every=2, checkpoints_to_keep=10, max_steps=12)
    done = train(config, straight)
    assert done["cooldown_end"] == 12 and done["final_learning_rate"] == 0.0
    assert done["cooldown_start"] == 10  # round(0.8 * 12)

    class Killed(Exception):
        pass

    batch_end = callbacks.StopConditions.on_train_batch_end

    def interrupt(self, batch, logs=None):
        batch_end(self, batch, logs)
        if callbacks.optimizer_steps(self.model.optimizer) == 9:
            raise Killed

    stopped = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        patch.setattr(callbacks.StopConditions, "on_train_batch_end", interrupt)
        with pytest.raises(Killed):
            train(config, stopped)
    assert json.loads((stopped / "checkpoints" / "latest.json").read_text())["step"] == 8
    resumed = train(config, stopped, resume=True)
    assert (resumed["steps"], resumed["final_learning_rate"]) == (12, 0.0)
    for a, b in zip(_weights(straight / "model.keras"), _weights(stopped / "model.keras"),
                    strict=True):  # exact: the same rates, steps and order, resumed
        np.testing.assert_array_equal(a, b)


def test_average_is_the_float64_mean_of_the_checkpoints(tmp_path):
    run = tmp_path / "run"
    metrics = train(_config(tmp_path, checkpoint_every=2, checkpoints_to_keep=4,
                            average_last=3), run)
    names = CheckpointDirectory(run / "checkpoints").epoch_names()
    assert len(names) == 4 and metrics["averaged"]["checkpoints"] == names[-3:]
    files = [_weights(run / "checkpoints" / n) for n in names[-3:]]
    averaged = load_model(RunDirectory(run).averaged)
    for i, variable in enumerate(averaged.weights):
        got = np.asarray(variable)
        if np.issubdtype(got.dtype, np.floating):
            expected = np.mean([f[i].astype("float64") for f in files], axis=0)
            # the float64 mean rounded to float32 once: u |mean|
            tol.assert_within(got, expected, tol.U32 * np.abs(expected), err_msg=variable.path)
    # the CLI command writes the same average elsewhere; the run loads it by name
    out, paths = average_checkpoints(run, 3, out=tmp_path / "avg.keras")
    for a, b in zip(_weights(out), [np.asarray(w) for w in averaged.weights], strict=True):
        np.testing.assert_array_equal(a, b)  # exact: the same float64 sums of the same files
    from transformerkit import load

    assert load(run, checkpoint="averaged").model.count_params() == averaged.count_params()
    assert load(run, checkpoint=names[-1]).model.count_params() == averaged.count_params()


def test_average_errors(tmp_path):
    run = tmp_path / "run"
    train(_config(tmp_path, checkpoints_to_keep=2), run)
    with pytest.raises(FileNotFoundError, match="2 checkpoint.*fewer than the 5"):
        average_checkpoints(run, 5)
    # a checkpoint of another model (another d_model) among them
    other = tmp_path / "other"
    config = _config(tmp_path, epochs=1)
    config = config.replace(model={"d_model": 8, "d_ff": 16})
    train(config, other)
    os.replace(other / "checkpoints" / "epoch-0001.keras", run / "checkpoints" / "epoch-0003.keras")
    with pytest.raises(ValueError, match="shape"):
        average_checkpoints(run, 2)


def test_average_cli(tmp_path):
    run = tmp_path / "run"
    train(_config(tmp_path, checkpoints_to_keep=2), run)
    from transformerkit.cli import main

    assert main(["average", str(run), "--last", "2"]) == 0
    assert os.path.exists(RunDirectory(run).averaged)
    assert main(["average", str(run), "--last", "3"]) != 0


def test_early_stopping_stops_and_keeps_the_best(tmp_path):
    """A learning rate of 0 never improves val_loss after the first evaluation: patience 2
    stops after epoch 3 of 10."""
    config = _config(tmp_path, epochs=10, patience=2, learning_rate=1e-12)
    config = config.replace(data={"val_source": config.data.train_source,
                                  "val_target": config.data.train_target})
    metrics = train(config, tmp_path / "run")
    assert metrics["stopped_by"] == "early_stopping"
    state = json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())
    assert state["epoch"] <= 4 and state["wait"] == 2 and state["monitor"] == "val_loss"


def test_early_stopping_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="bleu_every"):
        resolve({"train": {"patience": 2, "early_stopping_metric": "val_bleu"}})
    with pytest.raises(ConfigError, match="early_stopping_metric"):
        resolve({"train": {"early_stopping_metric": "bleu"}})
    with pytest.raises(ConfigError, match="checkpoints_to_keep >= 5"):
        resolve({"train": {"average_last": 5}})
    with pytest.raises(ValueError, match="patience needs validation"):
        train(_config(tmp_path, patience=1), tmp_path / "run")


@pytest.mark.slow
def test_sigkill_inside_an_epoch_resumes_exactly(tmp_path):
    """`transformerkit train` SIGKILLed once a mid-epoch checkpoint exists, then --resume:
    the final weights equal an uninterrupted run's."""
    config = _config(tmp_path, epochs=2, checkpoint_every=1, checkpoints_to_keep=3)
    # a corpus of 240 pairs: 60 batches per epoch; step 70 is inside epoch 2
    src, tgt = write_corpus(tmp_path, pairs=240)
    config = config.replace(data={"train_limit": None, "train_source": src,
                                  "train_target": tgt})
    assert_killed_run_resumes_exactly(config, tmp_path, kill_after_step=70, seconds=120)
