"""Config loading and validation: every mistake names its key or file."""

import pytest

from transformerkit.config import ConfigError, load_config, parse_duration, resolve


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_and_overrides(tmp_path):
    path = write(tmp_path, "model:\n  d_model: 64\n  num_heads: 4\ntrain:\n  epochs: 2\n")
    config = load_config(path, ["train.epochs=5", "model.norm_position=pre",
                                "train.time_budget=10m", "data.lowercase=true"])
    assert config["model"]["d_model"] == 64
    assert config["train"]["epochs"] == 5
    assert config["model"]["norm_position"] == "pre"
    assert config["data"]["lowercase"] is True
    assert config["data"]["tokens_per_batch"] == 4096  # default filled in


@pytest.mark.parametrize("text, match", [
    ("model:\n  d_modle: 64\n", "model.d_modle"),
    ("modell:\n  d_model: 64\n", "unknown section"),
    ("model:\n  d_model: sixty\n", "model.d_model must be an integer"),
    ("model:\n  d_model: 1.5\n", "model.d_model must be an integer"),
    ("train:\n  epochs: true\n", "train.epochs"),
    ("model:\n  type: rnn\n", "model.type"),
    ("train:\n  time_budget: soon\n", "train.time_budget"),
    ("train:\n  label_smoothing: 1.5\n", "label_smoothing"),
    ("model: [1, 2]\n", "section 'model' must be a mapping"),
    ("model:\n  num_layers: 0\n", "model.num_layers must be positive"),
])
def test_invalid_configs_name_the_key(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, text))


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "model: [unclosed\n"))


@pytest.mark.parametrize("item, match", [("epochs=3", "section.key=value"),
                                         ("trian.epochs=3", "unknown section"),
                                         ("train.epoch=3", "train.epoch")])
def test_bad_overrides(item, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [item])


def test_int_accepted_for_float_key():
    config = resolve({"train": {"label_smoothing": 0}})
    assert config["train"]["label_smoothing"] == 0.0
    assert isinstance(config["train"]["label_smoothing"], float)


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("10m", 600), ("1.5h", 5400),
                                           ("45", 45)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_shipped_configs_are_valid():
    import glob

    paths = sorted(glob.glob("configs/*.yaml"))
    assert len(paths) >= 3
    for path in paths:
        load_config(path)
