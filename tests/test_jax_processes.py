"""Data-parallel training over several JAX processes (``jax.distributed``, gloo between CPU
processes), launched as JAX and Keras users launch it: every process runs the same command
with ``KERAS_DISTRIBUTION_JOB_ADDRESSES`` (process 0's host:port),
``KERAS_DISTRIBUTION_NUM_PROCESSES`` and its own ``KERAS_DISTRIBUTION_PROCESS_ID``.

Two processes with one CPU device each train a 1-layer d_model 16 model with
``train.distribution: data_parallel``: every step each process feeds its half of the rows
of the same global batch (``DivisibleBatches``) and XLA all-reduces the gradients, so the
final weights equal one process trained on the whole batches (tolerance: float32 sums in
another order). Process 0 alone writes the run directory. A process whose peers never come
is stopped after ``train.process_timeout`` with a clear message (``processes.py``'s watchdog;
JAX itself would abort later with a C++ stack trace). Every wait has a timeout.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from tiny_run import write_corpus

pytestmark = pytest.mark.slow

LAUNCH_TIMEOUT = 300  # seconds one launch may take on a busy 2-core machine (JAX compiles)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = {**os.environ, "KERAS_BACKEND": "jax", "OMP_NUM_THREADS": "1",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1 "
                        "--xla_backend_optimization_level=0",
           "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    for key in ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                "KERAS_DISTRIBUTION_PROCESS_ID"):
        env.pop(key, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _config(folder, name, **train):
    config = {
        "model": {"num_layers": 1, "d_model": 16, "num_heads": 2, "d_ff": 32, "dropout": 0.0,
                  "max_length": 40},
        "data": {"dataset": "parallel", "train_source": str(folder / "train.de"),
                 "train_target": str(folder / "train.en"), "tokenizer": "char",
                 "batch_size": 8, "pad_to_multiple": 32},  # one batch shape: one compile
        "train": {"epochs": 1, "max_steps": 3, "learning_rate": 0.003, "verbose": 0,
                  "samples": 0, "eval_max_sentences": 1, "process_timeout": "90s", **train}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _command(config, out, *extra):
    return [sys.executable, "-m", "transformerkit", "train", config, "--out", str(out), *extra]


def _launch(config, out, processes=2, *extra):
    """Start ``processes`` JAX processes of one run; -> their CompletedProcess-like results."""
    address = f"127.0.0.1:{_free_port()}"
    running = [subprocess.Popen(
        _command(config, out, *extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=_env(KERAS_DISTRIBUTION_JOB_ADDRESSES=address,
                            KERAS_DISTRIBUTION_NUM_PROCESSES=processes,
                            KERAS_DISTRIBUTION_PROCESS_ID=index))
        for index in range(processes)]
    results = []
    try:
        for process in running:
            output, _ = process.communicate(timeout=LAUNCH_TIMEOUT)
            results.append((process.returncode, output))
    finally:
        for process in running:
            process.kill()
    return results


def _weights(run):
    """``{path: array}`` of the run's final model, without the attention key biases: their
    gradient is zero in exact arithmetic (a bias added to every key shifts all scores of a
    query equally, which the softmax ignores), so Adam scales float rounding noise into
    full-size steps whose signs depend on the summation order."""
    from keras import ops

    from transformerkit.saving import load_model

    model = load_model(str(run / "model.keras"), compile=False)
    return {w.path: ops.convert_to_numpy(w.value) for w in model.weights
            if not w.path.endswith("key/bias")}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("jax-processes")
    write_corpus(path, pairs=48)
    return path


def test_two_jax_processes_equal_one_process(folder):
    config = _config(folder, "equal", distribution="data_parallel")
    results = _launch(config, folder / "two")
    for code, output in results:
        assert code == 0, output[-4000:]
    assert "JAX process 1 of 2" in results[1][1]
    one = subprocess.run(_command(_config(folder, "one"), folder / "one"), env=_env(),
                         capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert one.returncode == 0, one.stderr[-4000:]
    two_weights, one_weights = _weights(folder / "two"), _weights(folder / "one")
    assert two_weights.keys() == one_weights.keys() and len(two_weights) > 20
    for path, value in two_weights.items():
        np.testing.assert_allclose(value, one_weights[path], rtol=1e-5, atol=1e-6,
                                   err_msg=path)
    metrics = json.loads((folder / "two" / "metrics.json").read_text())
    assert metrics["steps"] == 3
    reference = json.loads((folder / "one" / "metrics.json").read_text())
    assert metrics["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    # only process 0 wrote: one history, the checkpoints of one run
    assert len((folder / "two" / "history.csv").read_text().splitlines()) == 2
    assert sorted(os.listdir(folder / "two" / "checkpoints")) == sorted(
        os.listdir(folder / "one" / "checkpoints"))


def test_a_process_without_peers_stops_within_the_timeout(folder):
    config = _config(folder, "alone", distribution="data_parallel", process_timeout="15s")
    address = f"127.0.0.1:{_free_port()}"
    # process 1 of 2, whose coordinator (process 0) never starts: stopped by the watchdog
    # (SIGTERM) after 15 s, long before JAX's own abort
    started = time.monotonic()
    result = subprocess.run(_command(config, folder / "alone"), capture_output=True,
                            text=True, timeout=120,
                            env=_env(KERAS_DISTRIBUTION_JOB_ADDRESSES=address,
                                     KERAS_DISTRIBUTION_NUM_PROCESSES=2,
                                     KERAS_DISTRIBUTION_PROCESS_ID=1))
    assert result.returncode == -signal.SIGTERM, result.stdout[-2000:] + result.stderr[-2000:]
    assert 15 <= time.monotonic() - started < 75
    assert "could not reach the other processes" in result.stderr
    assert "within train.process_timeout=15 s" in result.stderr
    assert "KERAS_DISTRIBUTION_JOB_ADDRESSES" in result.stderr


def test_malformed_launch_variables_are_clear_errors(folder):
    config = _config(folder, "bad", distribution="data_parallel")
    result = subprocess.run(_command(config, folder / "bad"), capture_output=True, text=True,
                            timeout=120,
                            env=_env(KERAS_DISTRIBUTION_JOB_ADDRESSES="127.0.0.1",
                                     KERAS_DISTRIBUTION_NUM_PROCESSES=2,
                                     KERAS_DISTRIBUTION_PROCESS_ID=0))
    assert result.returncode == 2
    assert "needs a port" in result.stderr
