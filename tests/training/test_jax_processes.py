"""Data-parallel training over several JAX processes (``jax.distributed``, gloo between CPU
processes), launched as JAX and Keras users launch it: every process runs the same command
with ``KERAS_DISTRIBUTION_JOB_ADDRESSES`` (process 0's host:port),
``KERAS_DISTRIBUTION_NUM_PROCESSES`` and its own ``KERAS_DISTRIBUTION_PROCESS_ID``.

Two processes on 127.0.0.1 with one CPU device (``--xla_force_host_platform_device_count=1``)
and one thread each train a 1-layer d_model 16 model with ``train.distribution:
data_parallel`` on 48 number-word pairs (6 batches of 8 an epoch, one padded width: one
compile). Every wait has a timeout (``subprocess`` timeouts, ``train.process_timeout``).

- Every step each process feeds its half of the rows of the same global batch
  (``DivisibleBatches``) and XLA all-reduces the gradients, so the final weights equal one
  process on one device trained on the whole batches: the same float32 sums in another
  order, then Adam. The attention key biases are left out of that comparison: a bias
  added to every key shifts all scores of a query equally, which the softmax ignores, so
  their exact gradient is zero and Adam scales rounding noise into full-size steps whose
  signs depend on the summation order. The logits of both models agree all the same.
  Tolerances: not rounding bounds. Adam has none for two summation orders
  (``tolerances.sgd_weights_atol``'s note: it turns rounding-size gradient differences into
  steps of up to the learning rate where a gradient is near zero); losses (rel 1e-5),
  weights (rtol 1e-5, atol 1e-6) and logits (1e-5) keep the margins this test has always
  had. Mutation tried by hand (planted in the processes by a ``sitecustomize`` module):
  every process feeding process 0's half of the rows, caught by the losses (3.081 against
  3.095).
- Process 0 alone writes the run directory (the files of a one-process run, one TensorBoard
  writer per folder) and prints the results; it decodes the validation samples alone.
- A killed process stops the other at once (the connection closes) with ``lost contact``
  and status 2, not after ``train.process_timeout``.
- A process whose peers never come (process 1 without a coordinator, process 0 without
  process 1) is stopped after ``train.process_timeout`` by ``processes.py``'s watchdog with
  a message saying how to launch (JAX itself would abort later with a C++ stack trace); a
  launch of several processes with ``train.distribution: none`` is a clear error at once.
"""

import csv
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
from backends import FAST_XLA_COMPILE
from tiny_run import write_corpus

LAUNCH_TIMEOUT = 240  # seconds one launch may take on a busy 2-core machine (JAX compiles)
VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
             "KERAS_DISTRIBUTION_PROCESS_ID")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update({"KERAS_BACKEND": "jax", "OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": f"--xla_force_host_platform_device_count=1 {FAST_XLA_COMPILE}"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _process_env(address, index, count=2):
    return _env(KERAS_DISTRIBUTION_JOB_ADDRESSES=address,
                KERAS_DISTRIBUTION_NUM_PROCESSES=count, KERAS_DISTRIBUTION_PROCESS_ID=index)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("jax-processes")
    write_corpus(path, pairs=48)
    return path


def _config(folder, name, **train):
    corpus = {"train_source": str(folder / "train.de"), "train_target": str(folder / "train.en"),
              "val_source": str(folder / "train.de"), "val_target": str(folder / "train.en")}
    config = {
        "model": {"num_layers": 1, "d_model": 16, "num_heads": 2, "d_ff": 32, "dropout": 0.0,
                  "max_length": 40},
        "data": {"dataset": "parallel", **corpus, "tokenizer": "char", "batch_size": 8,
                 "pad_to_multiple": 32},  # one batch shape: one compile
        "train": {"epochs": 2, "learning_rate": 0.003, "verbose": 0, "samples": 2,
                  "eval_max_sentences": 2, "distribution": "data_parallel",
                  "process_timeout": "60s", **train}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _command(config, out, *extra):
    return [sys.executable, "-m", "transformerkit", "--backend", "jax", "train", config,
            "--out", str(out), *extra]


def _start(config, out, *extra, count=2):
    """``count`` JAX processes of one run, each started by its own command."""
    address = f"127.0.0.1:{_free_port()}"
    return [subprocess.Popen(_command(config, out, *extra), env=_process_env(address, index,
                                                                             count),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for index in range(count)]


def _finish(processes, timeout=LAUNCH_TIMEOUT):
    """``[(returncode, stdout, stderr)]`` of every process; all are killed past ``timeout``."""
    deadline = time.monotonic() + timeout
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((process.returncode, out, err))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    return results


def _ok(results):
    for index, (code, out, err) in enumerate(results):
        assert code == 0, f"process {index}: {out[-2000:]}{err[-4000:]}"


def _model(path):
    from transformerkit.saving import load_model

    return load_model(str(path), compile=False)


def _numpy(tensor):
    from keras import ops

    return ops.convert_to_numpy(tensor)


def _files(run):
    """Relative paths of the files in ``run``; TensorBoard event files as ``DIR/<events>``."""
    names = []
    for root, _, files in os.walk(run):
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), run)
            names.append(os.path.dirname(relative) + "/<events>"
                         if name.startswith("events.out.tfevents") else relative)
    return sorted(names)


def _losses(run):
    with open(run / "history.csv") as f:
        return [{k: float(v) for k, v in row.items() if k in ("loss", "val_loss")}
                for row in csv.DictReader(f)]


@pytest.mark.slow
def test_two_jax_processes_equal_one_process_on_the_same_global_batches(folder):
    config = _config(folder, "equal")
    two = _finish(_start(config, folder / "two"))
    _ok(two)
    one = subprocess.run(_command(config, folder / "one", "--set", "train.distribution=none"),
                         env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    _ok([(one.returncode, one.stdout, one.stderr)])

    metrics = json.loads((folder / "two" / "metrics.json").read_text())
    assert metrics["processes"] == 2 and metrics["steps"] == 12  # 2 epochs of 6 batches
    reference = json.loads((folder / "one" / "metrics.json").read_text())
    assert "processes" not in reference
    for a, b in zip(_losses(folder / "two"), _losses(folder / "one"), strict=True):
        assert a.keys() == {"loss", "val_loss"}
        for key in a:  # the same global batches, step by step; Adam: not a rounding bound
            assert a[key] == pytest.approx(b[key], rel=1e-5)

    model_two, model_one = (_model(folder / "two" / "model.keras"),
                            _model(folder / "one" / "model.keras"))
    first = _model(folder / "two" / "checkpoints" / "epoch-0001.keras")
    assert any(not np.allclose(a, b) for a, b in  # it trained in the second epoch (lr steps)
               zip(first.get_weights(), model_two.get_weights(), strict=True))
    compared = 0
    for a, b in zip(model_two.weights, model_one.weights, strict=True):
        assert a.path == b.path
        if not a.path.endswith("/key/bias"):  # see the module docstring (Adam: no bound)
            np.testing.assert_allclose(_numpy(a.value), _numpy(b.value), rtol=1e-5,
                                       atol=1e-6, err_msg=a.path)
            compared += 1
    assert compared == len(model_one.weights) - 3  # encoder self, decoder self and cross
    rng = np.random.default_rng(0)
    source, target = rng.integers(1, 20, (3, 9)), rng.integers(1, 20, (3, 7))
    np.testing.assert_allclose(_numpy(model_two((source, target))),  # Adam-trained: no bound
                               _numpy(model_one((source, target))), rtol=1e-5, atol=1e-5)

    # process 0 alone wrote the run: the files of a one-process run, one TensorBoard writer
    assert _files(folder / "two") == _files(folder / "one")
    for logs in ("train", "validation"):
        assert len(os.listdir(folder / "two" / "logs" / logs)) == 1
    assert sorted(os.listdir(folder / "two" / "checkpoints")) == [
        "best.keras", "epoch-0001.keras", "epoch-0002.keras", "latest.json"]
    assert (folder / "two" / "samples.txt").read_text().count("SOURCE:") == 2
    assert "run directory:" in two[0][1] and "run directory:" not in two[1][1]
    assert "JAX process 1 of 2" in two[1][2]


@pytest.mark.slow
def test_resume_continues_a_two_process_run(folder):
    """2 processes for 1 epoch, then ``--resume`` (2 processes) to 2 epochs: the weights of
    the uninterrupted 2-epoch run of ``one`` above (trained on the same global batches); a
    resume with another number of processes is refused."""
    config = _config(folder, "resume", epochs=1)
    _ok(_finish(_start(config, folder / "resumed")))
    alone = subprocess.run(_command(config, folder / "resumed", "--resume"), env=_env(),
                           capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert alone.returncode == 2 and "run of 2 process(es), this launch has 1" in alone.stderr
    _ok(_finish(_start(config, folder / "resumed", "--resume", "--set", "train.epochs=2")))
    reference = folder / "one" / "model.keras"  # written by the test above
    if not reference.exists():
        pytest.skip("needs the one-process run of the test above")
    resumed, one = _model(folder / "resumed" / "model.keras"), _model(reference)
    for a, b in zip(resumed.weights, one.weights, strict=True):
        if not a.path.endswith("/key/bias"):  # Adam: not a rounding bound (module docstring)
            np.testing.assert_allclose(_numpy(a.value), _numpy(b.value), rtol=1e-5,
                                       atol=1e-6, err_msg=a.path)


@pytest.mark.slow
def test_a_killed_process_stops_the_other_at_once(folder):
    config = _config(folder, "kill", epochs=50, checkpoint_every=3)
    run = folder / "killed"
    processes = _start(config, run)
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while not (run / "checkpoints" / "latest.json").exists():
            assert processes[0].poll() is None and processes[1].poll() is None
            assert time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.05)
        processes[1].kill()
        killed = time.monotonic()
        code, _, err = _finish(processes[:1], timeout=120)[0]
        waited = time.monotonic() - killed
    finally:
        _finish(processes)
    assert code == 2, err[-4000:]
    assert "0 of 2 lost contact with the other processes" in err
    assert "--resume" in err
    assert waited < 30  # not after train.process_timeout (60 s) nor JAX's heartbeat timeout
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] < 300


@pytest.mark.slow
def test_a_process_without_peers_stops_within_the_timeout(folder):
    """Side by side: process 1 whose coordinator never starts, a coordinator (process 0)
    whose process 1 never starts, and 2 processes with ``train.distribution: none``."""
    config = _config(folder, "alone", process_timeout="15s")
    started = time.monotonic()
    alone = [subprocess.Popen(_command(config, folder / f"alone{index}"),
                              env=_process_env(f"127.0.0.1:{_free_port()}", index),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for index in (1, 0)]
    wrong = _start(_config(folder, "none", distribution="none"), folder / "none")
    results = _finish([*alone, *wrong], timeout=120)
    assert time.monotonic() - started < 75  # 15 s and the imports, not JAX's 300 s
    for index, (code, out, err) in zip((1, 0), results, strict=False):
        assert code == -signal.SIGTERM, out[-2000:] + err[-3000:]
        assert (f"JAX process {index} of 2 could not reach the other processes through the "
                "coordinator at 127.0.0.1:") in err
        assert "within train.process_timeout=15 s" in err
        assert "KERAS_DISTRIBUTION_JOB_ADDRESSES" in err
        assert not (folder / f"alone{index}" / "config.yaml").exists()
    for code, _, err in results[2:]:
        assert code == 2, err[-3000:]
        assert ("several JAX processes (KERAS_DISTRIBUTION_* are set) train with "
                "train.distribution: data_parallel, got 'none'") in err
    assert not (folder / "none" / "checkpoints").exists()


# -- in-process: the launch variables --------------------------------------------------------

def test_launch_variables_are_read_and_checked(monkeypatch):
    from transformerkit.training.processes import jax_launch

    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert jax_launch() is None
    monkeypatch.setenv(VARIABLES[0], "10.0.0.1:1234,10.0.0.2:2345")  # Keras' form: every job
    monkeypatch.setenv(VARIABLES[1], "2")
    monkeypatch.setenv(VARIABLES[2], "1")
    assert jax_launch() == ("10.0.0.1:1234", 2, 1)
    monkeypatch.setenv(VARIABLES[2], "2")
    with pytest.raises(ValueError, match="KERAS_DISTRIBUTION_PROCESS_ID=2 must be in 0 .. 1"):
        jax_launch()
    monkeypatch.setenv(VARIABLES[1], "two")
    with pytest.raises(ValueError, match="needs KERAS_DISTRIBUTION_NUM_PROCESSES as an "
                                         "integer; got KERAS_DISTRIBUTION_NUM_PROCESSES='two'"):
        jax_launch()
    monkeypatch.setenv(VARIABLES[0], "10.0.0.1")
    monkeypatch.setenv(VARIABLES[1], "2")
    monkeypatch.setenv(VARIABLES[2], "0")
    with pytest.raises(ValueError, match="the coordinator needs a port"):
        jax_launch()
