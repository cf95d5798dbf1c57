"""Data-parallel training over several PyTorch processes (``torchrun``, gloo on CPU).

Every run here is 2 processes on 127.0.0.1 with 1 thread each and a 1-layer d_model 16
model on 40 number-word pairs (10 batches of 4 an epoch), so a launch takes seconds; every
wait has a timeout (``subprocess`` timeouts, ``train.process_timeout``) so nothing hangs.

- 2 processes (rank r takes batches r, r + 2, ... of every epoch) end with the weights of
  one process trained with ``accumulate_steps: 2`` (batches 2u and 2u + 1 in update u,
  token-weighted: ``tests/training/test_accumulation.py`` checks that against the large batch),
  bit for bit: each rank computes its batch's gradient with the kernels the one process
  uses, the all-reduce's ``(g0 + g1) / 2`` is Keras' ``(g1 + accumulator) / 2`` (float32
  addition commutes), and the same Adam update follows.
- 2 processes x ``accumulate_steps: 2`` against 1 process x 4 sum the four gradients in
  another order (``(g0 + g2) + (g1 + g3)``, then the local accumulator taken back off), and
  Adam has no rounding bound for that (``tolerances.sgd_weights_atol``'s note: it turns
  rounding-size gradient differences into steps of up to the learning rate where a gradient
  is near zero): the tolerance there, rtol 1e-5 and atol 1e-6, is not derived; the key
  biases, whose exact gradient is zero, are left out.
  Mutation tried by hand (planted in the ranks by a ``sitecustomize`` module): the
  all-reduce summing instead of averaging: caught by the exact check (Adam being nearly
  scale-invariant, most weights moved by ~3e-8; the key biases, whose gradient is rounding
  noise near epsilon's size, by 1e-2).
- SIGKILL of rank 1 (processes started by hand, as torchrun would) stops rank 0 with
  ``lost contact`` and exit status 2; ``torchrun ... --resume`` then ends with the weights of
  an uninterrupted 2-process run (dropout on: each rank's RNG stream is restored), exactly.
- ``--resume`` with another number of processes, and a rank whose peers never come, are
  clear errors.
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

LAUNCH_TIMEOUT = 240  # seconds any one launch may take on a busy 2-core machine


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KERAS_BACKEND": "torch",
           "TORCH_SHOW_CPP_STACKTRACES": "0"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("multiprocess")
    write_corpus(path, pairs=40)
    return path


def _config(folder, name, dropout=0.0, **train):
    config = {
        "model": {"num_layers": 1, "d_model": 16, "num_heads": 2, "d_ff": 32,
                  "dropout": dropout, "max_length": 40},
        "data": {"dataset": "parallel", "train_source": str(folder / "train.de"),
                 "train_target": str(folder / "train.en"), "tokenizer": "char",
                 "batch_size": 4},
        "train": {"epochs": 2, "learning_rate": 0.003, "verbose": 0, "samples": 0,
                  "process_timeout": "60s", **train}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _torchrun(config, out, *extra, timeout=LAUNCH_TIMEOUT):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
               "-m", "transformerkit", "train", config, "--out", str(out), *extra]
    return subprocess.run(command, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _train_one(config, out, *extra):
    command = [sys.executable, "-m", "transformerkit", "train", config, "--out", str(out),
               *extra]
    return subprocess.run(command, env=_env(), capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT)


def _weights(run):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    from transformerkit.saving import load_model

    return load_model(str(run / "model.keras"), compile=False).get_weights()


def _ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_two_processes_equal_one_process_on_both_shards(folder):
    config = _config(folder, "equal")
    _ok(_torchrun(config, folder / "two"))
    _ok(_train_one(config, folder / "one", "--set", "train.accumulate_steps=2"))
    two, one = _weights(folder / "two"), _weights(folder / "one")
    metrics = json.loads((folder / "two" / "metrics.json").read_text())
    assert metrics["processes"] == 2 and metrics["steps"] == 10  # 2 epochs of 10 / 2
    first = _weights_of_checkpoint(folder / "two", "epoch-0001.keras")
    # it trained: Adam steps of about the learning rate (3e-3), far beyond rounding
    assert any(not np.allclose(a, b) for a, b in zip(first, two, strict=True))
    for a, b in zip(two, one, strict=True):  # exact: see the module docstring
        np.testing.assert_array_equal(a, b)
    # rank 0 alone wrote the run; nothing of rank 1 is in it
    assert sorted(os.listdir(folder / "two" / "checkpoints")) == [
        "best.keras", "epoch-0001.keras", "epoch-0002.keras", "latest.json"]
    assert len((folder / "two" / "history.csv").read_text().splitlines()) == 3  # header + 2


def test_with_accumulation_the_ranks_exchange_once_per_update(folder):
    """2 processes x accumulate_steps 2 = 1 process x accumulate_steps 4, with one
    all-reduce per update (the first micro-batch of each update accumulates locally)."""
    config = _config(folder, "accumulated", accumulate_steps=2, epochs=1)
    _ok(_torchrun(config, folder / "two-acc"))
    _ok(_train_one(config, folder / "one-acc", "--set", "train.accumulate_steps=4"))
    two, one = _named_weights(folder / "two-acc"), _named_weights(folder / "one-acc")
    assert two.keys() == one.keys() and len(two) > 20
    for path, value in two.items():  # not a rounding bound: Adam (module docstring)
        np.testing.assert_allclose(value, one[path], rtol=1e-5, atol=1e-6, err_msg=path)
    metrics = json.loads((folder / "two-acc" / "metrics.json").read_text())
    assert metrics["steps"] == 2  # 10 batches: 2 updates of 2 x 2, the last 2 left over
    assert metrics["gradient_all_reduces"] == metrics["steps"]
    assert metrics["gradient_bytes_per_all_reduce"] > 0


def _named_weights(run):
    """``{path: array}`` without the attention key biases: their gradient is zero in exact
    arithmetic (the softmax ignores a shift shared by all keys), so Adam turns rounding
    noise, which depends on the order of the sums, into full-size steps."""
    from keras import ops

    from transformerkit.saving import load_model

    model = load_model(str(run / "model.keras"), compile=False)
    return {w.path: ops.convert_to_numpy(w.value) for w in model.weights
            if not w.path.endswith("key/bias")}


def _weights_of_checkpoint(run, name):
    from transformerkit.saving import load_model

    return load_model(str(run / "checkpoints" / name), compile=False).get_weights()


def _step_of(run):
    try:
        return json.loads((run / "checkpoints" / "latest.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


def test_killed_rank_stops_the_job_and_resume_finishes_it(folder):
    config = _config(folder, "kill", dropout=0.1, epochs=12, checkpoint_every=2)
    _ok(_torchrun(config, folder / "straight"))

    run, port = folder / "killed", _free_port()
    processes = [subprocess.Popen(
        [sys.executable, "-m", "transformerkit", "train", config, "--out", str(run)],
        env=_env(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for rank in (0, 1)]
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while _step_of(run) < 4 and processes[0].poll() is None:
            assert time.monotonic() < deadline, "no checkpoint at step 4"
            time.sleep(0.05)
        processes[1].send_signal(signal.SIGKILL)
        _, err = processes[0].communicate(timeout=120)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
    assert processes[0].returncode == 2, err[-3000:]
    assert "rank 0 of 2 lost contact with the other processes" in err
    assert "--resume" in err
    stopped_at = _step_of(run)
    assert 4 <= stopped_at < 60  # 12 epochs of 5 steps: it stopped before the end

    _ok(_torchrun(config, run, "--resume"))
    assert json.loads((run / "metrics.json").read_text())["steps"] == 60
    for a, b in zip(_weights(run), _weights(folder / "straight"), strict=True):
        np.testing.assert_array_equal(a, b)  # exact: the same steps, resumed

    # another number of processes cannot continue the run: a clear error at once
    result = _train_one(config, run, "--resume")
    assert result.returncode == 2
    assert "written by a run of 2 process(es), this launch has 1" in result.stderr


def test_unreachable_peers_are_a_clear_error(folder):
    config = _config(folder, "alone", process_timeout="5s")
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "transformerkit", "train", config, "--out",
         str(folder / "alone")],
        env=_env(RANK=1, LOCAL_RANK=1, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=_free_port()),
        capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert result.returncode == 2
    assert "rank 1 of 2 could not reach the other processes" in result.stderr
    assert time.monotonic() - start < 120


def test_a_time_budget_stops_every_rank_at_the_end_of_one_cooldown(folder):
    """``train.time_budget`` over 2 processes: rank 0's clock decides, and its cooldown
    window and stop reach rank 1 (a rank that stopped alone, or a step later, would leave
    the other waiting in the all-reduce until ``process_timeout`` and fail the job). The
    run ends at the end of the cooldown fitted to the measured rate, or before it where the
    budget runs out first (a busy machine slows the updates after the last estimate), on
    the recorded window's rate."""
    from transformerkit.training.schedules import Cooldown

    config = _config(folder, "budget", epochs=100_000, time_budget="6s", cooldown=0.2)
    started = time.monotonic()
    _ok(_torchrun(config, folder / "budget"))
    metrics = json.loads((folder / "budget" / "metrics.json").read_text())
    assert metrics["processes"] == 2
    assert metrics["stopped_by"] in ("cooldown_end", "time_budget")
    assert metrics["cooldown_retargets"] >= 1  # the window was fitted to the measured rate
    assert metrics["steps"] <= metrics["cooldown_end"]
    if metrics["stopped_by"] == "cooldown_end":
        assert metrics["steps"] == metrics["cooldown_end"]
    # the last update's rate: the constant rate times the recorded window's 1 - p
    window = Cooldown(0.003, metrics["cooldown_end"], metrics["cooldown_fraction"],
                      start=metrics["cooldown_start"],
                      start_progress=metrics["cooldown_start_progress"])
    np.testing.assert_allclose(metrics["final_learning_rate"],
                               0.003 * window.factor(metrics["steps"]), rtol=1e-5, atol=1e-9)
    assert time.monotonic() - started < LAUNCH_TIMEOUT
