"""Gradient accumulation (``train.accumulate_steps``) equals one k-times-larger batch: the
weights after two updates of 3 micro-batches with different real-token counts match two
updates on the two large batches made of them (token-weighted, not a plain mean), the
optimizer and the learning-rate schedule count updates, the masked accuracy is the large
batch's. With SGD (linear in the gradient) and the paper's Adam on its warmup schedule
(``accumulation_probe.py``). On the default backend in-process, with and without the fast
paths (seconds); on every backend in subprocesses (slow: JAX and TensorFlow compile each
batch shape).

Tolerances (``tests/support/tolerances.py``): the two paths compute the same gradients in another
order (micro-batches summed, or one batch), each within a gradient's rounding bound
(:func:`gradient_roundings`); SGD's weights then differ by at most
``tolerances.sgd_weights_atol`` (2e-4), Adam's by at most :func:`adam_weights_atol` (the
probe's epsilon of 1e-3 bounds how much Adam magnifies a gradient's difference; 3.6e-2,
about 40% of the most Adam's two steps move a weight: SGD is the sharp check, Adam's
catches gross errors such as a plain mean, 0.14). Step counts, learning rates and
accuracies (integer counts) are exact. The power check counts the update's tokens one too
many (``N + 1``), a 1/N scaling of the accumulated gradient (SGD: 17 times its bound).
Mutation tried by hand: the schedule counting micro-batches, not updates (caught by the
exact learning rates).
"""

import functools
import os
import subprocess
import sys

import numpy as np
import pytest
import tolerances as tol
from accumulation_probe import VOCAB, K, batch, compute, fresh_model, make_pairs
from backends import BACKENDS
from paths import SUPPORT_DIR

from transformerkit import fastpath
from transformerkit.training.step import TrainStep

PROBE = str(SUPPORT_DIR / "accumulation_probe.py")
# Keras' TensorFlow Adam squares the values of an embedding's IndexedSlices gradient before
# duplicate token ids are summed (ops.square on the slices), so its own large-batch step is
# not the dense large-batch Adam step that torch and JAX take, and that the accumulated
# (dense) step takes on TensorFlow too; SGD checks TensorFlow's accumulation exactly.
TF_SPARSE_ADAM = ("tensorflow", "adam")
SGD_RATE, ADAM_BETAS, ADAM_EPSILON = 0.5, (0.9, 0.98), 1e-3  # accumulation_probe.optimizers
ROWS, SOURCE_LEN, TARGET_LEN = 9, 9, 8  # a large batch (accumulation_probe.batch)


def adam_rate(step):
    """The probe's paper schedule (d_model 16, warmup 4) at update ``step`` (from 1)."""
    return 16 ** -0.5 * min(step ** -0.5, step * 4 ** -1.5)


@functools.cache
def gradient_roundings():
    """A gradient of the probe's model: the forward pass, the loss, the backward pass (its
    products as long as the forward's), each weight's sum over a large batch's tokens, the
    sum of the K micro-batches and their token weights."""
    model = fresh_model(batch(make_pairs(np.random.default_rng(0), 3)))
    tokens = ROWS * max(SOURCE_LEN, TARGET_LEN)
    return (2 * tol.model_roundings(model, SOURCE_LEN, TARGET_LEN)
            + tol.cross_entropy_roundings(VOCAB, tokens) + tokens + K + 2)


def adam_weights_atol(gradient_roundings, rates, weights, paths=2):
    """Adam weights after steps at ``rates`` from the same start, on ``paths`` whose gradients
    each carry ``gamma(gradient_roundings)`` (entries of order at most one, as in
    ``tolerances.sgd_weights_atol``), to first order. m_hat (an average of the gradients) and
    sqrt(v_hat) (a weighted 2-norm of them) each move by at most the gradients' difference
    D, so m_hat / (sqrt(v_hat) + epsilon) moves by at most D (1 + R) / epsilon, R the largest
    |m_hat| / sqrt(v_hat) (Cauchy-Schwarz), and never by more than 2 R; plus the rounding of
    the update, ``gamma(STEP) R`` of the rate and u |w|."""
    b1, b2 = ADAM_BETAS
    difference = paths * tol.gamma(gradient_roundings)
    total = 0.0
    for t, rate in enumerate(rates, start=1):
        a = (1 - b1) * b1 ** np.arange(t) / (1 - b1 ** t)  # m_hat's weights of the gradients
        b = (1 - b2) * b2 ** np.arange(t) / (1 - b2 ** t)  # v_hat's
        ratio = float(np.sqrt(np.sum(a * a / b)))
        total += rate * (min(difference * (1 + ratio) / ADAM_EPSILON, 2 * ratio)
                         + paths * tol.gamma(3 * tol.ELEMENTWISE_ULPS + 6) * ratio)
    return total + paths * len(rates) * tol.U32 * np.abs(np.asarray(weights, np.float64))


def weights_atol(optimizer, weights):
    if optimizer == "sgd":
        return tol.sgd_weights_atol(gradient_roundings(), SGD_RATE, 2, weights)
    return adam_weights_atol(gradient_roundings(), [adam_rate(1), adam_rate(2)], weights)


def check(result, optimizer):
    accumulated, large = f"{optimizer}/accumulated", f"{optimizer}/large"
    assert result[f"{accumulated}/steps"] == result[f"{large}/steps"] == 2  # updates
    # exact: the same schedule at the same update count
    np.testing.assert_array_equal(result[f"{accumulated}/learning_rate"],
                                  result[f"{large}/learning_rate"])
    # exact: counts of right tokens (unless two logits tie within rounding) over real tokens
    np.testing.assert_array_equal(result[f"{accumulated}/accuracy"],
                                  result[f"{large}/accuracy"])
    keys = sorted(k.removeprefix(f"{large}/") for k in result
                  if k.startswith(f"{large}/weight/"))
    assert keys
    moved = 0
    for key in keys:
        atol = weights_atol(optimizer, result[f"{large}/{key}"])
        tol.assert_within(result[f"{accumulated}/{key}"], result[f"{large}/{key}"], atol,
                          err_msg=key)
        initial = result[f"initial/{key.removeprefix('weight/')}"]
        moved += bool((np.abs(result[f"{large}/{key}"] - initial) > atol).any())
    assert moved > len(keys) // 2  # the updates are real (a key bias gets no gradient)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-paths", "plain-keras"])
def test_accumulation_on_the_default_backend(monkeypatch, fast):
    monkeypatch.setattr(fastpath, "ENABLED", fast)
    result = compute()
    for optimizer in ("sgd", "adam"):
        check(result, optimizer)


def test_a_plain_mean_would_differ():
    """The micro-batches' token counts differ, so the token weighting matters: the plain
    mean of their gradients (Keras' accumulation alone) is not the large batch's update."""
    result = compute(token_weighted=False)
    key = "sgd/large/weight/0"
    difference = np.abs(result[key] - result[key.replace("large", "accumulated")])
    assert (difference > weights_atol("sgd", result[key])).any()


def test_tolerances_still_catch_an_update_token_count_off_by_one(monkeypatch):
    """The update's token count N taken as N + 1: each micro-batch's loss weight
    ``k n_i / N`` too small by 1/(N + 1), so the accumulated update is (1 - 1/(N + 1)) of
    the large batch's."""
    compute_loss = TrainStep.compute_loss

    def off_by_one(self, model, x=None, y=None, y_pred=None, sample_weight=None,
                   training=True):
        if sample_weight is not None:
            sample_weight = sample_weight + 1.0
        return compute_loss(self, model, x, y, y_pred, sample_weight, training=training)

    monkeypatch.setattr(TrainStep, "compute_loss", off_by_one)
    tol.assert_caught(test_accumulation_on_the_default_backend, monkeypatch, True)


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """Run the probe on every backend (in parallel subprocesses): ``{backend: npz}``."""
    folder = tmp_path_factory.mktemp("accumulation")
    running = {}
    for backend in BACKENDS:
        out = folder / f"{backend}.npz"
        env = dict(os.environ, KERAS_BACKEND=backend)
        running[backend] = (out, subprocess.Popen(
            [sys.executable, PROBE, str(out)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    results = {}
    for backend, (out, process) in running.items():
        output, _ = process.communicate(timeout=900)
        assert process.returncode == 0, f"{backend}: {output[-3000:]}"
        results[backend] = dict(np.load(out))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_accumulation_on_every_backend(probes, backend, optimizer):
    if (backend, optimizer) == TF_SPARSE_ADAM:
        pytest.skip("Keras' TensorFlow Adam on IndexedSlices is not the dense large-batch "
                    "step (see TF_SPARSE_ADAM); SGD covers TensorFlow")
    check(probes[backend], optimizer)
