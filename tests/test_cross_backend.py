"""The same small models give the same logits, loss and gradients on JAX, TensorFlow and
PyTorch for the same weights (each backend in its own subprocess, see backend_probe.py)."""

import keras
import numpy as np
import pytest
from backend_probe import model_inputs
from conftest import BACKENDS, PROBE_MODELS, USER_BACKEND
from reference import to_numpy

MODEL_NAMES = [entry["name"] for entry in PROBE_MODELS]
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def _pairs():
    reference = "torch"
    return [(reference, other) for other in BACKENDS if other != reference]


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("pair", _pairs(), ids=lambda p: f"{p[0]}-{p[1]}")
def test_logits_and_loss_agree(probe_results, name, pair):
    first, second = (probe_results["results"][b] for b in pair)
    np.testing.assert_allclose(first[f"{name}/logits"], second[f"{name}/logits"], **TOLERANCE)
    np.testing.assert_allclose(first[f"{name}/loss"], second[f"{name}/loss"], **TOLERANCE)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("pair", _pairs(), ids=lambda p: f"{p[0]}-{p[1]}")
def test_gradients_agree(probe_results, name, pair):
    first, second = (probe_results["results"][b] for b in pair)
    keys = sorted(k for k in first if k.startswith(f"{name}/grad/"))
    assert keys == sorted(k for k in second if k.startswith(f"{name}/grad/"))
    local = probe_results["local"][name]
    # every trainable weight has a gradient, and not all of them are zero
    assert len(keys) == len(local.trainable_weights) > 0
    assert any(np.abs(first[k]).max() > 0 for k in keys)
    for key in keys:
        np.testing.assert_allclose(first[key], second[key], err_msg=key, **TOLERANCE)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_subprocess_matches_this_process(probe_results, name):
    """The probe's models really hold the weights of the local model (same outputs)."""
    entry = next(e for e in PROBE_MODELS if e["name"] == name)
    model = probe_results["local"][name]
    logits = to_numpy(model(model_inputs(entry, probe_results["inputs"][name]), training=False))
    backend = probe_results["local_backend"]
    np.testing.assert_allclose(probe_results["results"][backend][f"{name}/logits"], logits,
                               **TOLERANCE)


@pytest.mark.parametrize("name", [e["name"] for e in PROBE_MODELS if e["type"] != "encoder"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_cached_decoding_equals_full(probe_results, name, backend):
    """Decoding one position at a time through the cache, with the step compiled
    (``jax.jit`` / ``tf.function``) and a traced cache index, gives the full pass's logits at
    every real position."""
    results = probe_results["results"][backend]
    inputs = probe_results["inputs"][name]
    real = (inputs["target"] if "target" in inputs else inputs["ids"]) != 0
    np.testing.assert_allclose(results[f"{name}/cached_logits"][real],
                               results[f"{name}/logits"][real], **TOLERANCE)


def test_in_process_backend_is_the_package_default():
    """Without KERAS_BACKEND the package picks PyTorch, and these tests run on it."""
    if USER_BACKEND is not None:
        pytest.skip(f"KERAS_BACKEND={USER_BACKEND} chosen by the caller")
    assert keras.backend.backend() == "torch"
