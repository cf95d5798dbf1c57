"""The mini-GPT end to end: the shipped Shakespeare configs, nanoGPT's 90/10 character
split, causality of the configured model, a short training run whose validation loss
falls, reproducible generation through the API, and generation beyond the context window.
(Causality of small GPTs and gradient checks are in ``test_masks.py``; cached decoding is
in ``test_decoding.py``.)"""

import csv
import os
from pathlib import Path

import numpy as np
import pytest
import tolerances as tol

import transformerkit
from transformerkit.config import load_config

SHAKESPEARE = os.path.join("tinyshakespeare", "input.txt")
TINY_GPT = ["model.num_layers=1", "model.d_model=32", "model.num_heads=4", "model.d_ff=64",
            "model.max_length=32", "data.block_size=32", "data.batch_size=8",
            "data.steps_per_epoch=40", "train.epochs=3", "train.learning_rate=0.01",
            "train.warmup_steps=10", "train.min_learning_rate=0.01",
            # GPT-2's N(0, 0.02) suits widths of 128 and more; 32 wide, 120 steps would sit
            # on the unigram plateau, so this tiny model uses the layers' own initialisers
            "model.initialization=paper",
            "train.sample_every=null", "train.verbose=0", "train.time_budget=null"]


def to_numpy(x):
    import keras

    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize("name", ["shakespeare_gpt", "shakespeare_gpt_bpe"])
def test_shipped_configs_are_valid_gpt_configs(name):
    config = load_config(f"configs/{name}.yaml")
    assert config.model["type"] == "gpt" and config.data.dataset == "text"
    assert config.data.val_fraction == 0.1 and config.train.label_smoothing == 0.0
    assert config.data.block_size <= config.model["max_length"]


def test_char_split_is_nanogpt_90_10_by_characters(data_dir, tmp_path):
    from transformerkit.training.data_setup import prepare_data

    config = load_config("configs/shakespeare_gpt.yaml",
                         [f"data.data_dir={data_dir}", "data.steps_per_epoch=2"])
    data = prepare_data(config, str(tmp_path))
    # data/shakespeare_char/prepare.py: "train has 1,003,854 tokens", "val has 111,540 tokens"
    assert data.info == {"train_tokens": 1003854, "val_tokens": 111540}
    assert data.source_tokenizer.vocab_size == 65 + 4  # 65 characters + our 4 reserved ids


def test_the_shakespeare_recipe_downloads_its_text_into_an_empty_data_dir(data_dir, tmp_path,
                                                                           monkeypatch):
    """``configs/shakespeare_gpt.yaml`` names ``tinyshakespeare/input.txt`` in the data
    directory; where it is missing it is downloaded there and checked (served here from
    the shared copy), then split as nanoGPT splits it."""
    import io

    from transformerkit.data import corpora
    from transformerkit.training.data_setup import prepare_data

    fetched = []

    def opener(url, timeout=None):
        fetched.append(url)
        return io.BytesIO((Path(data_dir) / SHAKESPEARE).read_bytes())

    monkeypatch.setattr(corpora, "_urlopen", opener)
    config = load_config("configs/shakespeare_gpt.yaml",
                         [f"data.data_dir={tmp_path / 'data'}", "data.steps_per_epoch=2"])
    data = prepare_data(config, str(tmp_path / "run"))
    assert len(fetched) == 1 and fetched[0].endswith("/data/tinyshakespeare/input.txt")
    assert (tmp_path / "data" / SHAKESPEARE).is_file()
    assert data.info == {"train_tokens": 1003854, "val_tokens": 111540}


def test_configured_gpt_is_causal():
    from transformerkit.models.factory import build_model

    config = load_config("configs/shakespeare_gpt.yaml")
    model = build_model(config.model, 69)
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 69, size=(2, 64)).astype("int32")
    changed = ids.copy()
    changed[:, 40:] = rng.integers(4, 69, size=(2, 24))
    a, b = to_numpy(model(ids)), to_numpy(model(changed))
    # exact: the later tokens reach the first 40 positions only through exactly zero
    # attention weights, in the same kernels on the same shapes (row i of a product does not
    # depend on the other rows)
    np.testing.assert_array_equal(a[:, :40], b[:, :40])
    assert np.abs(a[:, 40:] - b[:, 40:]).max() > 1e-3  # other tokens: other logits, not rounding


@pytest.fixture(scope="module")
def tiny_run(data_dir, tmp_path_factory):
    """A 1-layer char GPT trained for 3 x 40 steps on the first 200k characters."""
    from transformerkit.training.trainer import train

    folder = tmp_path_factory.mktemp("gpt_e2e")
    text = folder / "shakespeare_200k.txt"
    with open(os.path.join(data_dir, SHAKESPEARE), encoding="utf-8") as f:
        text.write_text(f.read()[:200_000], encoding="utf-8")
    config = load_config("configs/shakespeare_gpt.yaml", [*TINY_GPT, f"data.text={text}"])
    train(config, str(folder / "run"))
    return folder / "run"


def test_short_gpt_training_lowers_validation_loss(tiny_run):
    with open(tiny_run / "history.csv") as f:
        val = [float(row["val_loss"]) for row in csv.DictReader(f)]
    assert len(val) == 3
    assert val[-1] < val[0] < np.log(69)  # below chance after 40 steps, and still falling
    assert val[-1] < 2.9


def test_same_seed_gives_same_generation(tiny_run):
    run = transformerkit.load(tiny_run)
    first = run.generate("ROMEO:", max_new_tokens=20, temperature=0.8, top_k=40, seed=1)
    assert first.startswith("ROMEO:") and len(first) == len("ROMEO:") + 20
    assert run.generate("ROMEO:", max_new_tokens=20, temperature=0.8, top_k=40, seed=1) == first
    others = {run.generate("ROMEO:", max_new_tokens=20, temperature=0.8, top_k=40, seed=s)
              for s in (2, 3, 4)}
    assert others != {first}


def test_generation_beyond_the_context_window(tiny_run):
    from transformerkit.decoding import generate_ids

    run = transformerkit.load(tiny_run)
    prompt = run.source_tokenizer.encode("ROMEO:")
    limit = run.model.max_length - len(prompt)  # 26 new tokens fit in one window
    long = generate_ids(run.model, prompt, 3 * run.model.max_length, temperature=0)
    assert len(long) == 3 * run.model.max_length
    assert long[:limit] == generate_ids(run.model, prompt, limit, temperature=0)
    sampled = generate_ids(run.model, prompt, 80, top_p=0.9, seed=4)
    assert len(sampled) == 80 and generate_ids(run.model, prompt, 80, top_p=0.9, seed=4) == sampled
    text = run.generate("ROMEO:", max_new_tokens=100, seed=0)
    assert len(text) == len("ROMEO:") + 100


def test_gpt_recipe_matches_nanogpt_schedule_and_decay():
    import math

    from transformerkit.models import GPT
    from transformerkit.training.gpt_recipe import WarmupCosineSchedule, gpt_optimizer

    def nanogpt_lr(it, lr=1e-3, warmup=100, decay=2000, min_lr=1e-4):  # train.py get_lr
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        if it > decay:
            return min_lr
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (decay - warmup))) * \
            (lr - min_lr)

    schedule = WarmupCosineSchedule(1e-3, 100, 2000, 1e-4)
    # float32: the ratio, pi * ratio, cos, the sums and products, on terms <= pi * peak
    atol = tol.gamma(tol.ELEMENTWISE_ULPS + 8) * math.pi * 1e-3
    for it in (0, 1, 50, 99, 100, 101, 777, 1999, 2000, 2001, 5000):
        tol.assert_within(float(to_numpy(schedule(it))), nanogpt_lr(it), atol, err_msg=str(it))
    model = GPT(69, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=8,
                tie_embeddings="all")
    model.build()
    optimizer = gpt_optimizer()
    optimizer.build(model.trainable_variables)  # as model.fit does before the first update
    assert all(optimizer._use_weight_decay(v) == (len(v.shape) >= 2)
               for v in model.trainable_variables)


@pytest.mark.parametrize("name", ["shakespeare_gpt", "shakespeare_gpt_bpe"])
def test_the_shakespeare_recipes_cool_down_where_the_budget_ends_them_early(name):
    """The shipped GPT recipes plan nanoGPT's cosine over their 2000 updates; a time budget
    that ends the run at update 500 (the estimate ``StopConditions`` makes) moves their
    cooldown there: the rate follows the planned cosine until update 400, then falls to
    zero at 500, instead of stopping at the cosine's 9e-4."""
    import types

    from transformerkit.training.gpt_recipe import WarmupCosineSchedule
    from transformerkit.training.trainer import attach_cooldown, build_optimizer

    config = load_config(f"configs/{name}.yaml")
    planned = config.train.epochs * config.data.steps_per_epoch
    optimizer = build_optimizer(types.SimpleNamespace(d_model=128), config.train, planned)
    cooldown = attach_cooldown(optimizer)
    assert cooldown is not None and cooldown.end == planned
    cosine = WarmupCosineSchedule(1e-3, 100, planned, 1e-4)
    cooldown.retarget(64, 500)  # the budget's estimate of the run's length
    rates = to_numpy(cooldown(np.arange(500)))
    expected = to_numpy(cosine(np.arange(500)))
    np.testing.assert_allclose(rates[:400], expected[:400], rtol=1e-6)
    assert expected[499] > 8e-4 and rates[499] < expected[499] / 50
    assert np.all(np.diff(rates[400:]) < 0)
