"""Runs under ``KERAS_BACKEND=jax`` with ``XLA_FLAGS=--xla_force_host_platform_device_count=2``
(started by ``tests/training/test_distribution.py``): trains the same tiny Transformer on the same
batches on one device, data parallel and model parallel, and prints a JSON report.

``python tests/support/distribution_probe.py WORKDIR`` -> stdout: ``{"devices": 2,
"steps": {"none": [loss per step], "data_parallel": [...], "model_parallel": [...]},
"weight_diff": {kind: max |w - w_single|}, "sharding": {kind: {path: spec}},
"train": {kind: [epoch losses of transformerkit.train]}}``.
"""

import contextlib
import csv
import json
import os
import pathlib
import sys

import keras
import numpy as np
from tiny_run import tiny_config

from transformerkit.models import Transformer
from transformerkit.training import MaskedCrossEntropy, attach_train_step
from transformerkit.training.distribution import batch_multiple, build_distribution, divisible
from transformerkit.training.trainer import train

KINDS = ("none", "data_parallel", "model_parallel")


class Batches(keras.utils.PyDataset):
    """Six batches of 5 rows (odd: data parallel pads one row), with padding inside."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.items = []
        for _ in range(6):
            source = rng.integers(1, 40, (5, 7)).astype("int32")  # (rows, source_len)
            target = rng.integers(1, 40, (5, 6)).astype("int32")  # (rows, target_len)
            source[0, 5:], target[1, 4:] = 0, 0
            labels = np.where(target > 0, np.roll(target, -1, 1), 0)
            self.items.append(((source, target), labels))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def train_steps(kind, initial_weights):
    """Per-step training losses (``train_on_batch``), final weights and Q-kernel shardings."""
    dist = build_distribution(kind)
    with dist.scope() if dist else contextlib.nullcontext():
        model = Transformer(40, 40, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                            dropout=0.0, max_length=12, name="t")
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=MaskedCrossEntropy(0.1))
        attach_train_step(model)
        data = divisible(Batches(), dist)
        model(data[0][0])
        if initial_weights is not None:
            model.set_weights(initial_weights)
        initial = model.get_weights()
        losses = [float(model.train_on_batch(*data[i])) for i in range(len(data))]
        rows = [len(data[i][1]) for i in range(len(data))]
        sharding = {w.path: str(getattr(w.value.sharding, "spec", None)) for w in model.weights
                    if w.path.endswith(("query/kernel", "outer/kernel", "embeddings"))}
    return {"losses": losses, "weights": model.get_weights(), "initial": initial,
            "sharding": sharding, "rows": rows, "multiple": batch_multiple(dist)}


def train_runs(workdir):
    """``transformerkit.train`` (the path of the CLI) with each distribution: epoch losses."""
    histories = {}
    for kind in KINDS:
        run_dir = os.path.join(workdir, kind)
        train(tiny_config(pathlib.Path(workdir), distribution=kind), run_dir)
        with open(os.path.join(run_dir, "history.csv")) as f:
            histories[kind] = [float(row["loss"]) for row in csv.DictReader(f)]
    return histories


def main(workdir):
    import jax

    keras.utils.set_random_seed(0)
    single = train_steps("none", None)
    report = {"devices": len(jax.devices()), "steps": {"none": single["losses"]},
              "weight_diff": {}, "sharding": {}, "rows": {}}
    for kind in KINDS[1:]:
        result = train_steps(kind, single["initial"])
        report["steps"][kind] = result["losses"]
        report["weight_diff"][kind] = max(float(np.max(np.abs(a - b))) for a, b in
                                          zip(single["weights"], result["weights"], strict=True))
        report["sharding"][kind] = result["sharding"]
        report["rows"][kind] = result["rows"]
    report["train"] = train_runs(workdir)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
