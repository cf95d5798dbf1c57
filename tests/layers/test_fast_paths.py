"""Shortcuts that only skip work must not change a number: direct sub-layer calls on PyTorch,
no padding mask for batches without padding, and models without biases (nanoGPT's
``bias=False``) against the same model with zero biases."""

import keras
import numpy as np
import pytest
import tolerances as tol

from transformerkit import fastpath
from transformerkit.layers.calls import call_sublayer
from transformerkit.layers.masks import padding_mask
from transformerkit.models import GPT, Transformer
from transformerkit.models.base import TransformerBase

SMALL = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=12, dropout=0.0)


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def ids(rows, length, vocab, seed, pad_from=None):
    x = np.random.default_rng(seed).integers(1, vocab, (rows, length)).astype("int32")
    if pad_from is not None:
        x[0, pad_from:] = 0
    return x


@pytest.mark.parametrize("norm_position,activation", [("post", "relu"), ("pre", "gelu"),
                                                     ("pre", "gelu_tanh")])
def test_direct_sublayer_calls_change_no_number(monkeypatch, norm_position, activation):
    model = Transformer(40, 40, norm_position=norm_position, activation=activation, **SMALL)
    source, target = ids(3, 7, 40, 0, pad_from=4), ids(3, 6, 40, 1, pad_from=3)
    monkeypatch.setattr(fastpath, "ENABLED", True)
    fast = to_numpy(model((source, target)))
    monkeypatch.setattr(fastpath, "ENABLED", False)
    keras_calls = to_numpy(model((source, target)))
    # two float32 paths (torch kernels called directly; Keras' ops, e.g. matmul + add where
    # the shortcut takes one addmm): each within the model's rounding bound
    tol.assert_within(fast, keras_calls, tol.chain_atol(tol.model_roundings(model, 7, 6),
                                                        keras_calls, paths=2))


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch's shortcut")
def test_tolerances_still_catch_a_transposed_kernel(monkeypatch):
    """Planted bug: the direct ``Dense`` call multiplies by the transposed kernel where it is
    square (the attention projections); the comparison above must see it."""
    from transformerkit.kernels import products
    from transformerkit.layers import calls

    def transposed(layer, x):
        kernel = layer.kernel.value
        square = kernel.shape[0] == kernel.shape[1]
        bias = products.dense_weights(layer)[1]
        return products.linear(x, (kernel.t() if square else kernel, bias))

    monkeypatch.setattr(calls, "_dense", transposed)
    tol.assert_caught(test_direct_sublayer_calls_change_no_number, monkeypatch, "post", "relu")


def test_call_sublayer_keeps_keras_calls_where_they_matter():
    dense = keras.layers.Dense(3)
    symbolic = call_sublayer(dense, keras.KerasTensor((None, 4)))  # builds: a Keras call
    assert isinstance(symbolic, keras.KerasTensor) and dense.built
    mixed = keras.layers.Dense(3, dtype="mixed_bfloat16")
    mixed.build((None, 4))
    out = call_sublayer(mixed, keras.ops.ones((2, 4)))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"  # autocast was applied
    # inside an enclosing mixed-precision layer's autocast scope, a float32 sub-layer still
    # reads its weights in float32, as Keras' call makes it do
    from keras.src.backend import AutocastScope

    x = keras.ops.ones((2, 4))
    with AutocastScope("bfloat16"):
        inside = call_sublayer(dense, x)
    assert keras.backend.standardize_dtype(inside.dtype) == "float32"
    # exact: inside an autocast scope call_sublayer is Keras' own call, the same kernels
    np.testing.assert_array_equal(to_numpy(inside), to_numpy(dense(x)))


def test_batches_without_padding_take_no_mask_and_give_the_same_logits(monkeypatch):
    model = GPT(30, **SMALL)
    x = ids(2, 10, 30, 2)
    assert TransformerBase._padding_mask(x) is None
    padded = x.copy()
    padded[1, 7:] = 0
    np.testing.assert_array_equal(to_numpy(TransformerBase._padding_mask(padded)), padded != 0)
    unmasked = to_numpy(model(x))
    monkeypatch.setattr(TransformerBase, "_padding_mask", staticmethod(padding_mask))
    masked = to_numpy(model(x))
    # an all-True mask may send attention to another kernel (a masked softmax, SDPA with a
    # mask): two float32 paths
    tol.assert_within(unmasked, masked, tol.chain_atol(tol.model_roundings(model, 0, 10),
                                                       masked, paths=2))


def _copy_weights_zero_biases(source, target):
    """Copy ``source``'s (bias-free) weights into ``target``; its biases/offsets become 0."""
    by_path = {v.path.split("/", 1)[1]: v for v in source.weights}
    for variable in target.weights:
        path = variable.path.split("/", 1)[1]
        if path in by_path:
            variable.assign(by_path[path])
        else:
            assert path.endswith(("bias", "beta")), path
            variable.assign(np.zeros(variable.shape, "float32"))


def test_gpt_without_biases_equals_the_gpt_with_zero_biases():
    plain = GPT(30, use_bias=False, tie_embeddings="none", name="a", **SMALL)
    biased = GPT(30, use_bias=True, tie_embeddings="none", name="b", **SMALL)
    names = [v.path for v in plain.weights]
    assert not any(n.endswith(("bias", "beta")) for n in names)
    assert len(biased.weights) > len(plain.weights)
    _copy_weights_zero_biases(plain, biased)
    x = ids(2, 9, 30, 3)
    expected = to_numpy(biased(x))
    # mm against addmm with a zero bias, LayerNorm without against with a zero offset: other
    # kernels, two float32 paths
    tol.assert_within(to_numpy(plain(x)), expected,
                      tol.chain_atol(tol.model_roundings(plain, 0, 9), expected, paths=2))


def test_nanogpt_cpu_recipe_has_nanogpts_parameter_count():
    # nanoGPT prints "number of parameters: 0.80M" = 795,904 without the 64 x 128 positions
    model = GPT(65, num_layers=4, d_model=128, num_heads=4, d_ff=512, max_length=64,
                tie_embeddings="all", use_bias=False)
    assert model.count_params() == 795_904 + 64 * 128


def test_gpt_without_biases_saves_and_decodes_with_its_cache(tmp_path):
    from transformerkit.decoding import generate_ids
    from transformerkit.saving import load_model

    model = GPT(30, use_bias=False, **SMALL)
    path = str(tmp_path / "gpt.keras")
    model.save(path)
    loaded = load_model(path, compile=False)
    assert loaded.use_bias is False
    x = ids(2, 5, 30, 4)
    # exact: the same weights, shapes and kernels
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))
    prompts = [list(row) for row in x]
    cached = generate_ids(loaded, prompts, max_new_tokens=6, temperature=0, use_cache=True)
    recomputed = generate_ids(loaded, prompts, max_new_tokens=6, temperature=0,
                              use_cache=False)
    assert cached == recomputed and all(len(c) == 6 for c in cached)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_torch_loss_equals_the_keras_ops_loss(monkeypatch, label_smoothing):
    """On PyTorch ``masked_cross_entropy`` is one ``F.cross_entropy``; it must give the
    ``keras.ops`` formula's value and gradient (padding ignored, smoothing as ours), and 0
    for a batch of padding only."""
    from transformerkit.training import masked_cross_entropy

    rng = np.random.default_rng(3)
    labels = rng.integers(1, 9, (3, 5)).astype("int32")
    labels[0, 2:] = 0
    labels[2, 4] = 0
    logits = rng.normal(size=(3, 5, 9)).astype("float32")
    results = {}
    for fast in (True, False):
        monkeypatch.setattr(fastpath, "ENABLED", fast)
        x = keras.Variable(logits)
        if keras.backend.backend() == "torch":
            loss = masked_cross_entropy(labels, x.value, label_smoothing)
            loss.backward()
            results[fast] = (float(loss), x.value.grad.numpy().copy())
        else:
            results[fast] = (float(masked_cross_entropy(labels, x, label_smoothing)), None)
        results[fast, "empty"] = float(masked_cross_entropy(
            np.zeros_like(labels), keras.ops.convert_to_tensor(logits)))
    # F.cross_entropy against the keras.ops formula: two float32 paths over 9 logits, 12 tokens
    roundings = tol.cross_entropy_roundings(9, 12)
    assert results[True][0] == pytest.approx(results[False][0], rel=tol.relative(roundings, 2))
    if results[True][1] is not None:  # (softmax - smoothed labels) / tokens: entries <= 1
        tol.assert_within(results[True][1], results[False][1],
                          tol.chain_atol(roundings, results[False][1], paths=2))
    assert results[True, "empty"] == results[False, "empty"] == 0.0


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the lean step is PyTorch's")
@pytest.mark.parametrize("kind", ["gpt", "transformer"])
def test_lean_torch_train_step_equals_keras_train_step(kind):
    """The training step's PyTorch shortcut (``training/step.py: TrainStep``: one weight
    walk, gradients reset to None, the model called through ``call_sublayer``) must train
    exactly as Keras' own ``train_step``: same losses and weights after several steps (a
    gradient that is not reset accumulates and changes both), frozen weights untouched, a
    loss added in ``call`` counted once per step (not accumulated over steps)."""
    from transformerkit.training import MaskedCrossEntropy, attach_train_step

    class GPTWithActivityLoss(GPT):
        def call(self, *args, **kwargs):
            logits = super().call(*args, **kwargs)
            self.add_loss(1e-2 * keras.ops.mean(logits ** 2))
            return logits

    def make():
        keras.utils.set_random_seed(5)
        if kind == "gpt":
            model = GPTWithActivityLoss(30, **SMALL)
            x = ids(4, 10, 30, 7)
            data = (x[:, :-1], x[:, 1:])
        else:
            model = Transformer(30, 30, **SMALL)
            source, target = ids(4, 9, 30, 8, pad_from=6), ids(4, 8, 30, 9, pad_from=5)
            data = ((source, target[:, :-1]), target[:, 1:])
        model.compile(optimizer=keras.optimizers.Adam(1e-2, global_clipnorm=1.0),
                      loss=MaskedCrossEntropy(0.1))
        attach_train_step(model)
        model(data[0])
        frozen = model.token_embedding if kind == "gpt" else model.source_embedding
        frozen.trainable = False
        return model, data, frozen

    lean, data, frozen_layer = make()
    lean.takes_logit_positions = False  # the full logits, as Keras' step (tested below)
    reference, _, _ = make()
    frozen = to_numpy(frozen_layer.embeddings)
    keras_step = super(TransformerBase, reference).train_step
    batch = tuple(keras.tree.map_structure(keras.ops.convert_to_tensor, data))
    # exact: the same kernels in the same order (the model's sub-layers take the same calls
    # either way; Keras' loss, optimizer and tracker objects), so Adam sees the same gradients
    for _ in range(4):
        lean_logs, keras_logs = lean.train_step(batch), keras_step(batch)
        assert float(lean_logs["loss"]) == float(keras_logs["loss"])
    for a, b in zip(lean.weights, reference.weights, strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)
    np.testing.assert_array_equal(to_numpy(frozen_layer.embeddings), frozen)


@pytest.mark.skipif(keras.backend.backend() != "torch" or not fastpath.ENABLED,
                    reason="the lean step is PyTorch's shortcut")
@pytest.mark.parametrize("kind", ["gpt", "transformer"])
def test_train_step_on_real_label_positions_equals_full_logits(kind):
    """With a loss and metrics that ignore padding, the PyTorch train step computes logits
    at the real label positions only: the same losses, masked accuracy and weights as with
    the full logits (SGD, so that no optimizer normalisation magnifies round-off); the
    shortcut is taken on batches with padding only, and not when a metric that counts
    padding positions is compiled."""
    from transformerkit.training import MaskedAccuracy, MaskedCrossEntropy, attach_train_step

    def make(metrics):
        keras.utils.set_random_seed(7)
        if kind == "gpt":
            model = GPT(30, **SMALL)
            x = ids(4, 10, 30, 7)
            x[1, 6:] = 0  # padded language-model rows
            data = (x[:, :-1], x[:, 1:])
        else:
            model = Transformer(30, 30, **SMALL)
            source, target = ids(4, 9, 30, 8, pad_from=6), ids(4, 8, 30, 9, pad_from=5)
            data = ((source, target[:, :-1]), target[:, 1:])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=MaskedCrossEntropy(0.1),
                      metrics=metrics)
        attach_train_step(model)
        model(data[0])
        return model, tuple(keras.tree.map_structure(keras.ops.convert_to_tensor, data))

    shortcut, batch = make([MaskedAccuracy()])
    full, _ = make([MaskedAccuracy()])
    full.takes_logit_positions = False
    taken = []
    call = type(shortcut).call

    def counting_call(self, *args, logit_positions=None, **kwargs):
        if self is not full:
            taken.append(logit_positions is not None)
        return call(self, *args, logit_positions=logit_positions, **kwargs)

    # the projection of the selected rows against the full projection: other product shapes,
    # two float32 paths; the gradients carry the forward pass, the backward pass and the loss
    lengths = (0, 9) if kind == "gpt" else (9, 7)
    forward = tol.model_roundings(full, *lengths)
    loss_roundings = forward + tol.cross_entropy_roundings(30, 36)
    gradient_roundings = 2 * loss_roundings
    type(shortcut).call = counting_call
    try:
        for _ in range(3):
            logits = np.sort(to_numpy(full(batch[0], training=True)), axis=-1)
            labels = to_numpy(batch[1])
            real_labels = int((labels != 0).sum())
            gaps = (logits[..., -1] - logits[..., -2])[labels != 0]
            near_ties = int((gaps <= tol.chain_atol(forward, logits, paths=2)).sum())
            got, expected = shortcut.train_step(batch), full.train_step(batch)
            assert float(got["loss"]) == pytest.approx(
                float(expected["loss"]), rel=tol.relative(loss_roundings, paths=2))
            # the same argmax, but where the best two logits are within their bound
            assert abs(float(got["masked_accuracy"]) - float(expected["masked_accuracy"])) \
                <= near_ties / real_labels
        assert taken[1:] == [True, True]  # the first step builds the metrics
        for a, b in zip(shortcut.weights, full.weights, strict=True):
            tol.assert_within(to_numpy(a), to_numpy(b), tol.sgd_weights_atol(
                gradient_roundings, 0.5, 3, to_numpy(b)), err_msg=a.path)
        unpadded = keras.tree.map_structure(lambda t: t[:1, :4], batch)  # no padding
        taken.clear()
        shortcut.train_step(unpadded)
        assert taken == [False]
        counts_padding, _ = make(["accuracy"])
        counts_padding.train_step(batch)
        taken.clear()
        counts_padding.train_step(batch)
        assert taken == [False]
    finally:
        type(shortcut).call = call


@pytest.mark.skipif(keras.backend.backend() != "torch" or not fastpath.ENABLED,
                    reason="oneDNN's training product is a PyTorch shortcut")
def test_onednn_training_products_train_as_the_plain_products(monkeypatch):
    """A few training steps of a Transformer whose every ``Dense`` product takes oneDNN (the
    threshold lowered to 0) give the losses and weights of the plain products, within the
    rounding of two float32 paths. SGD, as Adam's normalisation has no rounding bound (see
    ``tolerances.sgd_weights_atol``); the products themselves are checked against float64
    in tests/layers/test_decode_steps.py."""
    from transformerkit.kernels import products
    from transformerkit.training import MaskedCrossEntropy, attach_train_step

    def run(threshold):
        monkeypatch.setattr(products, "ONEDNN_TRAIN_MIN_MACS", threshold)
        keras.utils.set_random_seed(3)
        model = Transformer(30, 30, **SMALL)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=MaskedCrossEntropy(0.1))
        attach_train_step(model)
        source, target = ids(4, 9, 30, 8, pad_from=6), ids(4, 8, 30, 9, pad_from=5)
        losses = [float(model.train_on_batch((source, target[:, :-1]), target[:, 1:]))
                  for _ in range(3)]
        return model, losses, [to_numpy(w) for w in model.weights]

    _, onednn_losses, onednn_weights = run(0)
    model, plain_losses, plain_weights = run(2**62)
    loss_roundings = tol.model_roundings(model, 9, 7) + tol.cross_entropy_roundings(30, 28)
    np.testing.assert_allclose(onednn_losses, plain_losses,
                               rtol=tol.relative(loss_roundings, paths=2), atol=0)
    assert plain_losses[-1] < plain_losses[0] - 0.1  # it trained: the weights moved
    for a, b in zip(onednn_weights, plain_weights, strict=True):
        tol.assert_within(a, b, tol.sgd_weights_atol(2 * loss_roundings, 0.5, 3, b))
