"""Run configuration: three YAML sections (``model``, ``data``, ``train``), validated.

Every key has a default and a type (:func:`schema`; the ``model`` keys are the models'
options, documented in ``Transformer``, ``GPT`` and ``Encoder``); unknown keys and wrong
types are errors that name the key. ``--set section.key=value`` overrides parse ``value``
as YAML (``--set train.epochs=3``, ``--set model.norm_position=pre``).
"""

import copy
import functools
import os
import re
from dataclasses import fields

import yaml

MODEL_TYPES = ("transformer", "gpt", "encoder")
PRECISIONS = ("float32", "mixed_bfloat16")
OPTIMIZERS = ("paper", "adamw_cosine")
DISTRIBUTIONS = ("none", "data_parallel", "model_parallel")

_DATA = {
    "dataset": ("multi30k", str),  # multi30k | parallel | tsv | text | ted_hrlr
    "data_dir": (None, str), "source_lang": ("de", str), "target_lang": ("en", str),
    "train_source": (None, str), "train_target": (None, str),
    "val_source": (None, str), "val_target": (None, str),
    "train_tsv": (None, str), "val_tsv": (None, str), "text": (None, str),
    "tokenizer": ("bpe", str),  # bpe | wordpiece | unigram | char | path to a HF folder
    "vocab_size": (8000, int), "lowercase": (False, bool), "shared_vocab": (True, bool),
    "max_length": (None, int), "tokens_per_batch": (4096, int), "batch_size": (None, int),
    "bucket": (True, bool), "pad_to_multiple": (None, int), "train_limit": (None, int),
    "val_limit": (None, int),
    "block_size": (64, int), "val_fraction": (0.1, float), "steps_per_epoch": (None, int),
}
_TRAIN = {
    "epochs": (10, int), "max_steps": (None, int), "time_budget": (None, str),
    "seed": (0, int), "warmup_steps": (4000, int), "lr_scale": (1.0, float),
    "learning_rate": (None, float), "label_smoothing": (0.1, float),
    # optimizer: paper (Adam 0.9/0.98/1e-9 on the warmup schedule, or a constant
    # learning_rate) | adamw_cosine (nanoGPT's recipe: AdamW with weight decay on matrices,
    # linear warmup over warmup_steps to learning_rate (default 1e-3), cosine decay to
    # min_learning_rate (default learning_rate / 10) at the run's last step, clip_norm)
    "optimizer": ("paper", str), "min_learning_rate": (None, float),
    "weight_decay": (0.1, float), "beta_2": (None, float), "clip_norm": (None, float),
    "jit_compile": ("auto", (bool, str)), "mixed_precision": (False, bool),
    # precision: float32 | mixed_bfloat16 (mixed_precision: true is an older spelling of the
    # latter); distribution: none | data_parallel | model_parallel (JAX backend; see
    # training/distribution.py), on `devices` devices (default all), model axis of
    # `model_parallel_size` devices (default all)
    "precision": ("float32", str), "distribution": ("none", str), "devices": (None, int),
    "model_parallel_size": (None, int),
    "samples": (5, int), "eval_max_sentences": (None, int), "decode_max_length": (None, int),
    "checkpoints_to_keep": (2, int), "verbose": ("auto", (int, str)),
    # monitors (training/monitors.py): sample outputs every N epochs|steps, validation BLEU
    "sample_every": (None, int), "sample_unit": ("epoch", str),
    "bleu_every": (None, int), "bleu_max_sentences": (200, int), "eval_beam_size": (1, int),
}


@functools.cache
def schema():
    """``{section: {key: (default, allowed types)}}``; a None default means "not set".

    The ``model`` section is derived from the models' option dataclasses
    (:mod:`transformerkit.models.options`): ``type``, one key per option a run config may
    set, and ``pretrained_embeddings`` (a ``.npy`` matrix). The options every model takes
    default to the paper's base model whatever ``model.type`` (data preparation reads
    ``model.max_length``), except the conventions each model sets its own way
    (``norm_position``, ``activation``, ...); those and the options only some models take
    default to None, the model's own default. Built on first use: importing the
    ``transformerkit.models`` package imports Keras, which importing this module must not.
    """
    from transformerkit.models import options

    shared = {f.name: f for f in fields(options.ModelOptions)}
    model = {"type": ("transformer", str)}
    for options_class in options.MODEL_OPTIONS.values():
        for f in options.config_fields(options_class):
            base = shared.get(f.name)
            own = base is None or base.metadata.get("own_default")
            model[f.name] = (None if own else base.default, options.value_type(f))
    model["pretrained_embeddings"] = (None, str)
    return {"model": model, "data": _DATA, "train": _TRAIN}


def __getattr__(name):
    if name == "SCHEMA":  # built on first use, see schema()
        return schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ConfigError(ValueError):
    """A configuration problem; the message names the key or file."""


def defaults():
    return {section: {k: v[0] for k, v in keys.items()} for section, keys in schema().items()}


def load_config(path=None, overrides=()):
    """Read a YAML config (or start from defaults), apply ``section.key=value`` overrides,
    validate and return the resolved dict."""
    raw = {}
    if path is not None:
        if not os.path.isfile(path):
            raise ConfigError(f"config file not found: {path}")
        try:
            with open(path, encoding="utf-8") as f:
                raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not valid YAML: {err}") from err
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path} is not UTF-8 text: {err}") from err
        except RecursionError:
            raise ConfigError(f"{path} is nested too deeply to be a config") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path} must be a mapping with sections model/data/train")
    raw = copy.deepcopy(raw)
    for item in overrides:
        section, key, value = _parse_override(item)
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise ConfigError(f"section {section!r} must be a mapping")
        raw[section][key] = value
    return resolve(raw, source=path or "config")


def resolve(raw, source="config"):
    """Validate ``raw`` against :func:`schema` and fill defaults."""
    sections = schema()
    unknown_sections = set(raw) - set(sections)
    if unknown_sections:
        raise ConfigError(f"{source}: unknown section(s) {sorted(map(str, unknown_sections))}; "
                          f"expected {sorted(sections)}")
    config = defaults()
    for section, values in raw.items():
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping")
        for key, value in values.items():
            if key not in sections[section]:
                close = [k for k in sections[section]
                         if k.split("_")[0] == str(key).split("_")[0]]
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{source}: unknown key {section}.{key}{hint}")
            default, types = sections[section][key]
            if value is None and default is not None:  # keys with a default must have a value
                raise ConfigError(f"{source}: {section}.{key} must be "
                                  f"{_names(types if isinstance(types, tuple) else (types,))}, "
                                  "got nothing (null)")
            config[section][key] = _check_type(f"{section}.{key}", value, types)
    _check_values(config, source)
    return config


def _check_type(name, value, types):
    if value is None:
        return None
    types = types if isinstance(types, tuple) else (types,)
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if bool not in types and isinstance(value, bool):
        raise ConfigError(f"{name} must be {_names(types)}, got {value!r}")
    if not isinstance(value, types):
        raise ConfigError(f"{name} must be {_names(types)}, got {value!r} "
                          f"({type(value).__name__})")
    return value


def _names(types):
    return " or ".join({int: "an integer", float: "a number", str: "a string",
                        bool: "true/false"}[t] for t in types)


def _check_values(config, source):
    model, data, train = config["model"], config["data"], config["train"]
    if model["type"] not in MODEL_TYPES:
        raise ConfigError(f"{source}: model.type must be one of {MODEL_TYPES}, "
                          f"got {model['type']!r}")
    for section, key in [("model", "num_layers"), ("model", "d_model"), ("model", "num_heads"),
                         ("model", "d_ff"), ("model", "max_length"), ("data", "vocab_size"),
                         ("train", "epochs"), ("train", "warmup_steps")]:
        if config[section][key] < 1:
            raise ConfigError(f"{source}: {section}.{key} must be positive, "
                              f"got {config[section][key]}")
    if data["batch_size"] is not None and data["batch_size"] < 1:
        raise ConfigError(f"{source}: data.batch_size must be positive")
    if train["max_steps"] is not None and train["max_steps"] < 1:
        raise ConfigError(f"{source}: train.max_steps must be positive")
    if train["time_budget"] is not None:
        parse_duration(train["time_budget"], "train.time_budget")
    if train["sample_unit"] not in ("epoch", "step"):
        raise ConfigError(f"{source}: train.sample_unit must be 'epoch' or 'step', "
                          f"got {train['sample_unit']!r}")
    for key in ("sample_every", "bleu_every", "bleu_max_sentences", "eval_beam_size"):
        if train[key] is not None and train[key] < 1:
            raise ConfigError(f"{source}: train.{key} must be positive, got {train[key]}")
    if train["precision"] not in PRECISIONS:
        raise ConfigError(f"{source}: train.precision must be one of {PRECISIONS}, "
                          f"got {train['precision']!r}")
    if train["distribution"] not in DISTRIBUTIONS:
        raise ConfigError(f"{source}: train.distribution must be one of {DISTRIBUTIONS}, "
                          f"got {train['distribution']!r}")
    for key in ("devices", "model_parallel_size"):
        if train[key] is not None and train[key] < 1:
            raise ConfigError(f"{source}: train.{key} must be positive, got {train[key]}")
    if train["optimizer"] not in OPTIMIZERS:
        raise ConfigError(f"{source}: train.optimizer must be one of {OPTIMIZERS}, "
                          f"got {train['optimizer']!r}")
    for key in ("learning_rate", "min_learning_rate", "clip_norm"):
        if train[key] is not None and not train[key] > 0:
            raise ConfigError(f"{source}: train.{key} must be positive, got {train[key]}")
    if not train["weight_decay"] >= 0:
        raise ConfigError(f"{source}: train.weight_decay must be >= 0, got "
                          f"{train['weight_decay']}")
    if train["beta_2"] is not None and not 0.0 < train["beta_2"] < 1.0:
        raise ConfigError(f"{source}: train.beta_2 must be in (0, 1), got {train['beta_2']}")
    if not 0.0 <= train["label_smoothing"] < 1.0:
        raise ConfigError(f"{source}: train.label_smoothing must be in [0, 1)")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr)?\s*$")


def parse_duration(text, name="duration"):
    """``"90s"``, ``"10m"``, ``"1.5h"`` or a bare number of seconds -> seconds (float)."""
    match = _DURATION.match(str(text))
    if not match:
        raise ConfigError(f"{name} must look like 90s, 10m or 1.5h; got {text!r}")
    value, unit = float(match.group(1)), (match.group(2) or "s")[0]
    return value * {"s": 1, "m": 60, "h": 3600}[unit]


def _parse_override(item):
    if "=" not in item or "." not in item.split("=", 1)[0]:
        raise ConfigError(f"--set expects section.key=value, got {item!r}")
    dotted, value = item.split("=", 1)
    section, key = dotted.split(".", 1)
    if section not in schema():
        raise ConfigError(f"--set {item!r}: unknown section {section!r}; "
                          f"expected one of {sorted(schema())}")
    try:
        parsed = yaml.safe_load(value) if value != "" else None
    except yaml.YAMLError:
        parsed = value
    return section, key, parsed


def save_config(config, path):
    """Write the resolved config as YAML, atomically."""
    from transformerkit.files import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config, sort_keys=False))
