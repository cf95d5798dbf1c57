"""Scaling out: data and model parallel training through ``keras.distribution`` give the
same losses as one device; mixed_bfloat16 trains with float32 softmax, logits and loss.

The distributed runs happen in one subprocess (``tests/support/distribution_probe.py``) under
``KERAS_BACKEND=jax`` with two virtual CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``).

Tolerances: the first step's loss, of the same global batch and weights, is two float32
paths (other summation orders, sharded products) within the model's and the loss's chain
bound (``tests/support/tolerances.py``). Later steps and ``transformerkit.train``'s epoch losses
(batches of 4 rows, so no padding row) follow Adam updates, which have no rounding bound
(``tolerances.sgd_weights_atol``'s note: Adam divides each gradient by its running RMS and
turns the rounding-size differences of weights whose gradient is near zero, such as key
biases, into steps of up to the learning rate): STEP_RTOL = 1e-4 is not derived, it is
about 500 times the differences seen (2e-7) on AMD EPYC under the default, AVX2 and AVX-512
kernels. The probe (``distribution_probe.py``) would need SGD for a bound there.
"""

import csv
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tolerances as tol
from backends import FAST_XLA_COMPILE
from paths import SUPPORT_DIR
from tiny_run import tiny_config

from transformerkit.config import ConfigError, resolve
from transformerkit.models import Transformer
from transformerkit.training import MaskedCrossEntropy, attach_train_step
from transformerkit.training.distribution import (
    DivisibleBatches,
    build_distribution,
    pad_rows,
)
from transformerkit.training.precision import precision_policy

STEP_RTOL = 1e-4  # after Adam updates: not a rounding bound (module docstring)


def first_step_atol(loss):
    """Two float32 paths of the probe's first loss: its Transformer (source 7, target 6
    positions), the cross-entropy over 40 ids and at most 5 x 6 tokens; terms of the
    loss's size (``tolerances.chain_atol``)."""
    model = Transformer(40, 40, num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
                        max_length=12)
    roundings = tol.model_roundings(model, 7, 6) + tol.cross_entropy_roundings(40, 30)
    return tol.chain_atol(roundings, loss, paths=2)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("distribution")
    # two virtual CPU devices, also on a machine with a GPU (where JAX would pick the GPU)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count=2 {FAST_XLA_COMPILE}")
    result = subprocess.run([sys.executable, str(SUPPORT_DIR / "distribution_probe.py"),
                             str(workdir)], capture_output=True, text=True, env=env,
                            timeout=900, cwd=SUPPORT_DIR)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["data_parallel", "model_parallel"])
def test_distributed_loss_curve_equals_single_device(probe, kind):
    assert probe["devices"] == 2
    single, distributed = np.array(probe["steps"]["none"]), np.array(probe["steps"][kind])
    tol.assert_within(distributed[0], single[0], first_step_atol(single[0]))
    np.testing.assert_allclose(distributed, single, rtol=STEP_RTOL)
    assert single[-1] < single[0]


def test_data_parallel_pads_odd_batches_and_model_parallel_shards_kernels(probe):
    assert probe["rows"]["data_parallel"] == [6] * 6  # 5 rows + 1 padding row on 2 devices
    assert probe["rows"]["model_parallel"] == [5] * 6  # mesh (batch 1, model 2): no padding
    assert set(probe["sharding"]["data_parallel"].values()) == {"P(None, None)"}
    sharding = probe["sharding"]["model_parallel"]
    assert sharding["t/encoder_block_0/self_attention/query/kernel"] == "P(None, 'model')"
    assert sharding["t/decoder_block_0/feedforward/outer/kernel"] == "P('model', None)"
    assert sharding["t/source_embedding/embeddings"] == "P(None, 'model')"


@pytest.mark.parametrize("kind", ["data_parallel", "model_parallel"])
def test_train_with_distribution_matches_single_device(probe, kind):
    np.testing.assert_allclose(probe["train"][kind], probe["train"]["none"], rtol=STEP_RTOL)


# -- in-process (default backend) -------------------------------------------------------------

def test_distribution_needs_jax():
    if keras.backend.backend() == "jax":
        pytest.skip("this process runs JAX")
    with pytest.raises(ValueError, match=rf"needs the JAX backend.*{keras.backend.backend()}"):
        build_distribution("data_parallel")
    assert build_distribution("none") is None


def test_config_checks_distribution_and_precision():
    with pytest.raises(ConfigError, match=r"train.distribution must be one of .*'pipeline'"):
        resolve({"train": {"distribution": "pipeline"}})
    with pytest.raises(ConfigError, match=r"train.precision must be one of .*'float16'"):
        resolve({"train": {"precision": "float16"}})
    with pytest.raises(ConfigError, match=r"train.devices must be at least 1"):
        resolve({"train": {"devices": 0}})


def test_pad_rows_and_divisible_batches_forward_epochs():
    batch = np.arange(6).reshape(3, 2)
    np.testing.assert_array_equal(pad_rows(batch, 2), [[0, 1], [2, 3], [4, 5], [0, 0]])
    assert pad_rows(batch, 3) is batch

    class Data(keras.utils.PyDataset):
        epochs = []

        def __len__(self):
            return 1

        def __getitem__(self, i):
            return (batch, batch[:, :1]), batch

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    data = Data()
    wrapped = DivisibleBatches(data, 4)
    (source, target), labels = wrapped[0]
    assert source.shape == (4, 2) and target.shape == (4, 1) and labels.shape == (4, 2)
    wrapped.set_epoch(3)
    assert data.epochs == [3] and len(wrapped) == 1
    host_1_of_2 = DivisibleBatches(data, 4, process_index=1, process_count=2)
    np.testing.assert_array_equal(host_1_of_2[0][1], [[4, 5], [0, 0]])


# -- mixed precision --------------------------------------------------------------------------

def _copy_batches(rng, steps=12):
    for _ in range(steps):
        ids = rng.integers(3, 20, (8, 6)).astype("int32")
        yield (ids, np.concatenate([np.ones((8, 1), "int32"), ids[:, :-1]], 1)), ids


def test_mixed_bfloat16_trains_with_float32_softmax_logits_and_loss(rng, monkeypatch):
    previous = keras.config.dtype_policy().name
    with precision_policy("mixed_bfloat16"):
        model = Transformer(20, 20, num_layers=1, d_model=32, num_heads=4, d_ff=64,
                            dropout=0.0, max_length=8)
        model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=MaskedCrossEntropy())
        attach_train_step(model)
        batches = list(_copy_batches(rng))
        losses = [float(model.train_on_batch(*b)) for b in batches * 5]
        (source, target), labels = batches[0]
        logits = model((source, target))
        softmax_inputs = []
        from transformerkit.kernels import softmax as kernel_softmax

        softmax = kernel_softmax.softmax  # the attention's (keras.ops or a torch shortcut)
        monkeypatch.setattr(kernel_softmax, "softmax", lambda x: (
            softmax_inputs.append(keras.backend.standardize_dtype(x.dtype)), softmax(x))[1])
        model.attention_scores(source, target)  # the explicit (non-fused) attention path
    assert keras.config.dtype_policy().name == previous  # restored
    assert model.encoder_blocks[0].self_attention.compute_dtype == "bfloat16"
    assert all(w.dtype == "float32" for w in model.weights)  # float32 master weights
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert softmax_inputs and set(softmax_inputs) == {"float32"}
    loss = MaskedCrossEntropy()(labels, logits)
    assert keras.backend.standardize_dtype(loss.dtype) == "float32"
    assert np.isfinite(losses).all()
    assert np.mean(losses[-6:]) < 0.9 * np.mean(losses[:6])


def test_train_with_mixed_precision(tmp_path):
    from transformerkit.saving import load_model
    from transformerkit.training.trainer import train

    metrics = train(tiny_config(tmp_path, precision="mixed_bfloat16", epochs=3), tmp_path / "run")
    assert np.isfinite(metrics["loss"])
    with open(tmp_path / "run" / "history.csv") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    assert losses[-1] < losses[0]
    assert keras.config.dtype_policy().name == "float32"  # restored after training
    # The layers take the policy in force when the file is loaded: `train --resume` loads
    # under the run's precision, `transformerkit.load` in float32.
    with precision_policy("mixed_bfloat16"):
        model = load_model(tmp_path / "run" / "model.keras")
    assert model.encoder_blocks[0].self_attention.compute_dtype == "bfloat16"
    assert load_model(tmp_path / "run" / "model.keras").encoder_blocks[0].compute_dtype == \
        "float32"
