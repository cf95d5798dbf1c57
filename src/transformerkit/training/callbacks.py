"""Callbacks of ``transformerkit train``: atomic, verified checkpoints and stopping rules."""

import base64
import json
import math
import os
import time
import warnings

import keras

# Registers the classes a compiled checkpoint names (loss, metric, optimizers, schedules).
import transformerkit.training.gpt_recipe  # noqa: F401
import transformerkit.training.losses  # noqa: F401
import transformerkit.training.optimizers  # noqa: F401
import transformerkit.training.schedules  # noqa: F401
from transformerkit.files import atomic_path, atomic_write_text, file_sha256, remove_temporaries
from transformerkit.run_directory import CHECKPOINT_STATE, CheckpointDirectory


class RunCheckpoint(keras.callbacks.Callback):
    """Saves the model with its optimizer state after every epoch, atomically.

    Layout in ``directory`` (see :class:`~transformerkit.run_directory.CheckpointDirectory`):
    ``epoch-0003.keras`` (the last ``keep`` of them), ``best.keras`` (lowest ``monitor``)
    and ``latest.json`` = ``{"epoch": 3, "step": 540, "checkpoint": "epoch-0003.keras",
    "sha256": "...", "best": 2.31, "monitor": "val_loss", "global_rng": ...}``. Each file is
    written to a temporary name and renamed; ``latest.json`` is written last, so it always
    names a complete file whose checksum it holds (:func:`load_checkpoint` verifies it). A
    crash during a save leaves the previous state. An epoch whose loss is NaN or inf is not
    saved, so the last checkpoint stays the last good one.
    """

    def __init__(self, directory, keep=2, monitor="val_loss", best=None):
        super().__init__()
        self.directory = CheckpointDirectory(directory)
        self.keep = max(1, int(keep))
        self.monitor = monitor
        self.best = best
        os.makedirs(self.directory, exist_ok=True)
        remove_temporaries(self.directory)  # left by a killed save

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        loss = logs.get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            warnings.warn(f"epoch {epoch + 1}: the loss is {loss}; no checkpoint written (the "
                          "last one stays the last good one)", RuntimeWarning, stacklevel=2)
            return
        name = self.directory.epoch_name(epoch + 1)
        with atomic_path(self.directory.file(name)) as tmp:
            self.model.save(tmp)
            digest = file_sha256(tmp)
        value = logs.get(self.monitor)
        improved = value is not None and math.isfinite(value) and (
            self.best is None or value < self.best)
        if improved:
            self.best = float(value)
            with atomic_path(self.directory.best) as tmp:
                self.model.save(tmp)
        state = {"epoch": epoch + 1, "step": int(self.model.optimizer.iterations.numpy()),
                 "checkpoint": name, "sha256": digest, "best": self.best,
                 "monitor": self.monitor,
                 "global_rng": global_rng_state()}
        atomic_write_text(self.directory.state, json.dumps(state, indent=1))
        self._prune()

    def _prune(self):
        for old in self.directory.epoch_names()[: -self.keep]:
            os.remove(self.directory.file(old))


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
    """The ``latest.json`` state of a checkpoint directory, or None if it has none.

    An unreadable ``latest.json`` (not JSON, or without the ``checkpoint`` name and its
    ``sha256``) gives a warning and None (:func:`load_checkpoint` then falls back to the
    newest epoch file).
    """
    path = CheckpointDirectory(directory).state
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        if not isinstance(state, dict) or not all(
                isinstance(state.get(key), str) for key in ("checkpoint", "sha256")):
            raise ValueError("not a checkpoint state")
    except (OSError, ValueError) as err:
        warnings.warn(f"checkpoint state {path} is unreadable ({err}); ignoring it",
                      RuntimeWarning, stacklevel=2)
        return None
    return state


def load_checkpoint(directory):
    """Load the newest good checkpoint of ``directory``: ``(model, state)``.

    The file ``latest.json`` names is used when it exists, matches its sha256 and loads;
    otherwise the epoch files are tried newest first, with a warning naming what was wrong
    (then ``state`` is rebuilt from the file name and the model's step counter, and the
    global RNG state of the newer checkpoint is dropped: the resume is no longer bit-exact).
    Raises ``FileNotFoundError`` when there is no checkpoint and ``ValueError`` when none
    of them can be read.
    """
    from transformerkit.saving import load_model

    directory = CheckpointDirectory(directory)
    if not directory.has_checkpoint():
        raise FileNotFoundError(f"no checkpoint in {directory}")
    state = read_checkpoint_state(directory)
    names = [state["checkpoint"]] if state else []
    names += [n for n in reversed(directory.epoch_names()) if n not in names]
    problems = []
    for name in names:
        path = directory.file(name)
        try:
            if state and name == state["checkpoint"] and os.path.isfile(path) and \
                    file_sha256(path) != state["sha256"]:
                raise ValueError(f"{path} does not match the sha256 in {CHECKPOINT_STATE} "
                                 "(corrupt)")
            model = load_model(path, compile=True)
        except (ValueError, OSError) as err:
            problems.append(str(err))
            continue
        if state and name == state["checkpoint"]:
            return model, state
        reason = "; ".join(problems) or f"{CHECKPOINT_STATE} is missing or unreadable"
        warnings.warn(f"falling back to checkpoint {path}: {reason}", RuntimeWarning,
                      stacklevel=2)
        fallback = {"epoch": directory.epoch_of(name),
                    "step": int(model.optimizer.iterations.numpy()), "checkpoint": name,
                    "best": (state or {}).get("best"), "monitor": (state or {}).get("monitor"),
                    "global_rng": None}
        return model, fallback
    raise ValueError(f"no readable checkpoint in {directory}: {'; '.join(problems)}")


class EpochTimer(keras.callbacks.Callback):
    """Adds ``epoch_seconds`` (wall-clock time of the epoch: its training steps and its
    validation) to the epoch logs, so ``history.csv`` records it."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and getattr(self, "_start", None) is not None:
            logs["epoch_seconds"] = round(time.monotonic() - self._start, 1)


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
    """Stops training at the first NaN/inf loss; ``failed_step`` (the optimizer step, from
    1), ``failed_epoch`` (from 0) and ``failed_value`` say where and what."""

    def __init__(self):
        super().__init__()
        self.failed_step = self.failed_epoch = self.failed_value = None
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if self.failed_step is None and loss is not None and not math.isfinite(float(loss)):
            self.failed_step = int(self.model.optimizer.iterations.numpy())
            self.failed_epoch, self.failed_value = self._epoch, float(loss)
            self.model.stop_training = True
