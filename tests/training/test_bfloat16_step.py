"""The ``mixed_bfloat16`` training step on eager PyTorch: every weight cast to bfloat16 once
per step (``kernels/cast_once.py``), the float32 master weights and optimizer state
updated in float32, the sub-layers called directly inside the step's autocast scope.

- Against Keras' own step under the same policy with the same sub-layer calls (its scope
  casts a weight at every use): exact, since the copies are the same values and each use's
  gradient reaches the float32 weight converted and summed as under Keras' casts.
- Against the plain Keras path (shortcuts off: Keras' calls, ``keras.ops``, Keras' Adam):
  within the bfloat16 bounds of ``tests/support/bfloat16_bounds.py`` (two paths).
"""

import bfloat16_bounds as bf
import keras
import numpy as np
import pytest
import tolerances as tol

from transformerkit import fastpath
from transformerkit.models import Transformer
from transformerkit.models.base import TransformerBase
from transformerkit.training import MaskedCrossEntropy, attach_train_step
from transformerkit.training.precision import precision_policy

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the cast-once step is PyTorch's")
SMALL = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=12, dropout=0.0)


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def _batch(seed=8):
    rng = np.random.default_rng(seed)
    source = rng.integers(1, 30, (4, 9)).astype("int32")
    target = rng.integers(1, 30, (4, 8)).astype("int32")
    source[0, 6:] = 0
    target[0, 5:] = 0
    return ((source, target[:, :-1]), target[:, 1:])


def _model(optimizer, seed=5, **options):
    with precision_policy("mixed_bfloat16"):
        keras.utils.set_random_seed(seed)
        model = Transformer(30, 30, **{**SMALL, **options})
        model.compile(optimizer=optimizer, loss=MaskedCrossEntropy(0.1))
        attach_train_step(model)
        model(_batch()[0])
    return model


class _CountingDict(dict):
    """The scope's copies, counting the casts made (one per new or updated entry)."""

    made = 0

    def __setitem__(self, key, value):
        type(self).made += 1
        super().__setitem__(key, value)


@pytest.mark.skipif(not fastpath.ENABLED, reason="the shortcuts are off")
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_cast_once_step_equals_keras_mixed_precision_step(monkeypatch, norm_position):
    """Losses and weights after Adam steps exactly as Keras' ``train_step`` (same calls, its
    per-use casts); each weight cast once per step (tied embeddings: read three times), a
    frozen weight untouched, the weights kept float32, the copies dropped after the step."""
    from transformerkit.kernels import cast_once

    scopes = []
    cast_once = cast_once.cast_once

    def recording(dtype):
        scope = cast_once(dtype)
        scope.copies = _CountingDict()
        scopes.append(scope)
        return scope

    monkeypatch.setattr("transformerkit.training.step.cast_once", recording)
    lean = _model(keras.optimizers.Adam(1e-2), norm_position=norm_position,
                  tie_embeddings="all")
    lean.takes_logit_positions = False  # the full logits, as Keras' step
    reference = _model(keras.optimizers.Adam(1e-2), norm_position=norm_position,
                       tie_embeddings="all")
    for model in (lean, reference):
        model.encoder_blocks[0].feedforward.trainable = False
    frozen = [to_numpy(w) for w in lean.encoder_blocks[0].feedforward.weights]
    batch = tuple(keras.tree.map_structure(keras.ops.convert_to_tensor, _batch()))
    keras_step = super(TransformerBase, reference).train_step
    for _ in range(3):
        _CountingDict.made = 0
        lean_logs, keras_logs = lean.train_step(batch), keras_step(batch)
        assert float(lean_logs["loss"]) == float(keras_logs["loss"])
        # once per weight read, frozen and fixed ones included; LayerNorm's never (Keras
        # does not autocast them)
        copies = scopes[-1].copies
        assert _CountingDict.made == len(copies)
        norms = {id(w.value) for layer in lean._flatten_layers()
                 if isinstance(layer, keras.layers.LayerNormalization) for w in layer.weights}
        assert set(copies) == {id(v.value) for v in lean.weights} - norms
    assert len(scopes) == 3  # a scope (and its copies) per step
    for a, b in zip(lean.weights, reference.weights, strict=True):
        assert a.dtype == "float32"
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)
    for before, after in zip(frozen, lean.encoder_blocks[0].feedforward.weights, strict=True):
        np.testing.assert_array_equal(to_numpy(after), before)


def _fast_and_plain(monkeypatch, learning_rate, steps, seed=5):
    """Losses and weights of ``steps`` SGD steps by the fast step (shortcuts on) and by the
    plain Keras path (shortcuts off), the start weights and the first step's logits."""
    results = {}
    batch = _batch()
    for fast in (True, False):
        monkeypatch.setattr(fastpath, "ENABLED", fast)
        model = _model(keras.optimizers.SGD(learning_rate), seed=seed, num_layers=1)
        start = [to_numpy(w) for w in model.weights]
        logits = to_numpy(model(batch[0], training=True))
        losses = [float(model.train_on_batch(*batch)) for _ in range(steps)]
        results[fast] = (losses, [to_numpy(w) for w in model.weights], logits)
    return model, start, results, batch


@pytest.mark.skipif(not fastpath.ENABLED, reason="the shortcuts are off")
def test_fast_bfloat16_step_is_within_bfloat16_bounds_of_keras_mixed_precision(monkeypatch):
    """The fast step (cast-once scope, direct calls, ``addmm``, fused attention kernels)
    against Keras' own mixed-precision step with Keras' calls and ``keras.ops``: the first
    loss, the first update (the gradients times the rate) and the weights after three SGD
    steps, each within the bound of two bfloat16 paths (one layer each side: the worst-case
    bound grows with the stores along the path, 35 forward here, 71 behind a gradient)."""
    learning_rate, steps = 0.5, 3
    model, start, results, batch = _fast_and_plain(monkeypatch, learning_rate, steps)
    (fast_losses, fast_weights, _), (plain_losses, plain_weights, logits) = \
        results[True], results[False]
    stores = bf.model_stores(model)
    float32_roundings = tol.model_roundings(model, 9, 7) + tol.cross_entropy_roundings(30, 28)
    assert abs(fast_losses[0] - plain_losses[0]) <= bf.loss_atol(stores, float32_roundings,
                                                                 logits)
    grad_stores, grad_roundings = bf.gradient_stores(model), 2 * float32_roundings
    # the gradients: the first update of each path is -rate * gradient (one step, exact
    # start): compared through the weights after one step, from the same start
    monkeypatch.setattr(fastpath, "ENABLED", True)
    one_step = {}
    for fast in (True, False):
        monkeypatch.setattr(fastpath, "ENABLED", fast)
        single = _model(keras.optimizers.SGD(learning_rate), num_layers=1)
        single.train_on_batch(*batch)
        one_step[fast] = [(to_numpy(w) - s) / learning_rate
                          for w, s in zip(single.weights, start, strict=True)]
    scale = max(float(np.abs(g).max()) for g in one_step[False])
    gradient_atol = bf.update_atol(grad_stores, grad_roundings, 1.0, 1, scale)
    for a, b, w in zip(one_step[True], one_step[False], model.weights, strict=True):
        tol.assert_within(a, b, gradient_atol, err_msg=f"gradient of {w.path}")
    weights_atol = bf.update_atol(grad_stores, grad_roundings, learning_rate, steps, scale)
    for a, b, w in zip(fast_weights, plain_weights, model.weights, strict=True):
        tol.assert_within(a, b, weights_atol, err_msg=w.path)
    assert plain_losses[-1] < plain_losses[0]  # it trained


@pytest.mark.skipif(not fastpath.ENABLED, reason="the shortcuts are off")
def test_bfloat16_bounds_still_catch_gradients_that_miss_the_float32_weights(monkeypatch):
    """Planted bug: the cast copies' gradients do not reach the float32 weights (a copy made
    outside autograd); the comparison above must see it."""
    from transformerkit.kernels import cast_once

    def detached(self, value):
        out = original(self, value)
        return out.detach() if hasattr(out, "detach") else out

    original = cast_once._cast_once_maybe_cast
    monkeypatch.setattr(type(cast_once.cast_once("bfloat16")), "maybe_cast", detached)
    tol.assert_caught(test_fast_bfloat16_step_is_within_bfloat16_bounds_of_keras_mixed_precision,
                      monkeypatch)
