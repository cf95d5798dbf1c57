"""The same small models give the same logits, loss and gradients on JAX, TensorFlow and
PyTorch for the same weights (each backend in its own subprocess, see backend_probe.py).

Each backend runs its own kernels (XLA, Eigen/oneDNN, ATen/MKL/oneDNN), so every comparison
is of two float32 paths, within the sum of their rounding bounds (``tests/support/tolerances.py``).
"""

import keras
import numpy as np
import pytest
import tolerances as tol
from backend_probe import PROBE_MODELS, model_inputs
from backends import BACKENDS, USER_BACKEND
from reference import to_numpy

MODEL_NAMES = [entry["name"] for entry in PROBE_MODELS]


def _pairs():
    reference = "torch"
    return [(reference, other) for other in BACKENDS if other != reference]


def forward_roundings(model, entry, arrays):
    """The longest path to the output: :func:`tol.model_roundings` over the inputs' lengths;
    an encoder's classifier head also has BERT's tanh pooler (a product of ``d_model``, its
    bias, tanh) before the output projection."""
    if entry["type"] == "transformer":
        return tol.model_roundings(model, arrays["source"].shape[1], arrays["target"].shape[1])
    n = tol.model_roundings(model, 0, arrays["ids"].shape[1])
    if entry["type"] == "encoder":
        n += model.d_model + 1 + tol.ELEMENTWISE_ULPS
    return n


def loss_atol(model, entry, arrays, logits, loss, paths=2):
    """New bound helper (for tests/support/tolerances.py): the probe's scalar from the logits.
    Token models: a mean label-smoothed cross-entropy moves by at most twice the logits'
    largest error (a convex mix of log-softmaxes, each 2-Lipschitz in the max norm), plus
    :func:`tol.cross_entropy_roundings`. The classifier: ``sum(log_softmax(out) * w)``, so
    ``sum |w|`` times one log-probability's bound (with the nine-term sum)."""
    roundings = 2 * forward_roundings(model, entry, arrays)
    magnitude = max(float(np.abs(logits).max()), abs(float(loss)))
    if entry["type"] == "encoder":
        weights = np.abs(arrays["class_weights"])
        classes = weights.shape[1]
        n = roundings + classes + tol.SOFTMAX_EXTRA + weights.size
        return float(weights.sum()) * tol.chain_atol(n, magnitude, paths)
    tokens = int(np.count_nonzero(arrays["labels"]))
    return tol.chain_atol(roundings + tol.cross_entropy_roundings(logits.shape[-1], tokens),
                          magnitude, paths)


def gradient_roundings(model, entry, arrays, logits):
    """New bound helper (for tests/support/tolerances.py): a weight's gradient: the forward
    chain and the loss's, the backward chain through the same layers (one product of the same length
    for each forward product, transposed: as many roundings), and the weight's own product,
    a sum over every input position of the batch."""
    positions = sum(a.size for k, a in arrays.items() if k in ("source", "target", "ids"))
    return (2 * forward_roundings(model, entry, arrays)
            + tol.cross_entropy_roundings(logits.shape[-1], positions) + positions)


def _entry(name):
    return next(e for e in PROBE_MODELS if e["name"] == name)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("pair", _pairs(), ids=lambda p: f"{p[0]}-{p[1]}")
def test_logits_and_loss_agree(probe_results, name, pair):
    first, second = (probe_results["results"][b] for b in pair)
    entry, arrays = _entry(name), probe_results["inputs"][name]
    model = probe_results["local"][name]
    logits = first[f"{name}/logits"]
    tol.assert_within(second[f"{name}/logits"], logits,
                      tol.chain_atol(forward_roundings(model, entry, arrays), logits, paths=2),
                      "logits")
    loss = first[f"{name}/loss"]
    tol.assert_within(second[f"{name}/loss"], loss,
                      loss_atol(model, entry, arrays, logits, loss), "loss")


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
    roundings = gradient_roundings(local, _entry(name), probe_results["inputs"][name],
                                   first[f"{name}/logits"])
    for key in keys:
        tol.assert_within(second[key], first[key], tol.chain_atol(roundings, first[key], paths=2),
                          key)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_subprocess_matches_this_process(probe_results, name):
    """The probe's models really hold the weights of the local model (same outputs). The
    same backend, but another process: its thread count (and so the kernels' blocking) may
    differ from this one's, so two paths' bound, not equality."""
    entry = _entry(name)
    model = probe_results["local"][name]
    arrays = probe_results["inputs"][name]
    logits = to_numpy(model(model_inputs(entry, arrays), training=False))
    backend = probe_results["local_backend"]
    tol.assert_within(probe_results["results"][backend][f"{name}/logits"], logits,
                      tol.chain_atol(forward_roundings(model, entry, arrays), logits, paths=2))


def test_tolerances_still_catch_short_softmax_rows_padded_with_zeros(probe_results,
                                                                     monkeypatch):
    """Planted bug: the PyTorch shortcut that pads short softmax rows to 16 entries pads
    them with 0 instead of -inf (fast paths on, so attention over 4-15 keys takes it): the
    padding takes probability from every real key, far beyond the bound."""
    from transformerkit import fastpath
    from transformerkit.kernels import softmax as kernel_softmax

    if keras.backend.backend() != "torch":
        pytest.skip("the padded softmax is a PyTorch shortcut")
    import torch

    def padded_with_zeros(x):
        length = x.shape[-1]
        if length in kernel_softmax._SHORT_SOFTMAX:
            padded = torch.nn.functional.pad(x, (0, 16 - length), value=0.0)
            return padded.softmax(-1)[..., :length]
        return x.softmax(-1)

    monkeypatch.setattr(fastpath, "ENABLED", True)
    monkeypatch.setattr(kernel_softmax, "softmax", padded_with_zeros)
    tol.assert_caught(test_subprocess_matches_this_process, probe_results, "transformer")


@pytest.mark.parametrize("name", [e["name"] for e in PROBE_MODELS if e["type"] != "encoder"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_cached_decoding_equals_full(probe_results, name, backend):
    """Decoding one position at a time through the cache, with the step compiled
    (``jax.jit`` / ``tf.function``) and a traced cache index, gives the full pass's logits at
    every real position, within two paths' bound."""
    results = probe_results["results"][backend]
    inputs = probe_results["inputs"][name]
    real = (inputs["target"] if "target" in inputs else inputs["ids"]) != 0
    full = results[f"{name}/logits"][real]
    roundings = forward_roundings(probe_results["local"][name], _entry(name), inputs)
    tol.assert_within(results[f"{name}/cached_logits"][real], full,
                      tol.chain_atol(roundings, full, paths=2))


def test_in_process_backend_is_the_package_default():
    """Without KERAS_BACKEND the package picks PyTorch, and these tests run on it."""
    if USER_BACKEND is not None:
        pytest.skip(f"KERAS_BACKEND={USER_BACKEND} chosen by the caller")
    assert keras.backend.backend() == "torch"
