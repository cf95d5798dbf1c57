"""Callbacks of ``transformerkit train``: atomic checkpoints and stopping rules."""

import base64
import json
import math
import os
import time

import keras

from transformerkit.files import atomic_path, atomic_write_text

STATE_FILE = "latest.json"


class RunCheckpoint(keras.callbacks.Callback):
    """Saves the model with its optimizer state after every epoch, atomically.

    Layout in ``directory``: ``epoch-0003.keras`` (the last ``keep`` of them),
    ``best.keras`` (lowest ``monitor``) and ``latest.json`` = ``{"epoch": 3, "step": 540,
    "checkpoint": "epoch-0003.keras", "best": 2.31}``. ``latest.json`` is written last, so
    it always names a complete file: a crash during a save leaves the previous state.
    """

    def __init__(self, directory, keep=2, monitor="val_loss", best=None):
        super().__init__()
        self.directory = directory
        self.keep = max(1, int(keep))
        self.monitor = monitor
        self.best = best
        os.makedirs(directory, exist_ok=True)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        name = f"epoch-{epoch + 1:04d}.keras"
        with atomic_path(os.path.join(self.directory, name)) as tmp:
            self.model.save(tmp)
        value = logs.get(self.monitor)
        improved = value is not None and math.isfinite(value) and (
            self.best is None or value < self.best)
        if improved:
            self.best = float(value)
            with atomic_path(os.path.join(self.directory, "best.keras")) as tmp:
                self.model.save(tmp)
        state = {"epoch": epoch + 1, "step": int(self.model.optimizer.iterations.numpy()),
                 "checkpoint": name, "best": self.best, "monitor": self.monitor,
                 "global_rng": global_rng_state()}
        atomic_write_text(os.path.join(self.directory, STATE_FILE), json.dumps(state, indent=1))
        self._prune()

    def _prune(self):
        epochs = sorted(f for f in os.listdir(self.directory)
                        if f.startswith("epoch-") and f.endswith(".keras"))
        for old in epochs[: -self.keep]:
            os.remove(os.path.join(self.directory, old))


def global_rng_state():
    """The backend's global RNG state, base64 text, or None.

    Keras layers keep their random state in seed-generator variables, which the ``.keras``
    checkpoint stores, except for one fast path: unseeded dropout on the PyTorch backend
    draws from torch's global generator. Saving that generator makes resume exact.
    """
    if keras.backend.backend() != "torch":
        return None
    import torch

    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")


def restore_global_rng(state):
    """Undo :func:`global_rng_state` (no-op when ``state`` is None)."""
    if state is None or keras.backend.backend() != "torch":
        return
    import numpy as np
    import torch

    raw = np.frombuffer(base64.b64decode(state), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))


class RestoreGlobalRNG(keras.callbacks.Callback):
    """On resume, restores the saved global RNG right before the first resumed epoch (after
    anything ``fit`` does at start-up), where the straight run had it."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_begin(self, epoch, logs=None):
        restore_global_rng(self.state)
        self.state = None


def read_checkpoint_state(directory):
    """The ``latest.json`` state of a checkpoint directory, or None if there is none."""
    path = os.path.join(directory, STATE_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"checkpoint state {path} is unreadable: {err}") from err
    if not os.path.exists(os.path.join(directory, state.get("checkpoint", ""))):
        raise ValueError(f"{path} names {state.get('checkpoint')!r}, which is missing")
    return state


class StopConditions(keras.callbacks.Callback):
    """Stops ``fit`` after ``max_steps`` optimizer steps or ``time_budget`` seconds, checked
    after every batch. ``stopped_by`` says which rule fired (or None)."""

    def __init__(self, max_steps=None, time_budget=None):
        super().__init__()
        self.max_steps, self.time_budget = max_steps, time_budget
        self.stopped_by = None
        self._start = None

    def on_train_begin(self, logs=None):
        self._start = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self.max_steps is not None and \
                int(self.model.optimizer.iterations.numpy()) >= self.max_steps:
            self.stopped_by = "max_steps"
        elif self.time_budget is not None and time.monotonic() - self._start >= self.time_budget:
            self.stopped_by = "time_budget"
        if self.stopped_by:
            self.model.stop_training = True


class NonFiniteLoss(keras.callbacks.Callback):
    """Stops training at the first NaN/inf loss and says at which step."""

    def __init__(self):
        super().__init__()
        self.failed_step = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.failed_step = int(self.model.optimizer.iterations.numpy())
            self.model.stop_training = True

