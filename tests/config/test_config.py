"""Config loading and validation: every mistake names its key or file."""

import dataclasses

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
    assert config.model["d_model"] == 64
    assert config.train.epochs == 5
    assert config.model["norm_position"] == "pre"
    assert config.data.lowercase is True
    assert config.data.tokens_per_batch == 4096  # default filled in


def test_numbers_in_exponent_form_are_numbers(tmp_path):
    """``1e-5`` and ``3E4`` are numbers in a config file and in ``--set`` (as in YAML 1.2,
    Python and JSON), not the strings PyYAML's YAML 1.1 rules make of them without a dot;
    a quoted one stays a string."""
    path = write(tmp_path, "model:\n  layer_norm_epsilon: 1e-5\ntrain:\n  learning_rate: 3e-4\n")
    config = load_config(path, ["train.min_learning_rate=1E-6"])
    assert config.model["layer_norm_epsilon"] == 1e-5
    assert config.train.learning_rate == 3e-4 and config.train.min_learning_rate == 1e-6
    with pytest.raises(ConfigError, match="data.vocab_size must be an integer"):
        load_config(None, ["data.vocab_size=8e3"])  # a float still is not an integer
    with pytest.raises(ConfigError, match="must be a number, got str"):
        load_config(write(tmp_path, "train:\n  learning_rate: '1e-4'\n"))


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
    assert config.train.label_smoothing == 0.0
    assert isinstance(config.train.label_smoothing, float)


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


def test_every_key_has_a_one_line_meaning():
    """``transformerkit config`` documents every key from the schema alone."""
    from transformerkit.config import SECTIONS, schema

    assert list(schema()) == list(SECTIONS)
    for section, keys in schema().items():
        for name, key in keys.items():
            assert isinstance(key.help, str) and key.help.strip(), f"{section}.{name}"
            assert "\n" not in key.help and key.help == key.help.strip(), f"{section}.{name}"
            assert key[:2] == (key.default, key.types)
            assert key.choices is None or key.default is None or key.default in key.choices


def test_model_keys_mean_what_the_options_fields_say():
    """Every field of every options dataclass has a help, the same in every class that has
    it (the config shows one per key), and the config's ``model:`` key shows it."""
    import dataclasses

    from transformerkit.config import schema
    from transformerkit.models import options

    helps = {}
    for cls in options.MODEL_OPTIONS.values():
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name}"
            assert helps.setdefault(f.name, f.metadata["help"]) == f.metadata["help"], f.name
    model = schema()["model"]
    assert all(model[name].help == helps[name] for name in model if name in helps)
    assert model["tie_embeddings"].models == {"transformer": "none", "gpt": "none"}
    assert model["norm_position"].models == {"transformer": "post", "gpt": "pre",
                                             "encoder": "post"}
    assert model["d_model"].models is None and model["d_model"].default == 512


@pytest.mark.parametrize("raw", [{}, {
    "model": {"type": "gpt", "use_bias": False, "layer_norm_epsilon": 1e-5},
    "data": {"text": "a b #c: d.txt", "source_lang": "yes", "target_lang": "null"},
    "train": {"time_budget": "10m", "jit_compile": True, "lr_scale": 2, "verbose": 0}}])
def test_describe_is_yaml_that_loads_back(tmp_path, raw):
    from transformerkit.config import describe

    config = resolve(raw)
    text = describe(config, "test")
    assert text.startswith("# transformerkit configuration: test\n")
    assert load_config(write(tmp_path, text)) == config


# -- the typed sections ------------------------------------------------------------------------

def test_the_data_and_train_keys_are_the_declared_fields():
    """The schema, the defaults and ``transformerkit config`` list the dataclass fields;
    a key may be null when declared ``X | None``: every key whose default is null, and a
    few others whose help says what null means (``train.sample_top_k``: all tokens)."""
    import dataclasses

    from transformerkit.config import DataOptions, TrainOptions, defaults, schema
    from transformerkit.config.sections import nullable

    for section, options in (("data", DataOptions), ("train", TrainOptions)):
        declared = dataclasses.fields(options)
        assert list(schema()[section]) == [f.name for f in declared]
        assert defaults()[section] == options().to_dict()
        for f in declared:
            assert nullable(f) or f.default is not None, f"{section}.{f.name}"
            if nullable(f) and f.default is not None:
                assert "null: " in f.metadata["help"], f"{section}.{f.name}"


@pytest.mark.parametrize("raw, message", [
    ({"data": {"dataset": "wmt"}}, "data.dataset must be one of"),
    ({"data": {"tokens_per_batch": 0}}, "data.tokens_per_batch must be at least 1, got 0"),
    ({"data": {"val_fraction": 1.0}}, r"data.val_fraction must be in \(0, 1\), got 1.0"),
    ({"data": {"train_files": "a.tsv"}}, "data.train_files must be a list"),
    ({"train": {"samples": -1}}, "train.samples must be at least 0, got -1"),
    ({"train": {"beta_2": 1.0}}, r"train.beta_2 must be in \(0, 1\), got 1.0"),
    ({"train": {"sample_top_p": 0}}, r"train.sample_top_p must be in \(0, 1\], got 0.0"),
    ({"train": {"label_smoothing": float("nan")}}, r"label_smoothing must be in \[0, 1\)"),
    ({"train": {"lr_scale": -2}}, "train.lr_scale must be a finite number > 0, got -2.0"),
    ({"train": {"clip_norm": float("inf")}}, "train.clip_norm must be a finite number > 0, "
                                             "got inf"),
    ({"train": {"sample_unit": "batch"}}, "train.sample_unit must be one of"),
    ({"train": {"epochs": None}}, "train.epochs must be an integer, got nothing"),
    ({"search": {"beam_size": 0}}, "c.yaml: search.beam_size must be at least 1, got 0"),
    ({"search": {"stopping": "soon"}}, "search.stopping must be one of"),
    ({"search": {"forced_eos": 1}}, "search.forced_eos must be true/false, got int 1"),
    ({"search": {"beam": 2}}, "unknown key search.beam"),
    ({"search": {"n_best": 2, "temperature": 1.0}}, "c.yaml: search: n_best=2 lists come "
                                                    "from beam search"),
])
def test_types_ranges_and_choices_come_from_the_declarations(raw, message):
    with pytest.raises(ConfigError, match=message):
        resolve(raw, "c.yaml")


def test_a_run_config_is_typed_frozen_and_round_trips(tmp_path):
    import dataclasses

    import yaml

    from transformerkit.config import RunConfig, TrainOptions, save_config

    config = load_config(None, ["train.epochs=3", "model.d_model=64", "data.vocab_size=500"])
    assert isinstance(config.train, TrainOptions) and config.train.epochs == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train.epochs = 4
    with pytest.raises(TypeError, match="read-only"):
        config.model["d_model"] = 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.d_model = 32
    assert config.model.d_model == config.model["d_model"] == 64  # typed fields, a mapping
    assert {f.name: f.type for f in dataclasses.fields(config.model)}["d_model"] is int
    assert dict(config.model)["type"] == "transformer" and len(config.model) == len(
        dataclasses.fields(config.model))
    save_config(config, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert list(saved) == ["model", "data", "train"] and saved["train"]["epochs"] == 3
    assert load_config(str(tmp_path / "config.yaml")) == config
    assert RunConfig.from_dict(config.to_dict()) == config
    changed = config.replace(train={"epochs": 5}, model={"dropout": 0.0})
    assert (changed.train.epochs, changed.model["dropout"], config.train.epochs) == (5, 0.0, 3)
    with pytest.raises(ConfigError, match="checkpoints_to_keep >= 5"):  # checked again
        config.replace(train={"average_last": 5})


def test_the_search_section_is_the_runs_search_options(tmp_path):
    """``search:`` holds the fields of ``SearchOptions``: how the run translates unless told
    otherwise. A config without it (a trained run) has the declared defaults and saves no
    such section; one with it (an imported run) saves every key and reads back the same."""
    import yaml

    from transformerkit.config import save_config
    from transformerkit.decoding.options import SearchOptions

    config = load_config(None, ["train.epochs=3"])
    assert config.search == SearchOptions() and "search" not in config.to_dict()
    config = load_config(None, ["search.beam_size=6", "search.stopping=heuristic",
                                "search.max_len_a=null", "search.forced_eos=true"])
    assert config.search == SearchOptions(beam_size=6, stopping="heuristic", max_len_a=None,
                                          forced_eos=True)
    save_config(config, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert list(saved) == ["model", "data", "train", "search"]
    assert saved["search"] == dataclasses.asdict(config.search)
    assert load_config(str(tmp_path / "config.yaml")) == config
    assert config.replace(search={"alpha": 1.0}).search.alpha == 1.0
    assert load_config().replace(search={"beam_size": 2}).search.beam_size == 2


def test_the_generation_section_is_a_gpt_runs_generation_options(tmp_path):
    """``generation:`` holds the fields of ``GenerationOptions``: how a GPT run continues a
    prompt unless told otherwise, kept like ``search:`` (no section where it is the declared
    defaults; every key where it is not); its keys are checked and named."""
    import yaml

    from transformerkit.config import save_config
    from transformerkit.decoding.options import GenerationOptions

    config = load_config(None, ["model.type=gpt"])
    assert config.generation == GenerationOptions() and "generation" not in config.to_dict()
    config = load_config(None, ["model.type=gpt", "generation.temperature=0",
                                "generation.max_new_tokens=30"])
    assert config.generation == GenerationOptions(temperature=0.0, max_new_tokens=30)
    save_config(config, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert list(saved) == ["model", "data", "train", "generation"]
    assert saved["generation"] == dataclasses.asdict(config.generation)
    assert load_config(str(tmp_path / "config.yaml")) == config
    with pytest.raises(ConfigError, match=r"generation\.temperature"):
        load_config(None, ["generation.temperature=-1"])
    with pytest.raises(ConfigError, match=r"unknown key generation\.beam_size"):
        load_config(None, ["generation.beam_size=4"])


def test_a_config_yaml_of_an_earlier_run_loads(tmp_path):
    """Runs saved their config as plain YAML sections; one without the keys added since
    (``data.data_dir`` not recorded) loads with the defaults."""
    text = ("model:\n  type: transformer\n  d_model: 32\n  num_heads: 2\n"
            "data:\n  dataset: multi30k\n  data_dir: null\n  tokenizer: bpe\n"
            "train:\n  epochs: 2\n  sample_unit: epoch\n")
    config = load_config(write(tmp_path, text))
    assert config.data.data_dir is None and config.model["d_model"] == 32
    assert config.train.epochs == 2


def test_train_keys_that_are_decoding_options_share_their_defaults_or_say_why():
    """A ``train:`` key naming a field of ``decoding/options.py`` (``decoding=``) has that
    field's default, or declares why not (``differs=``, also said in its help)."""
    import dataclasses

    from transformerkit.config import TrainOptions
    from transformerkit.decoding import options as decoding

    paired = [f for f in dataclasses.fields(TrainOptions) if f.metadata["decoding"]]
    assert {f.name for f in paired} >= {"sample_temperature", "sample_top_k", "sample_top_p",
                                        "eval_beam_size", "decode_max_length"}
    for f in paired:
        owner, name = f.metadata["decoding"].split(".")
        theirs = next(g for g in dataclasses.fields(getattr(decoding, owner))
                      if g.name == name)
        if f.default != theirs.default:
            assert f.metadata["differs"], f"train.{f.name} differs from {owner}.{name}"
            assert "generate" in f.metadata["help"] or "translate's" in f.metadata["help"], \
                f"train.{f.name}: its help says how it differs"
        else:
            assert not f.metadata["differs"], f.name
