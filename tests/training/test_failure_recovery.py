"""Failures do not cost work: kills during checkpoint writes, corrupt files, NaN losses,
unwritable or full disks, and loading in Keras safe mode (nothing pickled).

(Exact resume after a SIGKILL between checkpoints is in ``tests/training/test_train_e2e.py``.)
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
import zipfile

import keras
import numpy as np
import pytest
from paths import SUPPORT_DIR
from tiny_run import tiny_config

from transformerkit.files import atomic_path
from transformerkit.models import GPT
from transformerkit.saving import load_model
from transformerkit.training import MaskedCrossEntropy
from transformerkit.training import trainer as trainer_module
from transformerkit.training.callbacks import RunCheckpoint, load_checkpoint
from transformerkit.training.trainer import train

WRITER = """
import json, os, sys
import transformerkit  # noqa: F401  (default backend before keras)
import keras
import numpy as np
from transformerkit.models import GPT
from transformerkit.training import MaskedCrossEntropy
from transformerkit.training.callbacks import RunCheckpoint, read_checkpoint_state

directory = sys.argv[1]
model = GPT(2000, num_layers=1, d_model=64, num_heads=4, d_ff=128, max_length=16)
model.compile(optimizer=keras.optimizers.Adam(), loss=MaskedCrossEntropy())
model.build(None)
model.optimizer.build(model.trainable_variables)
checkpoint = RunCheckpoint(directory, keep=2, monitor="loss")
checkpoint.set_model(model)
state = read_checkpoint_state(directory)
epoch = state.epoch if state else 0
print("ready", flush=True)
while True:  # every weight of checkpoint N is N: a loaded file shows which epoch it holds
    model.set_weights([np.full(w.shape, epoch + 1, "float32") for w in model.weights])
    checkpoint.on_epoch_end(epoch, {"loss": 1.0})
    epoch += 1
"""


def _tiny_model():
    model = GPT(30, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=8)
    model.compile(optimizer=keras.optimizers.Adam(), loss=MaskedCrossEntropy())
    model.build(None)
    model.optimizer.build(model.trainable_variables)
    return model


def _write_checkpoints(directory, epochs=2):
    model = _tiny_model()
    checkpoint = RunCheckpoint(str(directory), keep=2, monitor="loss")
    checkpoint.set_model(model)
    for epoch in range(epochs):
        model.set_weights([np.full(w.shape, epoch + 1, "float32") for w in model.weights])
        checkpoint.on_epoch_end(epoch, {"loss": 1.0})
    return directory


def _epoch_held(model):
    values = {float(v) for w in model.get_weights() for v in np.unique(w)}
    assert len(values) == 1, "a checkpoint mixes weights of two epochs"
    return int(values.pop())


# -- SIGKILL while checkpoints are written ----------------------------------------------------

def test_sigkill_during_checkpoint_writes_never_leaves_an_unreadable_latest(tmp_path):
    """A subprocess writes checkpoints back to back; it is killed at random moments (five
    times, resuming the numbering each time). After every kill the checkpoint named by
    latest.json loads without a fallback and holds exactly that epoch's weights."""
    directory = tmp_path / "checkpoints"
    rng = random.Random(0)
    leftovers = 0
    for _ in range(5):
        process = subprocess.Popen([sys.executable, "-c", WRITER, str(directory)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   cwd=SUPPORT_DIR)
        assert process.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 120
        while not (directory / "latest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.2, 1.5))
        process.send_signal(signal.SIGKILL)
        process.wait()
        leftovers += any(name.startswith(".tmp-") for name in os.listdir(directory))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback warning would fail the test
            model, state = load_checkpoint(str(directory))
        assert _epoch_held(model) == state.epoch
    assert state.epoch >= 5
    assert leftovers >= 1, "no kill landed inside a write; the test proved nothing"
    RunCheckpoint(str(directory))  # a new run removes the temporary files of killed writes
    assert not [n for n in os.listdir(directory) if n.startswith(".tmp-")]


# -- corrupt checkpoints: fall back to the previous one, with a warning -----------------------

def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_a_byte(path):  # same size, often still a valid zip: the sha256 tells
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte, os.remove])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage):
    directory = _write_checkpoints(tmp_path)
    damage(directory / "epoch-0002.keras")
    with pytest.warns(RuntimeWarning, match=r"falling back to checkpoint .*epoch-0001.keras"):
        model, state = load_checkpoint(str(directory))
    assert state.epoch == 1 and state.checkpoint == "epoch-0001.keras"
    assert _epoch_held(model) == 1


def test_unreadable_latest_json_falls_back_to_the_newest_epoch_file(tmp_path):
    directory = _write_checkpoints(tmp_path)
    (directory / "latest.json").write_text('{"epoch": 2, "checkpo')
    with pytest.warns(RuntimeWarning, match=r"latest.json.*unreadable"):
        model, state = load_checkpoint(str(directory))
    assert state.epoch == 2 and _epoch_held(model) == 2


def test_all_checkpoints_corrupt_is_a_clear_error(tmp_path):
    directory = _write_checkpoints(tmp_path)
    for name in ("epoch-0001.keras", "epoch-0002.keras"):
        _truncate(directory / name)
    with pytest.raises(ValueError, match=r"no readable checkpoint in .*epoch-0002.keras.*"
                                         r"truncated or corrupt"):
        load_checkpoint(str(directory))
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        load_checkpoint(str(tmp_path / "nothing"))


def test_resume_from_a_corrupt_newest_checkpoint_continues_from_the_previous(tmp_path):
    config = tiny_config(tmp_path, epochs=2)
    run = tmp_path / "run"
    train(config, run)
    os.remove(run / "model.keras")
    _truncate(run / "checkpoints" / "epoch-0002.keras")
    config = config.replace(train={"epochs": 3})
    with pytest.warns(RuntimeWarning, match="falling back to checkpoint .*epoch-0001"):
        metrics = train(config, run, resume=True)
    assert metrics["steps"] == 3 * 6  # 24 pairs in batches of 4: epochs 2 and 3 redone
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["epoch"] == 3


# -- corrupt or truncated model files: one clear error ----------------------------------------

@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.keras"
    _tiny_model().save(path)
    return path


def _rezip(source, target, replace):
    """Copy the zip ``source`` to ``target`` with some members replaced (None = dropped)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            data = replace.get(item.filename, old.read(item.filename))
            if data is not None:
                new.writestr(item, data)


CORRUPTIONS = {
    "empty": lambda src, dst: dst.write_bytes(b""),
    "truncated": lambda src, dst: dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2]),
    "garbage": lambda src, dst: dst.write_bytes(os.urandom(4096)),
    "bad_config": lambda src, dst: _rezip(src, dst, {"config.json": b"{not json"}),
    "no_weights": lambda src, dst: _rezip(src, dst, {"model.weights.h5": None}),
    "bad_weights": lambda src, dst: _rezip(src, dst, {"model.weights.h5": b"\x89HDF\r\n"}),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_corrupt_model_file_is_one_clear_error(model_file, tmp_path, corruption):
    bad = tmp_path / "model.keras"
    CORRUPTIONS[corruption](model_file, bad)
    with pytest.raises(ValueError, match=rf"{bad}.*(truncated or corrupt)"):
        load_model(bad)


def test_corrupt_model_keras_of_a_run_through_api_and_cli(tmp_path):
    import transformerkit

    run = tmp_path / "run"
    train(tiny_config(tmp_path, epochs=1), run)
    _truncate(run / "model.keras")
    with pytest.raises(ValueError, match=r"model.keras.*truncated or corrupt"):
        transformerkit.load(run)
    result = subprocess.run([sys.executable, "-m", "transformerkit.cli", "translate", str(run),
                             "ein zwei"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "model.keras" in result.stderr and "corrupt" in result.stderr
    assert "Traceback" not in result.stderr


# -- NaN / inf loss ---------------------------------------------------------------------------

class PoisonWeights(keras.callbacks.Callback):
    """Sets the first weight to NaN before optimizer step ``step`` (counted from 1)."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_begin(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == self.step - 1:
            weight = self.model.weights[0]
            weight.assign(np.full(weight.shape, np.nan, "float32"))


def test_nan_loss_stops_training_naming_the_step_and_keeps_the_last_good_checkpoint(
        tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "build_monitors",
                        lambda config, data, run_dir=None: [PoisonWeights(9)])
    run = tmp_path / "run"
    with pytest.raises(FloatingPointError, match=r"loss became nan at step 9 \(epoch 2\)"), \
            pytest.warns(RuntimeWarning, match="epoch 2: the loss is nan; no checkpoint"):
        train(tiny_config(tmp_path, epochs=3), run)
    state = json.loads((run / "checkpoints" / "latest.json").read_text())
    assert state["checkpoint"] == "epoch-0001.keras" and state["step"] == 6
    assert not (run / "checkpoints" / "epoch-0002.keras").exists()
    assert not (run / "model.keras").exists()
    model, _ = load_checkpoint(str(run / "checkpoints"))
    assert all(np.isfinite(w).all() for w in model.get_weights())


# -- the run directory and the disk, checked before training ----------------------------------

def test_unwritable_run_directory_is_refused_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(OSError, match=r"run directory .*a_file/run is not writable"):
        train(tiny_config(tmp_path), blocker / "run")
    if os.geteuid() == 0:
        return  # root writes through permission bits
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(OSError, match=r"run directory .*locked is not writable"):
        train(tiny_config(tmp_path), locked)


def test_full_disk_is_refused_before_training(tmp_path, monkeypatch):
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1 << 20))
    run = tmp_path / "run"
    with pytest.raises(OSError, match=r"not enough free disk space for .*run: 1 MB free, "
                                      r"about \d+ MB needed"):
        train(tiny_config(tmp_path), run)
    assert not (run / "history.csv").exists() and not (run / "checkpoints").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.keras"
    path.write_text("old")
    with pytest.raises(OSError, match="No space left"), atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write("half")
        raise OSError(28, "No space left on device")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["model.keras"]


# -- safe mode, no pickles --------------------------------------------------------------------

def test_models_load_in_safe_mode(tmp_path):
    lam = keras.Sequential([keras.Input((2,)), keras.layers.Lambda(lambda x: x * 2)])
    lam.save(tmp_path / "lambda.keras")
    with pytest.raises(ValueError, match="safe_mode"):
        load_model(tmp_path / "lambda.keras")


def test_nothing_in_a_run_directory_is_pickled(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tmp_path, epochs=1), run)
    for folder, _, files in os.walk(run):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                head = f.read(2)
            assert not (head[:1] == b"\x80" and head[1:2] in b"\x02\x03\x04\x05"), path
            assert not name.endswith((".pkl", ".pickle", ".pt", ".npy", ".npz")), path
            if name.endswith(".keras"):
                with zipfile.ZipFile(path) as archive:
                    assert set(archive.namelist()) <= {"config.json", "metadata.json",
                                                       "model.weights.h5"}, path
    json.loads((run / "checkpoints" / "latest.json").read_text())  # plain JSON
