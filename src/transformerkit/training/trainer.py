"""``transformerkit train``: from a config to a complete run directory.

Read top to bottom: prepare the run directory -> data and tokenizers -> model -> compile
(masked loss, the paper's optimizer) -> ``model.fit`` with checkpoints -> final artefacts.
"""

import importlib.util
import json
import logging
import math
import os
import time

import keras

from transformerkit.config import parse_duration, save_config
from transformerkit.data.pipeline import EpochSync
from transformerkit.files import atomic_path, atomic_write_text
from transformerkit.models.factory import build_model
from transformerkit.saving import load_model
from transformerkit.training.callbacks import (
    NonFiniteLoss,
    RestoreGlobalRNG,
    RunCheckpoint,
    StopConditions,
    read_checkpoint_state,
)
from transformerkit.training.data_setup import prepare_data
from transformerkit.training.losses import MaskedAccuracy, MaskedCrossEntropy
from transformerkit.training.monitors import build_monitors
from transformerkit.training.optimizers import Adam
from transformerkit.training.reports import write_final_reports
from transformerkit.training.schedules import paper_optimizer

log = logging.getLogger("transformerkit")


def train(config, run_dir, resume=False):
    """Train the model of ``config`` into ``run_dir`` and return the final metrics dict."""
    if config["model"]["type"] == "encoder":
        raise ValueError("`train` supports model.type transformer and gpt; train an Encoder "
                         "with model.fit from Python (see README, 'Encoder')")
    checkpoints = os.path.join(run_dir, "checkpoints")
    state = _prepare_run_dir(config, run_dir, checkpoints, resume)
    train_cfg = config["train"]
    keras.utils.set_random_seed(train_cfg["seed"])
    if train_cfg["mixed_precision"]:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")

    data = prepare_data(config, run_dir, reuse_tokenizers=state is not None)
    for key, value in data.info.items():
        log.info("%s: %s", key, value)

    if state is None:
        model = build_model(config["model"], data.source_tokenizer.vocab_size,
                            data.target_tokenizer.vocab_size)
        compile_model(model, config)
        initial_epoch, best = 0, None
    else:  # exact resume: weights, optimizer moments and step, dropout RNG state
        model = load_model(os.path.join(checkpoints, state["checkpoint"]))
        initial_epoch, best = state["epoch"], state["best"]
        log.info("resuming from %s (epoch %d, step %d)", state["checkpoint"], initial_epoch,
                 state["step"])

    stop = StopConditions(train_cfg["max_steps"], _seconds(train_cfg["time_budget"]))
    non_finite = NonFiniteLoss()
    callbacks = [
        EpochSync(data.train), stop, non_finite,
        *([RestoreGlobalRNG(state.get("global_rng"))] if state else []),
        *build_monitors(config, data),  # before the checkpoint/CSV: they log val_bleu
        RunCheckpoint(checkpoints, keep=train_cfg["checkpoints_to_keep"],
                      monitor="val_loss" if data.val is not None else "loss", best=best),
        keras.callbacks.CSVLogger(os.path.join(run_dir, "history.csv"), append=resume),
        *_tensorboard(run_dir),
    ]
    epochs = _epochs(train_cfg, len(data.train))
    started = time.monotonic()
    history = None
    if initial_epoch < epochs:
        # shuffle=False: the dataset orders its own batches as a function of (seed, epoch);
        # Keras' own batch shuffling would draw from NumPy's global RNG and break resume.
        data.train.set_epoch(initial_epoch)
        history = model.fit(data.train, validation_data=data.val, epochs=epochs,
                            initial_epoch=initial_epoch, callbacks=callbacks, shuffle=False,
                            verbose=train_cfg["verbose"])
    if non_finite.failed_step is not None:
        raise FloatingPointError(
            f"the loss became NaN or inf at step {non_finite.failed_step}; the last good "
            f"checkpoint is in {checkpoints}. Lower the learning rate (train.lr_scale) or check "
            "the data.")
    with atomic_path(os.path.join(run_dir, "model.keras")) as tmp:
        model.save(tmp)
    summary = {
        "train_seconds": round(time.monotonic() - started, 1),
        "steps": int(model.optimizer.iterations.numpy()),
        "stopped_by": stop.stopped_by or "epochs",
        **data.info,
    }
    if history is not None:
        summary.update({k: float(v[-1]) for k, v in history.history.items()})
    return write_final_reports(model, data, config, run_dir, summary)


def compile_model(model, config):
    """Masked token cross-entropy, masked accuracy, Adam(0.9, 0.98, 1e-9) on the paper's
    warmup schedule (or a constant ``train.learning_rate``)."""
    train_cfg = config["train"]
    if train_cfg["learning_rate"] is not None:
        optimizer = Adam(train_cfg["learning_rate"], beta_1=0.9, beta_2=0.98,
                                          epsilon=1e-9)
    else:
        optimizer = paper_optimizer(model.d_model, train_cfg["warmup_steps"],
                                    train_cfg["lr_scale"])
    model.compile(optimizer=optimizer,
                  loss=MaskedCrossEntropy(train_cfg["label_smoothing"]),
                  metrics=[MaskedAccuracy()], jit_compile=train_cfg["jit_compile"])


def _prepare_run_dir(config, run_dir, checkpoints, resume):
    """Create and check ``run_dir``; return the checkpoint state when resuming."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        probe = os.path.join(run_dir, ".write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as err:
        raise OSError(f"run directory {run_dir} is not writable: {err}") from err
    state = read_checkpoint_state(checkpoints)
    if resume:
        if state is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {checkpoints}")
        return state
    if state is not None or os.path.exists(os.path.join(run_dir, "model.keras")):
        raise FileExistsError(f"{run_dir} already holds a run; use --resume to continue it or "
                              "--out to choose another directory")
    save_config(config, os.path.join(run_dir, "config.yaml"))
    return None


def _seconds(budget):
    return None if budget is None else parse_duration(budget, "train.time_budget")


def _epochs(train_cfg, steps_per_epoch):
    """``train.epochs``, raised if needed so that ``max_steps`` can be reached."""
    epochs = train_cfg["epochs"]
    if train_cfg["max_steps"] is not None:
        epochs = max(epochs, math.ceil(train_cfg["max_steps"] / max(1, steps_per_epoch)))
    return epochs


def _tensorboard(run_dir):
    """Keras' TensorBoard callback writes through ``tf.summary``: only when TF is installed."""
    if importlib.util.find_spec("tensorflow") is None or \
            importlib.util.find_spec("tensorboard") is None:
        log.info("tensorflow/tensorboard not installed: no TensorBoard logs (history.csv is "
                 "written)")
        return []
    return [keras.callbacks.TensorBoard(os.path.join(run_dir, "logs"))]


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.json"), encoding="utf-8") as f:
        return json.load(f)


__all__ = ["compile_model", "read_metrics", "train", "atomic_write_text"]
