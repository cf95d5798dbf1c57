"""Every model trains as any Keras model does: ``compile`` with Keras' own loss and
optimizer, ``fit``, ``evaluate``, ``predict``, ``save`` and ``keras.saving.load_model``,
with no transformerkit call in between (``tests/support/plain_keras_user.py``, a user's script),
on each backend in its own process.

What it asserts: ``fit`` changes the weights and lowers the loss by more than a fifth on a
task each model can learn in a few epochs (copy the source, predict the next token of a
copy, classify by the first token); the reloaded model predicts what the saved one did
(same backend, same kernels: within float32 rounding of the logits).
"""

import json
import os
import subprocess
import sys

import pytest
from backends import BACKENDS, FAST_XLA_COMPILE
from paths import SUPPORT_DIR


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_fit_evaluate_save_as_a_keras_user_writes_it(backend, tmp_path):
    env = {**os.environ, "KERAS_BACKEND": backend, "XLA_FLAGS": FAST_XLA_COMPILE,
           "JAX_PLATFORMS": "cpu"}
    env.pop("TRANSFORMERKIT_TESTS_DEFAULT_BACKEND", None)
    done = subprocess.run([sys.executable, str(SUPPORT_DIR / "plain_keras_user.py"),
                           str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["model"] for r in results] == ["Transformer", "GPT", "Encoder"]
    for result in results:
        assert result["backend"] == backend
        assert result["changed"], result
        assert result["after"] < 0.8 * result["before"], result
        assert result["reloaded_difference"] <= 1e-5, result
