"""Saving: ``.keras`` round trips give identical outputs and keep tied weights one variable;
``.weights.h5`` files move between backends (via the probe subprocesses of conftest).

Tolerances (``tests/support/tolerances.py``): a reloaded model runs the same kernels on the same
float32 values as the saved one in this process, so its outputs are equal, bit for bit;
another backend's outputs (other kernels) are two float32 paths within the model's chain
bound; the float64 reference within one. The power check restores the token embeddings
rounded to bfloat16 (a precision lost on the way).
"""

import keras
import numpy as np
import pytest
import reference as ref
import tolerances as tol
from backend_probe import PROBE_MODELS, build_model, model_inputs
from backends import BACKENDS
from reference import to_numpy

from transformerkit.layers.embeddings import TokenEmbedding
from transformerkit.models import GPT, Encoder, Transformer
from transformerkit.training import (
    MaskedAccuracy,
    MaskedCrossEntropy,
    attach_train_step,
    paper_optimizer,
)

SOURCE = np.array([[4, 5, 6, 7], [8, 9, 0, 0]])
TARGET = np.array([[1, 2, 3], [1, 5, 0]])
IDS = np.array([[3, 4, 5, 6], [7, 8, 0, 0]])
TYPES = np.array([[0, 0, 1, 1], [0, 1, 0, 0]])

MODELS = {
    "transformer_tied_all": (lambda: Transformer(
        20, 20, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=10,
        tie_embeddings="all", norm_position="pre"), (SOURCE, TARGET)),
    "transformer_frozen": (lambda: Transformer(
        20, 16, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=10,
        positional="t2t", embeddings_trainable=False, key_dim=3, value_dim=5), (SOURCE, TARGET)),
    "gpt_tied": (lambda: GPT(14, num_layers=2, d_model=8, num_heads=2, d_ff=16, max_length=8,
                             tie_embeddings="decoder"), IDS),
    "encoder_classifier": (lambda: Encoder(
        14, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8, type_vocab_size=2,
        embedding_norm=True, pooling="cls", num_classes=3), (IDS, TYPES)),
}


@pytest.mark.parametrize("name", MODELS)
def test_keras_file_round_trip(tmp_path, name):
    make, inputs = MODELS[name]
    model = make()
    model(inputs)
    ref.randomize_weights(model)
    expected = to_numpy(model(inputs))
    path = tmp_path / f"{name}.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert type(restored) is type(model)
    assert restored.get_config() == model.get_config()
    # exact: the saved float32 values, reloaded, through the same kernels
    np.testing.assert_array_equal(to_numpy(restored(inputs)), expected)
    assert len(restored.weights) == len(model.weights)
    assert len(restored.trainable_weights) == len(model.trainable_weights)
    for ours, theirs in zip(model.weights, restored.weights, strict=True):
        assert ours.path.split("/", 1)[1] == theirs.path.split("/", 1)[1]
        np.testing.assert_array_equal(to_numpy(ours), to_numpy(theirs))


def test_tied_weights_stay_one_variable_after_loading(tmp_path):
    make, inputs = MODELS["transformer_tied_all"]
    model = make()
    model(inputs)
    model.save(tmp_path / "tied.keras")
    restored = keras.saving.load_model(tmp_path / "tied.keras")
    assert restored.source_embedding is restored.target_embedding
    assert [v.shape for v in restored.weights].count((20, 8)) == 1
    # changing the one matrix changes the embedding and the projection alike
    matrix = restored.source_embedding.embeddings
    matrix.assign(to_numpy(matrix) * 2.0)
    expected = ref.transformer_forward(ref.transformer_params(restored), *inputs)
    roundings = tol.model_roundings(restored, inputs[0].shape[1], inputs[1].shape[1])
    tol.assert_within(to_numpy(restored(inputs)), expected, tol.chain_atol(roundings, expected))


def test_frozen_embeddings_stay_frozen_after_loading(tmp_path):
    make, inputs = MODELS["transformer_frozen"]
    model = make()
    model(inputs)
    model.save(tmp_path / "frozen.keras")
    restored = keras.saving.load_model(tmp_path / "frozen.keras")
    trainable = {id(v) for v in restored.trainable_weights}
    assert id(restored.source_embedding.embeddings) not in trainable
    assert id(restored.target_embedding.embeddings) not in trainable
    assert len(restored.trainable_weights) == len(model.trainable_weights)


def test_compiled_model_round_trip_keeps_loss_metric_and_schedule(tmp_path):
    make, inputs = MODELS["gpt_tied"]
    model = make()
    model.compile(optimizer=paper_optimizer(8, warmup_steps=10),
                  loss=MaskedCrossEntropy(label_smoothing=0.1), metrics=[MaskedAccuracy()])
    attach_train_step(model)
    labels = np.roll(IDS, -1, axis=1)
    model.fit(IDS, labels, epochs=2, verbose=0)
    model.save(tmp_path / "compiled.keras")
    restored = keras.saving.load_model(tmp_path / "compiled.keras")
    assert isinstance(restored.loss, MaskedCrossEntropy) and restored.loss.label_smoothing == 0.1
    assert int(to_numpy(restored.optimizer.iterations)) == 2
    # exact: the same schedule at the same restored iteration count
    assert float(to_numpy(restored.optimizer.learning_rate)) == \
        float(to_numpy(model.optimizer.learning_rate))
    np.testing.assert_array_equal(  # exact: the same weights, kernels and batches
        restored.evaluate(IDS, labels, verbose=0), model.evaluate(IDS, labels, verbose=0))


# -- weights across backends -----------------------------------------------------------------

MODEL_NAMES = [entry["name"] for entry in PROBE_MODELS]


def probe_roundings(entry, model, arrays):
    """The chain bound's roundings of a probe model's forward pass (the encoder adds its
    token types to the embedding and has a tanh pooler before its classifier)."""
    if entry["type"] == "transformer":
        return tol.model_roundings(model, arrays["source"].shape[1], arrays["target"].shape[1])
    roundings = tol.model_roundings(model, target_len=arrays["ids"].shape[1])
    if entry["type"] == "encoder":
        roundings += 1 + model.d_model + 1 + tol.ELEMENTWISE_ULPS
    return roundings


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_saved_here_load_under_other_backends(probe_results, name, backend):
    """Our ``.weights.h5`` (saved by this process) loaded under ``backend`` gives our logits."""
    entry = next(e for e in PROBE_MODELS if e["name"] == name)
    model, arrays = probe_results["local"][name], probe_results["inputs"][name]
    here = to_numpy(model(model_inputs(entry, arrays), training=False))
    there = probe_results["results"][backend][f"{name}/h5_logits"]
    # two float32 paths: this process's kernels and the other backend's
    tol.assert_within(there, here, tol.chain_atol(probe_roundings(entry, model, arrays), here,
                                                  paths=2))


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_saved_under_other_backends_load_here(probe_results, name, backend):
    entry = next(e for e in PROBE_MODELS if e["name"] == name)
    inputs = model_inputs(entry, probe_results["inputs"][name])
    model = build_model(entry)
    model.build(None)
    model.load_weights(str(probe_results["workdir"] / f"{name}.{backend}.weights.h5"))
    expected = to_numpy(probe_results["local"][name](inputs, training=False))
    # exact: the float32 values the other backend saved are this process's weights, run
    # through the same kernels here
    np.testing.assert_array_equal(to_numpy(model(inputs, training=False)), expected)


def test_tolerances_still_catch_embeddings_restored_in_bfloat16(probe_results, monkeypatch):
    """The token embeddings restored rounded to bfloat16 (a relative change up to 2^-9)."""
    load = TokenEmbedding.load_own_variables

    def bfloat16(self, store):
        load(self, store)
        self.embeddings.assign(keras.ops.cast(keras.ops.cast(self.embeddings, "bfloat16"),
                                              "float32"))

    monkeypatch.setattr(TokenEmbedding, "load_own_variables", bfloat16)
    tol.assert_caught(test_weights_saved_under_other_backends_load_here, probe_results, "gpt",
                      "jax")
