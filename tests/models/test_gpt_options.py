"""GPT-2 conventions of ``GPT`` (initialisation, unscaled embeddings), the ``train.optimizer``
choice, and the dropout helper that skips no-op layer calls."""

import math

import keras
import numpy as np
import pytest
import tolerances as tol

from transformerkit.config import ConfigError, resolve
from transformerkit.layers.dropout import apply_dropout
from transformerkit.models import GPT
from transformerkit.training.gpt_recipe import MatrixDecayAdam, WarmupCosineSchedule
from transformerkit.training.optimizers import Adam
from transformerkit.training.schedules import TransformerSchedule
from transformerkit.training.trainer import build_optimizer

SIZE = dict(num_layers=3, d_model=64, num_heads=4, d_ff=256, max_length=16)

# Standard errors a seeded random draw may stray from its expectation (p ~ 6e-7 each, should
# the draws change): the bounds of this file are sampling bounds, not float32 rounding ones.
SIGMAS = 5


def sampling_atol(spread, draws):
    """|mean of ``draws`` draws - expectation| for draws of standard deviation ``spread``:
    ``SIGMAS`` standard errors, ``spread / sqrt(draws)`` each (central limit theorem)."""
    return SIGMAS * spread / math.sqrt(draws)


def std_atol(sigma, variable):
    """|sample std - sigma| for the entries of ``variable``: a sample std of ``n`` normal
    draws has standard error ``sigma / sqrt(2 n)`` (uniform draws: ``sigma / sqrt(5 n)``)."""
    return sampling_atol(sigma / math.sqrt(2), int(np.prod(variable.shape)))


def std(variable):
    """The sample standard deviation in float64 (its rounding far below the sampling bound)."""
    return float(np.std(keras.ops.convert_to_numpy(variable).astype(np.float64)))


def test_gpt2_initialisation_draws_the_documented_deviations():
    keras.utils.set_random_seed(0)
    model = GPT(500, tie_embeddings="all", **SIZE)  # built at construction
    residual = 0.02 / math.sqrt(2 * SIZE["num_layers"])
    expected = [(model.token_embedding.embeddings, 0.02)]
    for block in model.blocks:
        attention = block.self_attention
        for dense in (attention.query_dense, attention.key_dense, attention.value_dense,
                      block.feedforward.inner):
            expected.append((dense.kernel, 0.02))
            assert not np.any(keras.ops.convert_to_numpy(dense.bias))
        for dense in (attention.output_dense, block.feedforward.outer):
            expected.append((dense.kernel, residual))
    # the paper's initialisation keeps Glorot kernels and N(0, d^-1/2) embeddings
    paper = GPT(500, initialization="paper", **SIZE)
    paper.build()
    glorot = math.sqrt(2.0 / (2 * SIZE["d_model"]))  # uniform(+-sqrt(6/(in+out))) has this std
    expected += [(paper.token_embedding.embeddings, SIZE["d_model"] ** -0.5),
                 (paper.blocks[0].self_attention.query_dense.kernel, glorot)]
    for variable, sigma in expected:
        tol.assert_within(std(variable), sigma, std_atol(sigma, variable), variable.path)


def test_gpt2_initialisation_is_seeded_and_keeps_pretrained_embeddings():
    keras.utils.set_random_seed(3)
    a = GPT(50, **SIZE)
    keras.utils.set_random_seed(3)
    b = GPT(50, **SIZE)
    for x, y in zip(a.weights, b.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(y))
    table = np.random.default_rng(0).normal(size=(50, SIZE["d_model"])).astype("float32")
    model = GPT(50, embeddings=table, **SIZE)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.token_embedding.embeddings),
                                  table)


def test_embeddings_are_unscaled_by_default_and_a_choice_is_checked():
    ids = np.array([[5, 6, 7]])
    model = GPT(50, **SIZE)
    table = keras.ops.convert_to_numpy(model.token_embedding.embeddings)
    # exact: a gather copies values
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.token_embedding(ids)),
                                  table[ids])
    scaled = GPT(50, scale_embeddings=True, **SIZE)
    # exact: a gather, times sqrt(64) = 8 (a power of two)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(scaled.token_embedding(ids)),
        keras.ops.convert_to_numpy(scaled.token_embedding.embeddings)[ids] * math.sqrt(64))
    config = model.get_config()
    assert config["scale_embeddings"] is False and config["initialization"] == "gpt2"
    with pytest.raises(ValueError, match="initialization"):
        GPT(50, initialization="xavier", **SIZE)


def train_section(**keys):
    return resolve({"train": keys}).train


def test_train_optimizer_adamw_cosine_decays_to_the_last_step():
    model = GPT(50, **SIZE)
    optimizer = build_optimizer(model, train_section(optimizer="adamw_cosine",
                                                     learning_rate=0.002, warmup_steps=10),
                                total_steps=300)
    assert isinstance(optimizer, MatrixDecayAdam)
    schedule = optimizer._learning_rate  # the schedule object (``learning_rate`` is its value)
    assert isinstance(schedule, WarmupCosineSchedule)
    assert (schedule.peak, schedule.warmup_steps, schedule.decay_steps) == (0.002, 10, 300)
    assert schedule.minimum == 0.002 / 10  # exact: learning_rate / 10, the same float64 division
    assert optimizer.beta_2 == 0.99 and optimizer.weight_decay == 0.1
    assert optimizer.global_clipnorm == 1.0


def test_train_optimizer_paper_is_the_default():
    model = GPT(50, **SIZE)
    optimizer = build_optimizer(model, train_section(warmup_steps=50))
    assert type(optimizer) is Adam and optimizer.beta_2 == 0.98 and optimizer.epsilon == 1e-9
    assert isinstance(optimizer._learning_rate, TransformerSchedule)
    assert optimizer.global_clipnorm is None
    clipped = build_optimizer(model, train_section(learning_rate=0.01, clip_norm=0.5,
                                                   beta_2=0.997))
    assert clipped.global_clipnorm == 0.5 and clipped.beta_2 == 0.997


@pytest.mark.parametrize("keys, match", [
    ({"optimizer": "sgd"}, "train.optimizer"),
    ({"weight_decay": -0.1}, "train.weight_decay"),
    ({"beta_2": 1.0}, "train.beta_2"),
    ({"clip_norm": 0.0}, "train.clip_norm"),
    ({"min_learning_rate": -1.0}, "train.min_learning_rate"),
])
def test_bad_optimizer_settings_name_the_key(keys, match):
    with pytest.raises(ConfigError, match=match):
        train_section(**keys)


def test_gpt_only_model_keys_are_refused_for_other_models():
    from transformerkit.models.factory import build_model

    model_cfg = resolve({"model": {"type": "transformer", "initialization": "gpt2", **SIZE}})
    with pytest.raises(ValueError, match="model.initialization applies to model.type gpt"):
        build_model(model_cfg.model, 30, 30)
    model_cfg = resolve({"model": {"type": "transformer", "use_bias": False, **SIZE}})
    with pytest.raises(ValueError, match="model.use_bias applies to model.type gpt"):
        build_model(model_cfg.model, 30, 30)
    gpt_cfg = resolve({"model": {"type": "gpt", "scale_embeddings": True, "use_bias": False,
                                 **SIZE}})
    gpt = build_model(gpt_cfg.model, 30)
    assert gpt.scale_embeddings is True and gpt.use_bias is False


def test_apply_dropout_skips_only_calls_that_cannot_change_the_input():
    x = keras.ops.ones((4, 64))
    assert apply_dropout(keras.layers.Dropout(0.0), x, training=True) is x
    assert apply_dropout(keras.layers.Dropout(0.5), x, training=False) is x
    dropped = keras.ops.convert_to_numpy(apply_dropout(keras.layers.Dropout(0.5), x,
                                                       training=True))
    assert (dropped == 0).any() and set(np.unique(dropped)) <= {0.0, 2.0}


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the PyTorch fast path")
def test_fast_dropout_is_dropout(monkeypatch):
    """On PyTorch a plain Dropout multiplies by its own mask (``keep_mask``: SFC64 bits
    seeded from torch's global generator): kept values scaled by 1 / (1 - rate), the
    dropped share near the rate, gradients through the same mask, the global seed
    reproducing it, the next draw different; seeded or noise-shaped layers keep Keras' own
    call."""
    import torch

    from transformerkit.layers import dropout

    for rate in (0.1, 0.3):
        layer = keras.layers.Dropout(rate)
        x = torch.ones(300, 401, requires_grad=True)  # an odd number of elements
        torch.manual_seed(5)
        out = apply_dropout(layer, x, training=True)
        after_first = torch.get_rng_state()
        torch.manual_seed(5)
        again = apply_dropout(layer, x, training=True)
        torch.testing.assert_close(out, again, rtol=0, atol=0)
        assert torch.equal(torch.get_rng_state(), after_first)  # the global stream moved on
        following = apply_dropout(layer, x, training=True)
        assert not torch.equal(following, out)
        values = out.detach().numpy()
        assert set(np.unique(values)) == {0.0, np.float32(1 / (1 - rate))}
        for draw in (values, following.detach().numpy()):
            dropped = (draw == 0).mean()
            tol.assert_within(dropped, rate, sampling_atol(math.sqrt(rate * (1 - rate)),
                                                           draw.size))
        # neighbouring elements are independent: P(both dropped) = rate ** 2; overlapping
        # pairs share an element, which adds 2 (rate^3 - rate^4) to the variance of a pair
        both = (values[:, :-1] == 0) & (values[:, 1:] == 0)
        spread = math.sqrt(rate ** 2 * (1 - rate ** 2) + 2 * rate ** 3 * (1 - rate))
        tol.assert_within(both.mean(), rate ** 2, sampling_atol(spread, both.size))
        out.sum().backward()
        # exact: d(x * mask)/dx is the mask, and the values are 1 * mask
        np.testing.assert_array_equal(x.grad.numpy(), values)
        mask = dropout.keep_mask(torch.ones(7, 3, dtype=torch.float64), rate)
        assert mask.shape == (7, 3) and mask.dtype == torch.float64

    def no_fast_path(*args, **kwargs):
        raise AssertionError("the fast path was taken")

    monkeypatch.setattr(dropout, "keep_mask", no_fast_path)
    x = torch.ones(300, 400)
    for kept_by_keras in (keras.layers.Dropout(0.3, seed=1),
                          keras.layers.Dropout(0.3, noise_shape=(300, 1))):
        values = keras.ops.convert_to_numpy(apply_dropout(kept_by_keras, x, True))
        assert (values == 0).any() and set(np.unique(values)) <= {0.0, np.float32(1 / 0.7)}


# -- the tolerances still see a mistake ---------------------------------------------------------


def test_tolerances_still_catch_a_residual_scale_without_the_two(monkeypatch):
    """Planted bug: residual projections drawn with 0.02 / sqrt(num_layers) instead of GPT-2's
    0.02 / sqrt(2 * num_layers) (1.41 times too wide)."""
    import types

    from transformerkit.models import gpt

    monkeypatch.setattr(gpt, "math", types.SimpleNamespace(sqrt=lambda x: math.sqrt(x / 2)))
    tol.assert_caught(test_gpt2_initialisation_draws_the_documented_deviations)
