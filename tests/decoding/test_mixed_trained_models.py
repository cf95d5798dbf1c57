"""A model trained under ``mixed_bfloat16`` (``train.precision: auto``'s choice on CPUs and
GPUs with bfloat16 units) decodes in float32, as its float32 twin with the same weights
does: ``transformerkit.load`` and the training reports and monitors make its layers compute
in float32 (``models/base.py: compute_in_float32``). The twin runs the same code on the
same float32 weights, so logits and ids are equal exactly; on PyTorch both take the
one-position decoder step, which a bfloat16-compute model cannot.
"""

import json

import keras
import numpy as np
import pytest
from tiny_run import tiny_config

import transformerkit
from transformerkit.decoding import greedy_translate
from transformerkit.models import GPT, Transformer
from transformerkit.models.base import compute_in_float32, float32_compute

SMALL = dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=16, dropout=0.0)


def build(kind, policy):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = Transformer(30, 30, **SMALL) if kind == "transformer" else GPT(30, **SMALL)
        ids = np.array([[5, 6, 7, 2]], "int32")
        model((ids, ids)) if kind == "transformer" else model(ids)
    finally:
        keras.config.set_dtype_policy(previous)
    return model


def policies(model):
    return {layer.name: layer.dtype_policy.name for layer in model._flatten_layers()}


@pytest.mark.parametrize("kind", ["transformer", "gpt"])
def test_compute_in_float32_turns_a_mixed_model_into_its_float32_twin(kind):
    mixed, twin = build(kind, "mixed_bfloat16"), build(kind, "float32")
    twin.set_weights(mixed.get_weights())
    assert mixed.compute_dtype == "bfloat16"
    changed = compute_in_float32(mixed)
    assert changed and set(policies(mixed).values()) == {"float32"}
    assert not compute_in_float32(twin)  # nothing to change in a float32 model
    source = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], "int32")
    if kind == "transformer":
        got_ids, got = greedy_translate(mixed, source, max_new_tokens=6, return_logits=True)
        want_ids, want = greedy_translate(twin, source, max_new_tokens=6, return_logits=True)
        assert got_ids == want_ids
    else:
        got, want = mixed(source), twin(source)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got),
                                  keras.ops.convert_to_numpy(want))
    if keras.backend.backend() == "torch":
        from transformerkit import fastpath
        from transformerkit.decoding.steps import EagerSteps

        assert EagerSteps.supports(mixed) == fastpath.applies()


def test_float32_compute_restores_the_policies_it_changed():
    mixed = build("transformer", "mixed_bfloat16")
    before = policies(mixed)
    with float32_compute(mixed) as model:
        assert model.compute_dtype == "float32"
    assert policies(mixed) == before
    with pytest.raises(RuntimeError), float32_compute(mixed):
        raise RuntimeError("a decoding that fails")
    assert policies(mixed) == before


def test_a_run_trained_in_mixed_bfloat16_loads_computing_in_float32(tmp_path):
    """``train`` in ``mixed_bfloat16``: its final report decodes in float32 and the model
    it trains keeps its policy; ``transformerkit.load`` gives a float32-compute model that
    translates as the training report did."""
    from transformerkit.training.trainer import train

    config = tiny_config(tmp_path, epochs=1, precision="mixed_bfloat16", samples=3)
    config = config.replace(data={"val_source": config.data.train_source,
                                  "val_target": config.data.train_target})
    metrics = train(config, tmp_path / "run")
    assert metrics["precision"]["used"] == "mixed_bfloat16"
    with open(tmp_path / "run" / "config.yaml") as f:
        assert "mixed_bfloat16" in f.read()
    run = transformerkit.load(tmp_path / "run")
    assert set(policies(run.model).values()) == {"float32"}
    # the report's samples were decoded as the loaded run decodes
    samples = (tmp_path / "run" / "samples.txt").read_text().split("\n")
    sources = [line[len("SOURCE:    "):] for line in samples if line.startswith("SOURCE:")]
    outputs = [line[len("MODEL:     "):] for line in samples if line.startswith("MODEL:")]
    assert sources and run.translate(sources, beam_size=config.train.eval_beam_size) == outputs
    with open(tmp_path / "run" / "metrics.json") as f:
        assert json.load(f)["precision"]["used"] == "mixed_bfloat16"


def test_without_the_private_layer_walk_the_model_is_left_as_it_is(monkeypatch):
    from transformerkit import internals

    monkeypatch.setitem(internals._ATTRIBUTES, "flatten_layers",
                        ("keras.Model", "_no_such_walk"))
    monkeypatch.setattr(internals, "_found", {})
    mixed = build("transformer", "mixed_bfloat16")
    before = policies(mixed)
    with pytest.warns(RuntimeWarning, match="_no_such_walk is missing"):
        assert compute_in_float32(mixed) == {}
    assert policies(mixed) == before
