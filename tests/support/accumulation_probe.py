"""Gradient accumulation against one large batch on the backend of this process
(``KERAS_BACKEND``): run by ``tests/training/test_accumulation.py`` once per backend.

Usage: ``python accumulation_probe.py OUT.npz``. Builds a tiny Transformer (no dropout),
trains a copy for two updates of ``k = 3`` accumulated micro-batches of different sizes and
real-token counts (``train.accumulate_steps`` machinery: ``UpdateBatches``,
``with_accumulation``, ``TrainStep.compute_loss``) and another copy for two updates
on the same pairs as two large batches, and saves both weights, the optimizer steps and the
masked accuracies.
"""

import sys

import keras
import numpy as np

from transformerkit.data.padding import pad_batch
from transformerkit.data.pipeline import teacher_forcing
from transformerkit.models.factory import build_model
from transformerkit.training.accumulation import UpdateBatches
from transformerkit.training.losses import MaskedAccuracy, MaskedCrossEntropy
from transformerkit.training.optimizers import optimizer_steps, with_accumulation
from transformerkit.training.schedules import paper_optimizer
from transformerkit.training.step import attach_train_step

VOCAB, K = 20, 3


class Batches(keras.utils.PyDataset):
    """A fixed list of batches (an epoch dataset without shuffling)."""

    def __init__(self, batches):
        super().__init__()
        self.batches, self.epoch = batches, 0

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        return self.batches[i]

    def set_epoch(self, epoch):
        self.epoch = epoch


def make_pairs(rng, count):
    """``count`` (source, target) id arrays of random lengths (target: BOS .. EOS)."""
    pairs = []
    for _ in range(count):
        source = rng.integers(4, VOCAB, rng.integers(2, 9)).tolist() + [2]
        target = [1] + rng.integers(4, VOCAB, rng.integers(1, 8)).tolist() + [2]
        pairs.append((source, target))
    return pairs


class PlainMean(keras.utils.PyDataset):
    """Micro-batches whose update token count says each has the same share (a plain mean)."""

    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        x, labels, _ = self.batches[i]
        share = np.count_nonzero(labels) * K
        return x, labels, np.full((len(labels),), share, dtype="float32")


def batch(pairs):
    """One padded batch; every batch has the same width (one shape to compile on JAX and
    TensorFlow per batch size), their real-token counts differ."""
    source = pad_batch([s for s, _ in pairs], 9)
    decoder_input, labels = teacher_forcing(pad_batch([t for _, t in pairs], 9))
    return (source, decoder_input), labels


def fresh_model(first_batch, weights=None):
    """The tiny Transformer, built; with ``weights`` (a list of arrays) set."""
    model = build_model({"type": "transformer", "num_layers": 1, "d_model": 16, "num_heads": 2,
                         "d_ff": 32, "dropout": 0.0, "max_length": 16}, VOCAB, VOCAB)
    model(first_batch[0])
    if weights is not None:
        model.set_weights(weights)
    return model


def optimizers():
    """Name -> optimizer factory: SGD (the update is linear in the gradient) and the paper's
    Adam on its warmup schedule with clipping (with a large epsilon, so that elements whose
    gradient is round-off noise do not get a full-size Adam step of random sign)."""
    return {"sgd": lambda: keras.optimizers.SGD(0.5),
            "adam": lambda: paper_optimizer(16, warmup_steps=4,
                                            epsilon=1e-3)}


def compute(token_weighted=True):
    """The probe's arrays (see the module docstring). ``token_weighted=False`` gives every
    micro-batch the same weight (Keras' plain mean), for the test that shows it differs."""
    rng = np.random.default_rng(0)
    sizes = [3] * 6  # rows of the micro-batches: 2 updates of K = 3
    pairs = make_pairs(rng, sum(sizes))
    micro, start = [], 0
    for size in sizes:
        micro.append(batch(pairs[start:start + size]))
        start += size
    large = [batch(pairs[:sum(sizes[:K])]), batch(pairs[sum(sizes[:K]):])]

    keras.utils.set_random_seed(0)
    initial = fresh_model(micro[0]).get_weights()
    results = {}
    for optimizer, make in optimizers().items():
        for name, batches, steps in (("accumulated", micro, K), ("large", large, 1)):
            model = fresh_model(micro[0], initial)
            model.compile(optimizer=with_accumulation(make(), steps),
                          loss=MaskedCrossEntropy(0.1), metrics=[MaskedAccuracy()])
            attach_train_step(model)
            data = UpdateBatches(Batches(batches), steps)
            if not token_weighted and steps > 1:
                data = PlainMean(data)
            history = model.fit(data, epochs=1,
                                shuffle=False, verbose=0)
            prefix = f"{optimizer}/{name}"
            results[f"{prefix}/steps"] = np.array(optimizer_steps(model.optimizer))
            results[f"{prefix}/accuracy"] = np.array(history.history["masked_accuracy"][-1])
            results[f"{prefix}/learning_rate"] = np.array(
                keras.ops.convert_to_numpy(model.optimizer.learning_rate))
            for i, w in enumerate(model.trainable_weights):
                results[f"{prefix}/weight/{i}"] = keras.ops.convert_to_numpy(w)
    for i, w in enumerate(model.trainable_weights):  # the initial values, same order
        results[f"initial/{i}"] = initial[[id(v) for v in model.weights].index(id(w))]
    return results


def main(out):
    np.savez(out, **compute())


if __name__ == "__main__":
    main(sys.argv[1])
