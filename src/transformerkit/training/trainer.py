"""``transformerkit train``: from a config to a complete run directory.

Read top to bottom: prepare the run directory -> data and tokenizers -> model -> compile
(masked loss, the paper's optimizer) -> ``model.fit`` with checkpoints -> final artefacts.

Where the gradient step is: ``model.fit`` calls, for every batch,
``TransformerBase.train_step`` in ``models/base.py``: the forward pass (``call`` of
``models/transformer.py`` or ``models/gpt.py``, built from ``layers/``), the loss
(``training/losses.py: masked_cross_entropy``), the backward pass and the update
(``training/optimizers.py: Adam``, or ``training/gpt_recipe.py`` for ``adamw_cosine``).
"""

import contextlib
import importlib.util
import logging
import math
import os
import shutil
import time

import keras

from transformerkit.config import parse_duration, save_config
from transformerkit.data.pipeline import EpochSync
from transformerkit.files import atomic_path
from transformerkit.models.factory import build_model
from transformerkit.run_directory import RunDirectory
from transformerkit.training.callbacks import (
    EpochTimer,
    NonFiniteLoss,
    RestoreGlobalRNG,
    RunCheckpoint,
    StopConditions,
    load_checkpoint,
)
from transformerkit.training.data_setup import prepare_data
from transformerkit.training.distribution import (
    build_distribution,
    check_model_parallel_shapes,
    divisible,
)
from transformerkit.training.gpt_recipe import gpt_optimizer
from transformerkit.training.losses import MaskedAccuracy, MaskedCrossEntropy
from transformerkit.training.monitors import build_monitors
from transformerkit.training.optimizers import Adam
from transformerkit.training.precision import precision_of, precision_policy
from transformerkit.training.reports import write_final_reports
from transformerkit.training.schedules import paper_optimizer
from transformerkit.training.tensorboard import TensorBoardScalars

log = logging.getLogger("transformerkit")


def train(config, run_dir, resume=False):
    """Train the model of ``config`` into ``run_dir`` and return the final metrics dict.

    Raises before any training step: ``OSError`` for a run directory that is not writable
    or a disk without room for the checkpoints, ``ValueError`` for a distribution the
    backend or the devices cannot do; during training ``FloatingPointError`` naming the
    step where the loss became NaN or inf (the last good checkpoint is kept).
    """
    if config["model"]["type"] == "encoder":
        raise ValueError("`train` supports model.type transformer and gpt; train an Encoder "
                         "with model.fit from Python (see README, 'Encoder')")
    run = RunDirectory(run_dir)
    checkpoints = run.checkpoints
    train_cfg = config["train"]
    _check_run_dir(run, resume)
    dist = build_distribution(train_cfg["distribution"], train_cfg["devices"],
                              train_cfg["model_parallel_size"])
    if not resume:
        save_config(config, run.config)
    keras.utils.set_random_seed(train_cfg["seed"])
    with precision_policy(precision_of(train_cfg)), \
            (dist.scope() if dist else contextlib.nullcontext()):
        return _train(config, run, checkpoints, resume, dist)


def _train(config, run, checkpoints, resume, dist):
    train_cfg = config["train"]
    data = prepare_data(config, run, reuse_tokenizers=resume)
    for key, value in data.info.items():
        log.info("%s: %s", key, value)

    if not resume:
        model = build_model(config["model"], data.source_tokenizer.vocab_size,
                            data.target_tokenizer.vocab_size)
        compile_model(model, config, _total_steps(train_cfg, len(data.train)))
        state, initial_epoch, best = None, 0, None
    else:  # exact resume: weights, optimizer moments and step, dropout RNG state
        model, state = load_checkpoint(checkpoints)
        initial_epoch, best = state["epoch"], state["best"]
        log.info("resuming from %s (epoch %d, step %d)", state["checkpoint"], initial_epoch,
                 state["step"])
    check_model_parallel_shapes(model, dist)
    check_disk_space(run.path, model, train_cfg["checkpoints_to_keep"])

    stop = StopConditions(train_cfg["max_steps"], _seconds(train_cfg["time_budget"]))
    non_finite = NonFiniteLoss()
    callbacks = [
        EpochSync(data.train), EpochTimer(), stop, non_finite,
        *([RestoreGlobalRNG(state.get("global_rng"))] if state else []),
        *build_monitors(config, data),  # before the checkpoint/CSV: they log val_bleu
        RunCheckpoint(checkpoints, keep=train_cfg["checkpoints_to_keep"],
                      monitor="val_loss" if data.val is not None else "loss", best=best),
        keras.callbacks.CSVLogger(run.history, append=resume),
        *_tensorboard(run),
    ]
    epochs = _epochs(train_cfg, len(data.train))
    started = time.monotonic()
    history = None
    if initial_epoch < epochs:
        # shuffle=False: the dataset orders its own batches as a function of (seed, epoch);
        # Keras' own batch shuffling would draw from NumPy's global RNG and break resume.
        data.train.set_epoch(initial_epoch)
        history = model.fit(divisible(data.train, dist),
                            validation_data=divisible(data.val, dist), epochs=epochs,
                            initial_epoch=initial_epoch, callbacks=callbacks, shuffle=False,
                            verbose=train_cfg["verbose"])
    if non_finite.failed_step is not None:
        raise FloatingPointError(
            f"the loss became {non_finite.failed_value} at step {non_finite.failed_step} "
            f"(epoch {non_finite.failed_epoch + 1}); training stopped and the last good "
            f"checkpoint is kept in {checkpoints}. Lower the learning rate (train.lr_scale or "
            "train.learning_rate) or check the data, then --resume.")
    with atomic_path(run.model) as tmp:
        model.save(tmp)
    summary = {
        "train_seconds": round(time.monotonic() - started, 1),
        "steps": int(model.optimizer.iterations.numpy()),
        "stopped_by": stop.stopped_by or "epochs",
        **data.info,
    }
    if history is not None:
        summary.update({k: float(v[-1]) for k, v in history.history.items()})
    return write_final_reports(model, data, config, run, summary)


def compile_model(model, config, total_steps=None):
    """Masked token cross-entropy, masked accuracy and the optimizer of ``train.optimizer``:
    ``paper``: Adam(0.9, 0.98, 1e-9) on the paper's warmup schedule (or a constant
    ``train.learning_rate``); ``adamw_cosine``: nanoGPT's AdamW with warmup and cosine decay
    ending at ``total_steps`` (the run's last optimizer step)."""
    model.compile(optimizer=build_optimizer(model, config["train"], total_steps),
                  loss=MaskedCrossEntropy(config["train"]["label_smoothing"]),
                  metrics=[MaskedAccuracy()], jit_compile=config["train"]["jit_compile"])


def build_optimizer(model, train_cfg, total_steps=None):
    """The optimizer named by ``train_cfg["optimizer"]`` (see :func:`compile_model`)."""
    beta_2, clip_norm = train_cfg["beta_2"], train_cfg["clip_norm"]
    if train_cfg["optimizer"] == "adamw_cosine":
        peak = train_cfg["learning_rate"] or 1e-3
        minimum = train_cfg["min_learning_rate"] or peak / 10
        decay_steps = int(total_steps or train_cfg["max_steps"] or 1)
        return gpt_optimizer(peak, train_cfg["warmup_steps"], decay_steps, minimum,
                             beta_2=beta_2 or 0.99, weight_decay=train_cfg["weight_decay"],
                             clip_norm=1.0 if clip_norm is None else clip_norm)
    extra = dict(beta_2=beta_2 or 0.98, global_clipnorm=clip_norm)
    if train_cfg["learning_rate"] is not None:
        return Adam(train_cfg["learning_rate"], beta_1=0.9, epsilon=1e-9, **extra)
    return paper_optimizer(model.d_model, train_cfg["warmup_steps"], train_cfg["lr_scale"],
                           **extra)


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


def _epochs(train_cfg, steps_per_epoch):
    """``train.epochs``, raised if needed so that ``max_steps`` can be reached."""
    epochs = train_cfg["epochs"]
    if train_cfg["max_steps"] is not None:
        epochs = max(epochs, math.ceil(train_cfg["max_steps"] / max(1, steps_per_epoch)))
    return epochs


def _total_steps(train_cfg, steps_per_epoch):
    """Optimizer steps the run will take (``max_steps`` or all its epochs): where
    ``adamw_cosine`` ends its decay."""
    total = _epochs(train_cfg, steps_per_epoch) * max(1, steps_per_epoch)
    return min(total, train_cfg["max_steps"] or total)


def _tensorboard(run):
    """Per-epoch TensorBoard scalars under ``RUN/logs/`` on every backend, without TensorFlow
    (``training/tensorboard.py``); needs only the ``tensorboard`` package."""
    if importlib.util.find_spec("tensorboard") is None:
        log.info("tensorboard not installed: no TensorBoard logs (history.csv is written); "
                 "pip install tensorboard")
        return []
    return [TensorBoardScalars(run.logs)]
