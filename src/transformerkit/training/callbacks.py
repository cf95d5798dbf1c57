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
from transformerkit.training.checkpoint_state import CheckpointState
from transformerkit.training.optimizers import optimizer_steps


class RunCheckpoint(keras.callbacks.Callback):
    """Saves the model with its optimizer state after every epoch and, with ``every``, every
    ``every`` optimizer steps inside an epoch; atomically. Also the early-stopping rule.

    Layout in ``directory`` (see :class:`~transformerkit.run_directory.CheckpointDirectory`):
    ``epoch-0003.keras`` after epoch 3, ``epoch-0003-batch-0000150.keras`` after 150 batches
    of epoch 4 (the last ``keep`` of both kinds together), ``best.keras`` (the best
    ``monitor`` value: lowest ``val_loss``/``loss``, highest ``val_bleu``/``val_accuracy``)
    and ``latest.json``, a :class:`~transformerkit.training.checkpoint_state.CheckpointState`
    (``{"checkpoint": "...", "epoch": 3, "step": 690, "batch": 150, "sha256": "...", "best":
    2.31, "monitor": "val_loss", "wait": 0, "global_rng": ...}``).
    Each file is written to a temporary name and renamed; ``latest.json`` is written last,
    so it always names a complete file whose checksum it holds (:func:`load_checkpoint`
    verifies it). A crash during a save leaves the previous state. A checkpoint whose
    running loss is NaN or inf is not saved, so the last checkpoint stays the last good one.

    Early stopping (``patience``): every epoch end where ``monitor`` is in the logs is an
    evaluation; after ``patience`` evaluations in a row without a better value, training
    stops and ``stopped_early`` is True. ``wait`` (evaluations without improvement so far)
    is in ``latest.json``, so a resumed run stops where the straight one would.

    Args:
        directory: the checkpoint folder. keep: checkpoints kept. monitor: a log key.
        best, wait: the resumed state (None, 0 for a new run). every: optimizer steps
        between checkpoints inside an epoch (None: epoch ends only). patience: int or None.
        epoch_batches: batches in a full epoch (mid-epoch checkpoints are named by position).
        resume_at: ``(epoch, batch)`` where a resumed run starts (its first epoch then
            starts at that batch).
        group: the :class:`~transformerkit.training.processes.ProcessGroup` of a run of
            several processes (None: one). Every rank runs this callback and decides the
            same (the monitored value is rank 0's); rank 0 alone writes, after gathering
            every rank's global RNG state into ``latest.json`` (``rank_rng``, with
            ``world_size``) so that each rank resumes exactly.
        budget: a function giving the seconds of the time budget used so far
            (``StopConditions.elapsed``), written as ``budget_seconds``; None: no budget.
    """

    def __init__(self, directory, keep=2, monitor="val_loss", best=None, every=None,
                 patience=None, wait=0, epoch_batches=None, resume_at=None, group=None,
                 budget=None):
        super().__init__()
        from transformerkit.training.processes import ProcessGroup

        self.group = group or ProcessGroup()
        self.directory = CheckpointDirectory(directory)
        self.keep = max(1, int(keep))
        self.monitor = monitor
        self.higher_is_better = monitor in ("val_bleu", "val_accuracy")
        self.best = best
        self.every, self.patience, self.wait = every, patience, int(wait or 0)
        self.epoch_batches = epoch_batches
        self.resume_at = resume_at
        self.budget = budget
        self.stopped_early = False
        self._epoch, self._batches, self._last_step = 0, 0, None
        self._batch_end_rng = None
        if self.group.is_main:
            os.makedirs(self.directory, exist_ok=True)
            remove_temporaries(self.directory)  # left by a killed save

    def on_train_begin(self, logs=None):
        self._last_step = optimizer_steps(self.model.optimizer)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._batches = epoch, 0
        if self.resume_at is not None and self.resume_at[0] == epoch:
            self._batches = self.resume_at[1]
        self.resume_at = None

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        # where the last batch left the global RNG: a stop inside the epoch is saved at
        # on_epoch_end, after Keras' validation pass has drawn from it
        self._batch_end_rng = global_rng_state()
        if not self.every:
            return
        step = optimizer_steps(self.model.optimizer)
        if step == self._last_step or step % self.every:
            return  # not a new update, or not one to checkpoint
        self._last_step = step
        if self.epoch_batches is not None and self._batches >= self.epoch_batches:
            return  # the epoch's end: on_epoch_end saves it
        self._save(self._epoch, self._batches, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.epoch_batches is not None and self._batches < self.epoch_batches:
            # fit stopped inside the epoch (max_steps, time_budget): where it stopped
            self._save(epoch, self._batches, logs, evaluate=True, rng=self._batch_end_rng)
        else:
            self._save(epoch + 1, 0, logs, evaluate=True)

    def _save(self, epoch, batch, logs, evaluate=False, rng=None):
        logs = logs or {}
        loss = logs.get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            warnings.warn(f"epoch {epoch + (batch > 0)}: the loss is {loss}; no checkpoint "
                          "written (the last one stays the last good one)", RuntimeWarning,
                          stacklevel=3)
            return False
        name = self.directory.position_name(epoch, batch)
        rng = self.group.gather(rng if rng is not None else global_rng_state(), "a checkpoint")
        digest = None
        if self.group.is_main:
            with atomic_path(self.directory.file(name)) as tmp:
                self.model.save(tmp)
                digest = file_sha256(tmp)
        if evaluate:
            self._evaluate(self.group.broadcast(logs.get(self.monitor), "early stopping"))
        if not self.group.is_main:
            return True
        state = CheckpointState(checkpoint=name, epoch=epoch, batch=batch,
                                step=optimizer_steps(self.model.optimizer), sha256=digest,
                                best=self.best, monitor=self.monitor, wait=self.wait,
                                global_rng=rng[0],
                                budget_seconds=None if self.budget is None
                                else round(self.budget(), 3))
        if self.group.distributed:
            state = state.replace(world_size=self.group.size, rank_rng=rng)
        atomic_write_text(self.directory.state, json.dumps(state.to_json(), indent=1))
        self._prune()
        return True

    def _evaluate(self, value):
        """Keep ``best.keras`` and the early-stopping count up to date with ``value``."""
        if value is None or not math.isfinite(float(value)):
            return
        value = float(value)
        improved = self.best is None or (value > self.best if self.higher_is_better
                                         else value < self.best)
        if improved:
            self.best, self.wait = value, 0
            if self.group.is_main:
                with atomic_path(self.directory.best) as tmp:
                    self.model.save(tmp)
            return
        self.wait += 1
        if self.patience is not None and self.wait >= self.patience:
            self.stopped_early = True
            self.model.stop_training = True

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
    """On resume, restores the saved global RNG where the straight run had it: right before
    the first resumed epoch (after anything ``fit`` does at start-up) for a checkpoint at an
    epoch end, right before the first resumed batch (``at_batch=True``, after the epoch's
    data iterator is made) for one inside an epoch."""

    def __init__(self, state, at_batch=False):
        super().__init__()
        self.state, self.at_batch = state, at_batch

    def on_epoch_begin(self, epoch, logs=None):
        if not self.at_batch:
            restore_global_rng(self.state)
            self.state = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.state is not None:
            restore_global_rng(self.state)
            self.state = None


def read_checkpoint_state(directory):
    """The ``latest.json`` :class:`CheckpointState` of a checkpoint directory, or None if it
    has none.

    An unreadable ``latest.json`` (not JSON, or not a checkpoint state: without the
    ``checkpoint`` name and its ``sha256``, an unknown key) gives a warning and None
    (:func:`load_checkpoint` then falls back to the newest epoch file).
    """
    path = CheckpointDirectory(directory).state
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            state = CheckpointState.from_json(json.load(f))
    except (OSError, ValueError) as err:
        warnings.warn(f"checkpoint state {path} is unreadable ({err}); ignoring it",
                      RuntimeWarning, stacklevel=2)
        return None
    return state


def load_checkpoint(directory):
    """Load the newest good checkpoint of ``directory``: ``(model, state)``, ``state`` a
    :class:`CheckpointState`.

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
    names = [state.checkpoint] if state else []
    names += [n for n in reversed(directory.epoch_names()) if n not in names]
    problems = []
    for name in names:
        path = directory.file(name)
        try:
            if state and name == state.checkpoint and os.path.isfile(path) and \
                    file_sha256(path) != state.sha256:
                raise ValueError(f"{path} does not match the sha256 in {CHECKPOINT_STATE} "
                                 "(corrupt)")
            model = load_model(path, compile=True)
        except (ValueError, OSError) as err:
            problems.append(str(err))
            continue
        if state and name == state.checkpoint:
            return model, state
        reason = "; ".join(problems) or f"{CHECKPOINT_STATE} is missing or unreadable"
        warnings.warn(f"falling back to checkpoint {path}: {reason}", RuntimeWarning,
                      stacklevel=2)
        fallback = CheckpointState(
            checkpoint=name, epoch=directory.epoch_of(name), batch=directory.batch_of(name),
            step=optimizer_steps(model.optimizer), best=state.best if state else None,
            monitor=state.monitor if state else None, wait=state.wait if state else 0)
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


class LearningRateLog(keras.callbacks.Callback):
    """Adds ``learning_rate``, the rate the next update would use, to each epoch's logs
    (``history.csv``, TensorBoard): where a stopped run's schedule stood."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            rate = self.model.optimizer.learning_rate
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(rate))


class StopConditions(keras.callbacks.Callback):
    """Stops ``fit`` after ``max_steps`` optimizer steps or ``time_budget`` seconds, checked
    after every optimizer update (with gradient accumulation: never between the batches of
    one update). ``stopped_by`` says which rule fired (or None).

    With a time budget and a :class:`~transformerkit.training.schedules.Cooldown`, the
    cooldown is fitted to the budget: at the updates :func:`is_retarget_point` names the run's
    length is estimated from the measured update rate (the updates since the first one of
    this ``fit``, which pays for building the step, over their seconds; evaluation pauses
    included) as ``step + rate * seconds left``, and the cooldown retargeted to end there
    (where that moves its end by more than 1% or 2 updates; several processes use rank 0's
    estimate, so they keep one schedule, and only rank 0 checks the budget: its stop reaches
    the others through :class:`StopTogether`). A run whose cooldown has ended before the budget
    stops there (``stopped_by`` ``cooldown_end``: the rate is zero). A train function that
    was compiled with the old window (JAX and TensorFlow graphs, ``torch.compile``) is
    rebuilt after a retarget.

    ``elapsed``: budget seconds a resumed run used before (its checkpoint's
    ``budget_seconds``): the budget is the whole run's, resumes included. ``clock``: the
    seconds function (``time.monotonic``). ``longest``: the run's length in updates without
    the budget (its epochs, ``max_steps``), which an estimate never exceeds: a budget that
    outlasts the run leaves its cooldown where the run ends (the same schedule as without
    the budget).

    A rule that fires at an epoch's last batch stops ``fit`` at the epoch's end instead
    (``on_epoch_end``), so the epoch ends as in a run that goes on: Keras' data iterator
    makes the next epoch's iterator when it runs out, which draws from the global RNG that
    dropout draws from, and a checkpoint saved there then holds the uninterrupted run's
    state (exact resume).
    """

    def __init__(self, max_steps=None, time_budget=None, cooldown=None, group=None,
                 elapsed=0.0, clock=time.monotonic, longest=None):
        super().__init__()
        from transformerkit.training.processes import ProcessGroup

        self.max_steps, self.time_budget = max_steps, time_budget
        self.cooldown = cooldown
        fitted = cooldown if time_budget is not None else None
        self._fitted = fitted  # the cooldown the budget retargets (None: none, or no budget)
        self.group = group or ProcessGroup()
        self.stopped_by = None
        self.retargets = 0
        self._before = float(elapsed or 0.0)
        self._longest = longest
        self._clock = clock
        self._start = self._last_step = self._first = None
        self._stop_at_epoch_end = False

    def elapsed(self):
        """Seconds of the budget used so far, resumes included."""
        if self._start is None:
            return self._before
        return self._before + self._clock() - self._start

    def exhausted(self, step):
        """Whether a run at update ``step`` (resumed) has nothing left to train: its
        ``max_steps``, its cooldown or its budget spent (``stopped_by`` says which)."""
        self.stopped_by = self._rule(step, self._before)
        return self.stopped_by is not None

    def _rule(self, step, elapsed):
        """The stop rule that fires at update ``step`` after ``elapsed`` budget seconds (None:
        the budget is not this process's to check), or None."""
        if self.max_steps is not None and step >= self.max_steps:
            return "max_steps"
        if self._budget_ends(step):
            return "cooldown_end"
        if self.time_budget is not None and elapsed is not None and elapsed >= self.time_budget:
            return "time_budget"
        return None

    def _budget_ends(self, step):
        """Whether the cooldown fitted to the budget has ended at ``step`` before the run's
        epochs or ``max_steps`` end it."""
        return (self._fitted is not None and step >= self._fitted.end
                and (self._longest is None or self._fitted.end < self._longest))

    def on_train_begin(self, logs=None):
        if self._start is None:  # a resume inside an epoch calls fit twice
            self._start = self._clock()
        self._last_step = optimizer_steps(self.model.optimizer)

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_steps(self.model.optimizer)
        if step == self._last_step:
            return  # inside an update
        self._last_step = step
        if self._first is None:
            self._first = (step, self.elapsed())
        if self._fitted is not None and is_retarget_point(step, self._first[0]):
            self._retarget(step)  # before the rules: every process reaches the broadcast
        # the budget is rank 0's clock: another rank's clock started at another moment, and
        # its stop, reached alone, would leave rank 0 without a reason (StopTogether carries
        # rank 0's stop to every rank, on the same update)
        self.stopped_by = self._rule(step, self.elapsed() if self.group.is_main else None)
        if self.stopped_by:
            steps = (self.params or {}).get("steps")
            if steps is not None and batch + 1 >= steps:
                self._stop_at_epoch_end = True  # the epoch's last batch: see the docstring
            else:
                self.model.stop_training = True

    def _retarget(self, step):
        first_step, first_seconds = self._first
        seconds = self.elapsed() - first_seconds
        end = None
        if step > first_step and seconds > 0:
            rate = (step - first_step) / seconds
            end = int(step + rate * max(self.time_budget - self.elapsed(), 0.0))
            if self._longest is not None:  # the epochs or max_steps end it sooner
                end = min(end, self._longest)
        end = self.group.broadcast(end, "the cooldown's end")
        if end is None or abs(end - self.cooldown.end) <= max(2, 0.01 * self.cooldown.end):
            return
        self.cooldown.retarget(step, end)
        self.retargets += 1
        if keras.backend.backend() != "torch" or self.model.jit_compile:
            self.model.make_train_function(force=True)  # traced with the old window

    def on_epoch_end(self, epoch, logs=None):
        if self._stop_at_epoch_end:
            self._stop_at_epoch_end = False
            self.model.stop_training = True


def is_retarget_point(step, first):
    """Whether a time-budgeted cooldown is retargeted after update ``step``, ``first`` being
    the first update of this ``fit``: 16, 32 and 64 updates after it, then every 64th, so
    that the estimate is made early and kept current to the end."""
    k = step - first
    return k in (16, 32) or (k >= 64 and k % 64 == 0)


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
            self.failed_step = optimizer_steps(self.model.optimizer)
            self.failed_epoch, self.failed_value = self._epoch, float(loss)
            self.model.stop_training = True


class ReduceLogs(keras.callbacks.Callback):
    """Several processes: replaces this rank's training logs (running loss, accuracy) by
    their mean over the ranks after every batch and epoch, so that every rank logs, checks
    for NaN (a NaN on any rank is a NaN on all) and records the same numbers. Goes first
    among the callbacks; the validation logs (``val_*``, equal on every rank) stay."""

    def __init__(self, group):
        super().__init__()
        self.group = group

    def _reduce(self, logs, what):
        if not logs:
            return
        keys = sorted(k for k in logs if not k.startswith("val_"))
        values = self.group.sum([float(logs[k]) for k in keys], what) / self.group.size
        logs.update(zip(keys, values.tolist(), strict=True))

    def on_train_batch_end(self, batch, logs=None):
        self._reduce(logs, "a training step")

    def on_epoch_end(self, epoch, logs=None):
        self._reduce(logs, "an epoch end")


class StopTogether(keras.callbacks.Callback):
    """Several processes: after every batch and epoch, training stops on every rank if any
    rank's callbacks asked to stop (max steps, time budget, early stopping, a NaN), so all
    ranks stop on the same step. Goes after the callbacks that may stop; ``stopped`` says
    whether it stopped the run."""

    def __init__(self, group):
        super().__init__()
        self.group = group
        self.stopped = False

    def _agree(self, what):
        if self.group.any(self.model.stop_training, what):
            self.model.stop_training = self.stopped = True

    def on_train_batch_end(self, batch, logs=None):
        self._agree("agreeing to stop")

    def on_epoch_end(self, epoch, logs=None):
        self._agree("agreeing to stop at an epoch end")
