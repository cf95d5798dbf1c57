"""``transformerkit train``: from a config to a complete run directory.

Read top to bottom: prepare the run directory -> data and tokenizers -> model -> compile
(masked loss, the paper's optimizer) and attach the training step -> ``model.fit`` with
checkpoints -> final artefacts.

The route from ``transformerkit train`` to the optimizer update, file by file (8 files;
the data side, ``data/`` and ``training/accumulation.py``, only feeds it batches):

1. ``cli/training.py: train_command``: the config, with ``--set``, -> :func:`train`;
2. ``training/trainer.py`` (this file): :func:`train` -> ``_train``: set-up -> the model
   built (``_build``: :func:`compile_model`) or resumed (``_resume``) -> the step attached
   (``attach_train_step``) -> callbacks -> ``model.fit`` (``_fit``) -> report;
3. ``models/base.py: TransformerBase.train_step``: Keras' ``fit`` calls it for every batch;
   it hands the batch to the attached step;
4. ``training/step.py: TrainStep``: the whole update: forward pass, loss (weighted for
   gradient accumulation), backward pass, the gradient exchange between processes
   (``GradientAllReduce``), ``optimizer.apply``, loss tracker and metrics; Keras' own step
   or its PyTorch shortcut, behind the one switch (``fastpath.py``);
5. ``models/transformer.py`` (``gpt.py``, ``encoder.py``): ``call``, the forward pass,
   built from ``layers/``;
6. ``training/losses.py: MaskedCrossEntropy``: the loss;
7. ``training/schedules.py``: the learning rate of each update (the paper's schedule,
   cooled down to zero at the end of a budgeted run);
8. ``training/optimizers.py: Adam``: the update itself (``training/gpt_recipe.py`` for
   ``adamw_cosine``).
"""

import contextlib
import importlib.util
import logging
import math
import os
import shutil
import time
import types
from typing import NamedTuple

import keras
import numpy as np

from transformerkit.config import parse_duration, save_config
from transformerkit.data.pipeline import EpochSync
from transformerkit.extras import install_hint
from transformerkit.files import atomic_path
from transformerkit.models.factory import build_model
from transformerkit.run_directory import RunDirectory
from transformerkit.saving import load_model
from transformerkit.training.accumulation import UpdateBatches
from transformerkit.training.averaging import average_checkpoints
from transformerkit.training.callbacks import (
    EpochTimer,
    LearningRateLog,
    NonFiniteLoss,
    ReduceLogs,
    RestoreGlobalRNG,
    RunCheckpoint,
    StopConditions,
    StopTogether,
    load_checkpoint,
)
from transformerkit.training.checkpoint_state import CheckpointState
from transformerkit.training.data_setup import prepare_data
from transformerkit.training.distribution import (
    build_distribution,
    check_model_parallel_shapes,
    divisible,
)
from transformerkit.training.finetune import (
    copy_weights,
    fine_tunes,
    finetune_config,
    load_pretrained,
    recorded,
)
from transformerkit.training.gpt_recipe import gpt_optimizer
from transformerkit.training.losses import (
    ClassificationCrossEntropy,
    MaskedAccuracy,
    MaskedCrossEntropy,
)
from transformerkit.training.monitors import build_monitors
from transformerkit.training.optimizers import (
    Adam,
    UpdateCountSchedule,
    optimizer_steps,
    with_accumulation,
)
from transformerkit.training.precision import precision_policy, resolve_precision
from transformerkit.training.processes import setup as setup_processes
from transformerkit.training.reports import write_final_reports
from transformerkit.training.schedules import (
    Cooldown,
    TransformerSchedule,
    cooldown_fraction,
    with_cooldown,
)
from transformerkit.training.step import GradientAllReduce, attach_train_step
from transformerkit.training.tensorboard import TensorBoardScalars

log = logging.getLogger("transformerkit")


def train(config, run_dir, resume=False):
    """Train the model of ``config`` into ``run_dir`` and return the final metrics dict.

    Raises before any training step: ``OSError`` for a run directory that is not writable
    or a disk without room for the checkpoints, ``ValueError`` for a distribution the
    backend or the devices cannot do; during training ``FloatingPointError`` naming the
    step where the loss became NaN or inf (the last good checkpoint is kept).

    Launched as one of several processes (``torchrun``; JAX processes with
    ``train.distribution: data_parallel``, see ``training/processes.py``) every process
    calls this; rank 0 alone writes the run directory and returns the metrics, the other
    ranks return None. ``ProcessGroupError`` (a ``ConnectionError``) when a process is lost.
    """
    run = RunDirectory(run_dir)
    config = config.with_data_dir_recorded()  # evaluate reads the run's data from there
    train_cfg = config.train
    timeout = parse_duration(train_cfg.process_timeout, "train.process_timeout")
    group = setup_processes(timeout)  # first: JAX processes join before JAX uses a device
    dist = build_distribution(train_cfg.distribution, train_cfg.devices,
                              train_cfg.model_parallel_size, timeout)
    if group.kind == "torch" and train_cfg.jit_compile is True:
        raise ValueError("train.jit_compile: true is not supported with several PyTorch "
                         "processes (torchrun); set train.jit_compile: auto or false")
    if not group.is_main:  # rank 0 reports; the others only warn
        log.setLevel(max(log.getEffectiveLevel(), logging.WARNING))
    pretrained = None
    if fine_tunes(config) and not resume:  # every rank: the merged config, the weights
        pretrained = load_pretrained(config.model.pretrained)
        config = finetune_config(config, pretrained)
    elif fine_tunes(config) and os.path.isfile(run.config):  # resumed: as it started
        config = finetune_config(config, recorded(config, run))
    if group.is_main:
        _check_run_dir(run, resume)
        if not resume:
            save_config(config, run.config)
            if pretrained is not None:  # read back by every rank's data preparation
                pretrained.write_tokenizers(run)
    keras.utils.set_random_seed(train_cfg.seed)
    precision = resolve_precision(train_cfg.precision_policy, config.model.d_model)
    log.info("precision: %s (%s)", precision.used, precision.reason)
    try:
        with precision_policy(precision.used), \
                (dist.scope() if dist else contextlib.nullcontext()):
            return _train(config, run, resume, dist, group, precision, pretrained)
    finally:
        if group.kind == "torch":
            import torch.distributed

            torch.distributed.destroy_process_group()


def _prepare_data(config, run, resume, group):
    """Rank 0 first (it trains and writes the tokenizers, fills data caches), then the
    other ranks, which read what rank 0 wrote."""
    data = None
    if group.is_main:
        data = prepare_data(config, run, reuse_tokenizers=resume)
    group.barrier("data preparation")
    if not group.is_main:
        data = prepare_data(config, run, reuse_tokenizers=True)
    return data


def _train(config, run, resume, dist, group, precision, pretrained=None):
    """The run, in its order: set-up (data, batches) -> build or resume -> callbacks -> fit ->
    report. Returns rank 0's metrics (None on the other ranks)."""
    train_cfg = config.train
    data = _prepare_data(config, run, resume or pretrained is not None, group)
    for key, value in data.info.items():
        log.info("%s: %s", key, value)
    # PyTorch processes: each rank its shard of every epoch's batches (JAX processes split
    # the rows of each global batch instead, training/distribution.py: DivisibleBatches)
    shards = (group.size, group.rank) if group.kind == "torch" else (1, 0)
    batches = UpdateBatches(data.train, train_cfg.accumulate_steps, 0, *shards)
    monitor = _monitor(train_cfg, data)

    start = (_resume(run, group, monitor) if resume else
             _build(config, data, pretrained, batches.updates_per_epoch))
    model = start.model
    check_model_parallel_shapes(model, dist)
    if group.is_main:
        check_disk_space(run.path, model, train_cfg.checkpoints_to_keep)
    step = attach_train_step(model)  # what model.fit runs for every batch
    if group.kind == "torch":
        _join_torch_processes(model, step, group, train_cfg.seed, resume)

    budget = _seconds(train_cfg.time_budget)
    stop = StopConditions(train_cfg.max_steps, budget, attach_cooldown(model.optimizer), group,
                          elapsed=start.state.budget_seconds if start.state else 0.0,
                          longest=_total_steps(train_cfg, batches.updates_per_epoch))
    rules = _Rules(stop=stop,
                   non_finite=NonFiniteLoss(),
                   checkpoint=RunCheckpoint(
                       run.checkpoints, keep=train_cfg.checkpoints_to_keep, monitor=monitor,
                       best=start.best, wait=start.wait, every=train_cfg.checkpoint_every,
                       patience=train_cfg.patience, epoch_batches=len(batches),
                       resume_at=(start.epoch, start.batch), group=group,
                       budget=stop.elapsed if budget is not None else None),
                   together=StopTogether(group))
    callbacks = _callbacks(config, data, run, group, start, rules, resume)
    started = time.monotonic()
    history = _fit(model, data, dist, batches, callbacks, rules, start, shards, config,
                   group.is_main)
    if rules.non_finite.failed_step is not None:
        failed = rules.non_finite
        raise FloatingPointError(
            f"the loss became {failed.failed_value} at step {failed.failed_step} "
            f"(epoch {failed.failed_epoch + 1}); training stopped and the last good "
            f"checkpoint is kept in {run.checkpoints}. Lower the learning rate (train.lr_scale "
            "or train.learning_rate) or check the data, then --resume.")
    if not group.is_main:
        return None
    with atomic_path(run.model) as tmp:
        model.save(tmp)
    return _report(model, data, config, run, group, step, precision, rules, monitor, history,
                   time.monotonic() - started)


class _Start(NamedTuple):
    """Where training starts: the model (built, or loaded from a checkpoint with its
    optimizer), the position (epoch, batch of that epoch), the early-stopping record and
    the checkpoint's state (None for a new run)."""

    model: keras.Model
    epoch: int = 0
    batch: int = 0
    best: float | None = None
    wait: int = 0
    state: CheckpointState | None = None


class _Rules(NamedTuple):
    """The callbacks that may stop a run, read after ``fit`` to say why it stopped."""

    stop: StopConditions
    non_finite: NonFiniteLoss
    checkpoint: RunCheckpoint
    together: StopTogether

    def stopped(self):
        return bool(self.stop.stopped_by or self.non_finite.failed_step is not None
                    or self.checkpoint.stopped_early or self.together.stopped)


def _build(config, data, pretrained, updates_per_epoch):
    """A new run: the model of the config (the pretrained weights copied in), compiled."""
    model = build_model(_model_section(config, data), data.source_tokenizer.vocab_size,
                        data.target_tokenizer.vocab_size, embeddings=data.embeddings)
    if pretrained is not None:
        copy_weights(pretrained, model)
    compile_model(model, config, _total_steps(config.train, updates_per_epoch))
    return _Start(model)


def _resume(run, group, monitor):
    """An exact resume: weights, optimizer moments and step, dropout RNG state and the
    position of the newest good checkpoint; its early-stopping record unless it watched
    another metric."""
    model, state = load_checkpoint(run.checkpoints)
    _check_world_size(state, group)
    same_metric = state.monitor == monitor
    log.info("resuming from %s (epoch %d, batch %d, step %d)", state.checkpoint, state.epoch,
             state.batch, state.step)
    return _Start(model, state.epoch, state.batch, state.best if same_metric else None,
                  state.wait if same_metric else 0, state)


def _callbacks(config, data, run, group, start, rules, resume):
    """The callbacks of ``fit``, in the order they must run."""
    main = group.is_main
    return [
        *([ReduceLogs(group)] if group.distributed else []),  # first: all see the mean loss
        EpochSync(data.train), EpochTimer(), rules.stop, rules.non_finite,
        *([RestoreGlobalRNG(start.state.rng_of(group.rank), at_batch=start.batch > 0)]
          if start.state else []),
        # before the checkpoint/CSV: they log val_bleu
        *(build_monitors(config, data, run.path) if main else []),
        rules.checkpoint,
        *([rules.together] if group.distributed else []),  # after every rule that may stop
        LearningRateLog(),
        *([keras.callbacks.CSVLogger(run.history, append=resume), *_tensorboard(run)]
          if main else []),
    ]


def _fit(model, data, dist, batches, callbacks, rules, start, shards, config, main):
    """``model.fit`` to the last epoch: first the rest of the epoch a checkpoint stopped in
    (resumed inside an epoch), then the following epochs; returns the merged history."""
    train_cfg = config.train
    epochs = _epochs(train_cfg, batches.updates_per_epoch)
    history = {}

    def fit(dataset, first_epoch, last_epoch):
        # shuffle=False: the dataset orders its own batches as a function of (seed, epoch);
        # Keras' own batch shuffling would draw from NumPy's global RNG and break resume.
        data.train.set_epoch(first_epoch)
        result = model.fit(divisible(dataset, dist), validation_data=divisible(data.val, dist),
                           epochs=last_epoch, initial_epoch=first_epoch, callbacks=callbacks,
                           shuffle=False, verbose=train_cfg.verbose if main else 0)
        for key, values in result.history.items():
            history.setdefault(key, []).extend(values)

    first_epoch = start.epoch
    if rules.stop.exhausted(optimizer_steps(model.optimizer)):
        return history  # a resumed run whose steps, cooldown or budget are spent
    if start.batch and first_epoch < epochs:
        fit(UpdateBatches(data.train, train_cfg.accumulate_steps, start.batch, *shards),
            first_epoch, first_epoch + 1)
        first_epoch += 1
    if first_epoch < epochs and not rules.stopped():
        fit(batches, first_epoch, epochs)
    return history


def _report(model, data, config, run, group, step, precision, rules, monitor, history,
            seconds):
    """metrics.json, samples and the final evaluation (:func:`write_final_reports`), and
    the average of the last checkpoints when ``train.average_last`` asks for it."""
    train_cfg = config.train
    summary = {
        "train_seconds": round(seconds, 1),
        "steps": optimizer_steps(model.optimizer),
        "stopped_by": ("early_stopping" if rules.checkpoint.stopped_early
                       else rules.stop.stopped_by or "epochs"),
        "accumulate_steps": train_cfg.accumulate_steps,
        "precision": precision._asdict(),  # what train.precision (auto) resolved to, and why
        **({"processes": group.size} if group.distributed else {}),
        **({"gradient_all_reduces": step.gradient_sync.calls,  # one per update
            "gradient_bytes_per_all_reduce": step.gradient_sync.bytes_per_call}
           if step.gradient_sync is not None else {}),
        **data.info,
        # the rate the schedule reached where the run stopped, and a cooldown's window
        "final_learning_rate": float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        **(dict(rules.stop.cooldown.window(), cooldown_retargets=rules.stop.retargets)
           if rules.stop.cooldown is not None else {}),
    }
    if train_cfg.patience is not None:
        summary.update(early_stopping_metric=monitor, early_stopping_best=rules.checkpoint.best)
    summary.update({k: float(v[-1]) for k, v in history.items()})
    metrics = write_final_reports(model, data, config, run, summary)
    if train_cfg.average_last:
        metrics = _evaluate_average(model, data, config, run, metrics)
    return metrics


def _model_section(config, data):
    """``config.model`` as a dict; an encoder's as a classifier of the data's classes: pooling
    ``mean`` unless set, ``num_classes`` from the labels (a different one set is an error)."""
    model = dict(config.model)
    if model["type"] != "encoder":  # a fine-tuned checkpoint's weights: copy_weights
        return {**model, "pretrained": None}
    classes = len(data.labels)
    if model["num_classes"] not in (None, classes):
        raise ValueError(f"model.num_classes={model['num_classes']} but the training data has "
                         f"{classes} labels ({data.labels[:10]}); leave model.num_classes "
                         "unset to take it from the data")
    model["num_classes"] = classes
    model["pooling"] = model["pooling"] or "mean"
    return model


def _check_world_size(state, group):
    """A run resumes with as many processes as it was checkpointed with: a PyTorch rank's
    position in the epoch is counted in its own shard's batches, a JAX process feeds its
    share of each batch's rows."""
    if state.world_size != group.size:
        raise ValueError(f"--resume: the checkpoint {state.checkpoint} was written by a run "
                         f"of {state.world_size} process(es), this launch has {group.size}; "
                         f"resume with the same number (torchrun --nproc_per_node "
                         f"{state.world_size} ...)")


def _join_torch_processes(model, step, group, seed, resume):
    """Several PyTorch processes: start every rank from rank 0's weights (a new run; a
    resumed one loads the same checkpoint everywhere), give each rank its own dropout
    stream (torch's global generator, seeded by ``seed`` and the rank) and switch the
    gradient all-reduce of the training ``step`` on."""
    import torch
    import torch.distributed

    if not resume:
        with torch.no_grad():
            for variable in model.weights:
                torch.distributed.broadcast(variable.value.data, src=0)
                torch.autograd.graph.increment_version(variable.value)  # written via .data
        torch.manual_seed(seed * 1009 + group.rank)
    step.gradient_sync = GradientAllReduce(group)


def _monitor(train_cfg, data):
    """The log key that picks ``best.keras`` and drives early stopping."""
    if data.val is None:
        if train_cfg.patience is not None:
            raise ValueError("train.patience needs validation data (data.val_source/"
                             "val_target, data.val_tsv, ...): early stopping watches "
                             f"{train_cfg.early_stopping_metric}")
        return "loss"
    return train_cfg.early_stopping_metric


def _evaluate_average(model, data, config, run, metrics):
    """``train.average_last``: average the last checkpoints into ``RUN/averaged.keras`` and
    evaluate it like the final model; ``metrics.json`` gets its scores under ``averaged``
    (the final model's stay at the top level). A run with fewer checkpoints than asked for
    averages those it has (with a warning)."""
    count = config.train.average_last
    available = len(run.checkpoints.epoch_names())
    if available < count:  # a short run: average what there is rather than fail at the end
        log.warning("train.average_last=%d but the run has %d checkpoint(s); averaging "
                    "those", count, available)
    out, paths = average_checkpoints(run.path, min(count, available))
    averaged = load_model(out, compile=False)
    compile_model(averaged, config)  # the loss, for the validation loss
    scores = {"checkpoints": [os.path.basename(p) for p in paths]}
    if data.val is not None:
        scores["val_loss"] = float(averaged.evaluate(data.val, verbose=0,
                                                     return_dict=True)["loss"])
    final = write_final_reports(averaged, data, config, run.path, {}, write=False)
    scores.update({k: v for k, v in final.items() if k.startswith("val_")})
    # samples.txt stays the final model's: write the final metrics with the averaged ones
    metrics = {**metrics, "averaged": scores}
    run.write_metrics(metrics)
    log.info("averaged %d checkpoints into %s: %s", len(paths), out, scores)
    return metrics


def compile_model(model, config, total_steps=None):
    """Masked token cross-entropy and masked accuracy (an encoder classifier: the
    cross-entropy of its class logits and accuracy), and the optimizer of ``train.optimizer``:
    ``paper``: Adam(0.9, 0.98, 1e-9) on the paper's warmup schedule (or a constant
    ``train.learning_rate``); ``adamw_cosine``: nanoGPT's AdamW with warmup and cosine decay
    ending at ``total_steps`` (the run's last optimizer step). With
    ``train.accumulate_steps: k`` the optimizer updates once every k batches
    (:func:`~transformerkit.training.optimizers.with_accumulation`); its steps, the
    schedule, ``max_steps`` and ``checkpoint_every`` count updates."""
    optimizer = with_accumulation(build_optimizer(model, config.train, total_steps),
                                  config.train.accumulate_steps)
    smoothing = config.train.label_smoothing
    if config.model.type == "encoder":  # one class per text, every row counts
        loss = ClassificationCrossEntropy(smoothing)
        metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    else:
        loss, metrics = MaskedCrossEntropy(smoothing), [MaskedAccuracy()]
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics,
                  jit_compile=config.train.jit_compile)


def build_optimizer(model, train_cfg, total_steps=None):
    """The optimizer ``train_cfg.optimizer`` names (``train_cfg``: the ``train:`` section,
    a :class:`~transformerkit.config.TrainOptions`; see :func:`compile_model`)."""
    beta_2, clip_norm = train_cfg.beta_2, train_cfg.clip_norm
    if train_cfg.optimizer == "adamw_cosine":
        peak = train_cfg.learning_rate or 1e-3
        minimum = train_cfg.min_learning_rate or peak / 10
        decay_steps = int(total_steps or train_cfg.max_steps or 1)
        optimizer = gpt_optimizer(peak, train_cfg.warmup_steps, decay_steps, minimum,
                                  beta_2=beta_2 or 0.99, weight_decay=train_cfg.weight_decay,
                                  clip_norm=1.0 if clip_norm is None else clip_norm)
        if cooldown_fraction(train_cfg):  # its cosine, then cooled down (train.cooldown)
            cosine = keras.saving.deserialize_keras_object(
                optimizer.get_config()["learning_rate"])
            optimizer.learning_rate = with_cooldown(cosine, train_cfg, total_steps)
        return optimizer
    # the paper's Adam(0.9, 0.98, 1e-9) (paper_optimizer), on its schedule or a constant rate
    rate = (train_cfg.learning_rate if train_cfg.learning_rate is not None else
            TransformerSchedule(model.d_model, train_cfg.warmup_steps, train_cfg.lr_scale))
    return Adam(with_cooldown(rate, train_cfg, total_steps), beta_1=0.9, epsilon=1e-9,
                beta_2=beta_2 or 0.98, global_clipnorm=clip_norm)


def learning_rates(config, steps, window=None):
    """The learning rate of each optimizer update ``1 .. steps`` of a run of ``config``:
    ``(steps,)`` float NumPy, from the schedule of the optimizer :func:`build_optimizer`
    makes (read back through its public ``get_config``), with ``steps`` as the run's length
    (where ``adamw_cosine`` ends its decay and the cooldown reaches zero), or the cooldown
    ``window`` a run recorded (``metrics.json``: ``Cooldown.window``).
    ``transformerkit plot CONFIG|RUN --lr``."""
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    width = types.SimpleNamespace(d_model=config.model.d_model)  # all it reads
    rate = build_optimizer(width, config.train, steps).get_config()["learning_rate"]
    if not isinstance(rate, dict):  # a constant train.learning_rate
        return np.full(steps, float(rate))
    schedule = keras.saving.deserialize_keras_object(rate)
    if window and isinstance(schedule, Cooldown):
        schedule.start, schedule.end = window["cooldown_start"], window["cooldown_end"]
        schedule.start_progress = window["cooldown_start_progress"]
    return keras.ops.convert_to_numpy(schedule(np.arange(steps)))


def attach_cooldown(optimizer):
    """The :class:`~transformerkit.training.schedules.Cooldown` that ``optimizer``'s learning
    rate follows, or None: its schedule read back through the public ``get_config`` and set
    again through the public ``learning_rate`` setter, so that the object returned is the
    one the optimizer calls (a time budget retargets it: ``StopConditions``)."""
    rate = optimizer.get_config()["learning_rate"]
    if not isinstance(rate, dict):
        return None
    schedule = keras.saving.deserialize_keras_object(rate)
    inner = schedule.schedule if isinstance(schedule, UpdateCountSchedule) else schedule
    if not isinstance(inner, Cooldown):
        return None
    optimizer.learning_rate = schedule
    return inner


def _check_run_dir(run, resume):
    """Create the run directory and check that it is writable (a probe file) and, when
    resuming, that it holds a checkpoint, or otherwise that it holds no run yet."""
    run_dir, checkpoints = run.path, run.checkpoints
    try:
        os.makedirs(run_dir, exist_ok=True)
        probe = os.path.join(run_dir, ".write-test")
        with open(probe, "w") as f:
            f.write("ok")
            f.flush()
            os.fsync(f.fileno())
        os.remove(probe)
    except OSError as err:
        raise OSError(f"run directory {run_dir} is not writable: {err}") from err
    if resume:
        if not checkpoints.has_checkpoint():
            raise FileNotFoundError(f"--resume: no checkpoint in {checkpoints}")
    elif checkpoints.has_checkpoint() or os.path.exists(run.model):
        raise FileExistsError(f"{run_dir} already holds a run; use --resume to continue it or "
                              "--out to choose another directory")


def checkpoint_bytes(model):
    """Rough size of one ``.keras`` checkpoint: float32 weights plus two Adam moments."""
    return 3 * 4 * sum(math.prod(w.shape) for w in model.weights)


def check_disk_space(run_dir, model, keep):
    """Raise ``OSError`` before training if ``run_dir``'s disk cannot hold the checkpoints:
    ``keep`` epoch files + the one being written + ``best.keras`` + ``model.keras``, and
    16 MB for logs and tokenizers."""
    needed = (keep + 3) * checkpoint_bytes(model) + (16 << 20)
    free = shutil.disk_usage(run_dir).free
    if free < needed:
        raise OSError(f"not enough free disk space for {run_dir}: {free / 2**20:,.0f} MB free, "
                      f"about {needed / 2**20:,.0f} MB needed ({keep} + 3 checkpoints of "
                      f"{checkpoint_bytes(model) / 2**20:,.1f} MB); free some space, lower "
                      "train.checkpoints_to_keep or choose another --out")


def _seconds(budget):
    return None if budget is None else parse_duration(budget, "train.time_budget")


def _epochs(train_cfg, steps_per_epoch):  # steps: optimizer updates
    """``train.epochs``, raised if needed so that ``max_steps`` can be reached."""
    epochs = train_cfg.epochs
    if train_cfg.max_steps is not None:
        epochs = max(epochs, math.ceil(train_cfg.max_steps / max(1, steps_per_epoch)))
    return epochs


def _total_steps(train_cfg, steps_per_epoch):
    """Optimizer steps the run will take (``max_steps`` or all its epochs): where
    ``adamw_cosine`` ends its decay."""
    total = _epochs(train_cfg, steps_per_epoch) * max(1, steps_per_epoch)
    return min(total, train_cfg.max_steps or total)


def _tensorboard(run):
    """Per-epoch TensorBoard scalars under ``RUN/logs/`` on every backend, without TensorFlow
    (``training/tensorboard.py``); needs only the ``tensorboard`` package."""
    if importlib.util.find_spec("tensorboard") is None:
        log.info("tensorboard not installed: no TensorBoard logs (history.csv is written); "
                 "%s", install_hint("tensorboard"))
        return []
    return [TensorBoardScalars(run.logs)]
