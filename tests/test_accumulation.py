"""Gradient accumulation (``train.accumulate_steps``) equals one k-times-larger batch: the
weights after two updates of 3 micro-batches with different real-token counts match two
updates on the two large batches made of them (token-weighted, not a plain mean), the
optimizer and the learning-rate schedule count updates, the masked accuracy is the large
batch's. With SGD (linear in the gradient) and the paper's Adam on its warmup schedule
(``accumulation_probe.py``). On the default backend in-process, with and without the fast
paths (seconds); on every backend in subprocesses (slow: JAX and TensorFlow compile each
batch shape)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from accumulation_probe import compute
from conftest import BACKENDS

from transformerkit import fastpath

PROBE = os.path.join(os.path.dirname(__file__), "accumulation_probe.py")
# Keras' TensorFlow Adam squares the values of an embedding's IndexedSlices gradient before
# duplicate token ids are summed (ops.square on the slices), so its own large-batch step is
# not the dense large-batch Adam step that torch and JAX take, and that the accumulated
# (dense) step takes on TensorFlow too; SGD checks TensorFlow's accumulation exactly.
TF_SPARSE_ADAM = ("tensorflow", "adam")


def check(result, optimizer):
    accumulated, large = f"{optimizer}/accumulated", f"{optimizer}/large"
    assert result[f"{accumulated}/steps"] == result[f"{large}/steps"] == 2  # updates
    np.testing.assert_allclose(result[f"{accumulated}/learning_rate"],
                               result[f"{large}/learning_rate"], rtol=1e-7)
    np.testing.assert_allclose(result[f"{accumulated}/accuracy"], result[f"{large}/accuracy"],
                               rtol=1e-6)
    keys = sorted(k.removeprefix(f"{large}/") for k in result
                  if k.startswith(f"{large}/weight/"))
    assert keys
    moved = 0
    for key in keys:
        np.testing.assert_allclose(result[f"{accumulated}/{key}"], result[f"{large}/{key}"],
                                   rtol=1e-5, atol=2e-6, err_msg=key)
        moved += not np.allclose(result[f"{large}/{key}"],
                                 result[f"initial/{key.removeprefix('weight/')}"])
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
    assert not np.allclose(result[key], result[key.replace("large", "accumulated")],
                           rtol=1e-5, atol=2e-6)


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
