"""``train.precision: mixed_float16``: float16 math, float32 weights, Keras' dynamic loss
scaling (``LossScaleOptimizer``), on CPU (PyTorch).

References: the same model and batch in float32. Not a float32 bound
(``tests/support/tolerances.py``): float16 rounds each stored result to 11 bits (u16 = 2^-11), while
the sums inside the products run in float32. The first loss agrees within FLOAT16_STORES
such roundings (relative); the update of the first step (weights after - before) within
twice that (forward and backward) of its largest value, or of 2% of the largest update of
any weight for weights whose gradient is zero in exact arithmetic (key biases: their
update is rounding noise of both passes, measured against the other updates' size). A loss
scale so large that the scaled gradients overflow skips the step (weights unchanged) and
halves the scale: the dynamic loss scaling works.
"""

import keras
import numpy as np
import pytest

from transformerkit.models import Transformer
from transformerkit.training import MaskedCrossEntropy, attach_train_step
from transformerkit.training.precision import precision_policy

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="float16 CPU kernels: checked on PyTorch")
U16 = 2.0 ** -11  # float16's unit roundoff
# float16 results stored along the longest path of the 1-layer post-norm Transformer's
# forward pass: the embedding, its scale and position (3); per attention sub-layer the
# projection, scores, softmax, weighted sum, output projection, residual and LayerNorm (7);
# per feed-forward sub-layer the two products, residual and LayerNorm (4); the encoder
# (3 + 7 + 4), the decoder (3 + 7 + 7 + 4), the final LayerNorms and the logits (3)
FLOAT16_STORES = 38


def _batch():
    rng = np.random.default_rng(0)
    source = rng.integers(3, 30, (4, 7)).astype("int32")
    target = rng.integers(3, 30, (4, 6)).astype("int32")
    labels = rng.integers(3, 30, (4, 6)).astype("int32")
    return (source, target), labels


def _model(precision, weights=None, optimizer=None):
    with precision_policy(precision):
        model = Transformer(num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
                            source_vocab_size=30, target_vocab_size=30, max_length=16)
        x, _ = _batch()
        model(x)
        if weights is not None:
            model.set_weights(weights)
        model.compile(optimizer=optimizer or keras.optimizers.SGD(0.5),
                      loss=MaskedCrossEntropy())
        attach_train_step(model)
    return model


def test_mixed_float16_step_matches_float32():
    x, y = _batch()
    reference = _model("float32")
    start = reference.get_weights()
    half = _model("mixed_float16", start)
    assert isinstance(half.optimizer, keras.optimizers.LossScaleOptimizer)
    assert half.compute_dtype == "float16"
    assert all(w.dtype == "float32" for w in half.weights)
    loss32 = reference.train_on_batch(x, y)
    loss16 = half.train_on_batch(x, y)
    np.testing.assert_allclose(loss16, loss32, rtol=FLOAT16_STORES * U16)
    updates = [(a - before, b - before) for before, a, b
               in zip(start, half.get_weights(), reference.get_weights(), strict=True)]
    largest = max(np.abs(u32).max() for _, u32 in updates)
    for update16, update32 in updates:  # weights with ~0 gradient (key biases): vs largest
        scale = max(np.abs(update32).max(), 0.02 * largest)
        assert np.abs(update16 - update32).max() <= 2 * FLOAT16_STORES * U16 * scale


def test_overflowing_loss_scale_skips_the_step_and_lowers_the_scale():
    x, y = _batch()
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                                    initial_scale=2.0 ** 30)
    half = _model("mixed_float16", optimizer=optimizer)
    start = half.get_weights()
    half.train_on_batch(x, y)
    scale = float(keras.ops.convert_to_numpy(half.optimizer.dynamic_scale))
    assert scale < 2.0 ** 30
    for a, b in zip(start, half.get_weights(), strict=True):  # exact: the step was skipped
        np.testing.assert_array_equal(a, b)
