"""The kill-and-resume check the SIGKILL tests share: a ``transformerkit train`` run straight
through, the same run SIGKILLed once its checkpoint state passes an optimizer step inside
an epoch, then ``--resume``d: the final weights must equal the straight run's, bit for bit
(the same steps, kernels, batches and RNG state, resumed)."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import yaml

from transformerkit.saving import load_model


def _weights(path):
    return [np.asarray(w) for w in load_model(path).get_weights()]


def assert_killed_run_resumes_exactly(config, folder, kill_after_step, seconds=240):
    """Train ``config`` (resolved) in ``folder``/straight and ``folder``/killed, SIGKILL the
    second once its ``latest.json`` is at ``kill_after_step`` or later (inside an epoch),
    resume it, and compare the final weights exactly."""
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    command = [sys.executable, "-m", "transformerkit.cli", "train", str(path)]
    straight = subprocess.run([*command, "--out", str(folder / "straight")],
                              capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]

    killed = folder / "killed"
    process = subprocess.Popen([*command, "--out", str(killed)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    state = killed / "checkpoints" / "latest.json"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        if state.exists() and json.loads(state.read_text()).get("step", 0) >= kill_after_step:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "model.keras").exists(), "the run finished before it was killed"
    assert json.loads(state.read_text())["batch"] > 0, "killed at an epoch end"
    resumed = subprocess.run([*command, "--out", str(killed), "--resume"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for a, b in zip(_weights(folder / "straight" / "model.keras"),
                    _weights(killed / "model.keras"), strict=True):  # exact: the same steps
        np.testing.assert_array_equal(a, b)
