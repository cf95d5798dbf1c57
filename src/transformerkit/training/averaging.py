"""Checkpoint averaging (paper section 6.1: "a single model obtained by averaging the last 5
checkpoints" for the base models, the last 20 for the big ones).

``transformerkit average RUN --last N`` and ``train.average_last: N`` write the element-wise
mean of the weights of a run's last N checkpoints (in ``RUN/checkpoints``, ordered by their
position in training) to ``RUN/averaged.keras``, a model ``transformerkit.load(RUN,
checkpoint="averaged")`` and ``--checkpoint averaged`` load.
"""

import os

import numpy as np

from transformerkit.files import atomic_path
from transformerkit.run_directory import RunDirectory
from transformerkit.saving import load_model


def last_checkpoints(run_dir, count):
    """Paths of the last ``count`` checkpoints of the run in ``run_dir``, oldest first.

    Raises ``ValueError`` when ``count`` < 1 and ``FileNotFoundError`` when the run holds
    fewer than ``count`` checkpoints.
    """
    if int(count) < 1:
        raise ValueError(f"--last must be positive, got {count}")
    checkpoints = RunDirectory(run_dir).checkpoints
    names = checkpoints.epoch_names()
    if len(names) < count:
        raise FileNotFoundError(
            f"{checkpoints} holds {len(names)} checkpoint(s), fewer than the {count} to "
            "average; lower --last, or train with train.checkpoints_to_keep >= "
            f"{count} (and train.checkpoint_every for more checkpoints per epoch)")
    return [checkpoints.file(name) for name in names[-int(count):]]


def average_weights(paths):
    """``(model, weights)``: the model of the last of ``paths`` (``.keras`` files) and the
    mean of their weights, in float64 and cast back to each weight's dtype. Weights that
    are not floating point (random-generator states, counters) are the last file's.

    Raises ``ValueError`` naming the file when the checkpoints are not of one architecture
    (another number of weights or another shape).
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    model = load_model(paths[-1], compile=False)
    reference = model.get_weights()
    sums = [np.zeros(w.shape, dtype="float64") for w in reference]
    for path in paths:
        weights = reference if path == paths[-1] else load_model(path, compile=False)\
            .get_weights()
        if len(weights) != len(reference):
            raise ValueError(f"{path} has {len(weights)} weights, {paths[-1]} has "
                             f"{len(reference)}: checkpoints of different models cannot be "
                             "averaged")
        for i, (w, ref) in enumerate(zip(weights, reference, strict=True)):
            if w.shape != ref.shape:
                raise ValueError(f"weight {i} ({model.weights[i].path}) has shape {w.shape} "
                                 f"in {path} but {ref.shape} in {paths[-1]}: checkpoints of "
                                 "different models cannot be averaged")
            sums[i] += w
    averaged = [(s / len(paths)).astype(ref.dtype) if np.issubdtype(ref.dtype, np.floating)
                else ref for s, ref in zip(sums, reference, strict=True)]
    return model, averaged


def average_checkpoints(run_dir, last, out=None):
    """Average the last ``last`` checkpoints of ``run_dir`` into ``out`` (default
    ``RUN/averaged.keras``), written atomically (weights only, no optimizer state). Returns
    ``(out, paths averaged)``."""
    paths = last_checkpoints(run_dir, last)
    model, weights = average_weights(paths)
    model.set_weights(weights)
    out = os.fspath(out) if out is not None else RunDirectory(run_dir).averaged
    if not out.endswith(".keras"):
        raise ValueError(f"--out must name a .keras file, got {out}")
    with atomic_path(out) as tmp:
        model.save(tmp)
    return out, paths
