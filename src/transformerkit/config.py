"""Run configuration: three YAML sections (``model``, ``data``, ``train``), validated.

Every key has a default, a type and a one-line meaning (:func:`schema`: the ``data`` and
``train`` keys are declared here, the ``model`` keys are the models' option dataclasses of
:mod:`transformerkit.models.options`); unknown keys and wrong types are errors that name
the key. ``--set section.key=value`` overrides parse ``value`` as YAML (``--set
train.epochs=3``, ``--set model.norm_position=pre``). :func:`describe` prints a resolved
config with every key's type, default and meaning (``transformerkit config``).
"""

import copy
import functools
import json
import os
import re
from dataclasses import fields
from typing import NamedTuple

import yaml

MODEL_TYPES = ("transformer", "gpt", "encoder")
STOPPING_METRICS = ("val_loss", "val_bleu", "val_accuracy")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
OPTIMIZERS = ("paper", "adamw_cosine")
DISTRIBUTIONS = ("none", "data_parallel", "model_parallel")

DATASETS = ("multi30k", "parallel", "tsv", "files", "text", "ted_hrlr")
SAMPLE_UNITS = ("epoch", "step")


class Key(NamedTuple):
    """One config key: its default (None: not set), the allowed type(s) of its values, its
    meaning in one line, its allowed values (None: any value of the type) and, for the
    ``model:`` keys of some models only or with each model's own default, ``{model type: that
    model's default}`` for the types that take it (None: every type, no default of its own).
    ``key[0]`` and ``key[1]`` are the default and the types."""

    default: object
    types: type | tuple
    help: str
    choices: tuple | None = None
    models: dict | None = None


# What each section is for (a comment above it in `transformerkit config`).
SECTIONS = {
    "model": "the network: model.type and its options (keys for other types stay null)",
    "data": "corpus, tokenizers and batches",
    "train": "optimizer, stopping, precision, devices, evaluation and monitors",
}

_DATA = {
    "dataset": Key("multi30k", str, "the corpus: multi30k (downloaded), parallel (two files), "
                                    "tsv, files (train_files: text/tsv/jsonl, several), "
                                    "text (GPT), ted_hrlr (tensorflow-datasets)",
                   DATASETS),
    "data_dir": Key(None, str, "data directory (null: $TRANSFORMERKIT_DATA, else "
                               "~/.cache/transformerkit); `train --data-dir` sets it"),
    "source_lang": Key("de", str, "source language (multi30k, ted_hrlr)"),
    "target_lang": Key("en", str, "target language (multi30k, ted_hrlr)"),
    "train_source": Key(None, str, "dataset parallel: training source sentences, one per line"),
    "train_target": Key(None, str, "dataset parallel: training target sentences, line by line "
                                   "with train_source"),
    "val_source": Key(None, str, "dataset parallel: validation source sentences (null: no "
                                 "validation)"),
    "val_target": Key(None, str, "dataset parallel: validation target sentences"),
    "train_tsv": Key(None, str, "dataset tsv: training pairs, SOURCE<TAB>TARGET per line"),
    "val_tsv": Key(None, str, "dataset tsv: validation pairs (null: no validation)"),
    "test_source": Key(None, str, "dataset parallel: test source sentences (`evaluate "
                                  "--split test`)"),
    "test_target": Key(None, str, "dataset parallel: test target sentences"),
    "test_tsv": Key(None, str, "dataset tsv: test pairs (`evaluate --split test`)"),
    "train_files": Key(None, list, "dataset files: training corpora, each a path (.tsv or "
                                   ".jsonl, optionally .gz) or a mapping {path | source + "
                                   "target, format, and any of the reading keys below}"),
    "val_files": Key(None, list, "dataset files: validation corpora, as train_files (null: "
                                 "no validation)"),
    "test_files": Key(None, list, "dataset files: test corpora for `evaluate --split test`"),
    "source_column": Key(0, (int, str), "tsv: the source column, 0-based index or header "
                                        "name"),
    "target_column": Key(1, (int, str), "tsv: the target column, 0-based index or header "
                                        "name"),
    "header": Key(False, bool, "tsv: the first line names the columns (not a pair)"),
    "source_key": Key("source", str, "jsonl: the field holding the source sentence"),
    "target_key": Key("target", str, "jsonl: the field holding the target sentence"),
    "tokenizer_sample": Key(1_000_000, int, "train the tokenizer(s) on a random sample of "
                                            "this many training pairs"),
    "cache_dir": Key(None, str, "where encoded corpora are cached and memory-mapped (null: "
                                "$TRANSFORMERKIT_CACHE, else "
                                "$XDG_CACHE_HOME/transformerkit/token-cache)"),
    "text": Key(None, str, "dataset text: the text file a GPT trains on (also looked up in "
                           "the data directory)"),
    "tokenizer": Key("bpe", str, "bpe, wordpiece or unigram (trained on the training text), "
                                 "char, or a path: an earlier run's directory (reuses its "
                                 "vocabulary), a tokenizer .json file or a Hugging Face "
                                 "tokenizer folder"),
    "vocab_size": Key(8000, int, "vocabulary size of a trained subword tokenizer"),
    "lowercase": Key(False, bool, "lowercase the text before subword tokenization"),
    "shared_vocab": Key(True, bool, "one tokenizer for source and target (always with "
                                    "model.tie_embeddings: all)"),
    "max_length": Key(None, int, "drop pairs longer than this many tokens on either side "
                                 "(null: model.max_length)"),
    "tokens_per_batch": Key(4096, int, "token budget of a batch (rows x longest row, padded), "
                                       "unless batch_size"),
    "batch_size": Key(None, int, "rows per batch instead of tokens_per_batch (GPT: sequences "
                                 "per batch, null: 12)"),
    "bucket": Key(True, bool, "batch pairs of similar length together (tokens_per_batch needs "
                              "it)"),
    "pad_to_multiple": Key(None, int, "pad batch widths to a multiple of this (null: 1 on "
                                      "torch, 8 on jax and tensorflow: fewer shapes to "
                                      "compile)"),
    "train_limit": Key(None, int, "use only the first N training pairs (null: all)"),
    "val_limit": Key(None, int, "use only the first N validation pairs (null: all)"),
    "block_size": Key(64, int, "GPT: tokens per training sequence (at most model.max_length)"),
    "val_fraction": Key(0.1, float, "GPT: the fraction at the end of data.text held out for "
                                    "validation"),
    "steps_per_epoch": Key(None, int, "GPT: batches per epoch (null: one pass over the "
                                      "training text)"),
}
_TRAIN = {
    "epochs": Key(10, int, "passes over the training data (raised if max_steps needs more)"),
    "max_steps": Key(None, int, "stop after this many optimizer steps (null: no limit)"),
    "time_budget": Key(None, str, "stop after this much training time: 90s, 10m, 1.5h (null: "
                                  "no limit)"),
    "seed": Key(0, int, "random seed: weights, dropout, batch order"),
    "warmup_steps": Key(4000, int, "learning-rate warmup steps (paper schedule, or "
                                   "adamw_cosine's linear warmup)"),
    "lr_scale": Key(1.0, float, "factor on the paper's schedule d_model^-0.5 * "
                                "min(step^-0.5, step * warmup_steps^-1.5)"),
    "learning_rate": Key(None, float, "paper: a constant rate instead of the schedule; "
                                      "adamw_cosine: the peak (null: 1e-3)"),
    "label_smoothing": Key(0.1, float, "label smoothing of the cross-entropy loss"),
    "optimizer": Key("paper", str, "paper: Adam(0.9, 0.98, 1e-9) on the warmup schedule; "
                                   "adamw_cosine: nanoGPT's AdamW, warmup, cosine decay",
                     OPTIMIZERS),
    "min_learning_rate": Key(None, float, "adamw_cosine: where the cosine decay ends, at the "
                                          "run's last step (null: learning_rate / 10)"),
    "weight_decay": Key(0.1, float, "adamw_cosine: AdamW weight decay, on the matrices only"),
    "beta_2": Key(None, float, "Adam's beta_2 (null: 0.98 with paper, 0.99 with "
                               "adamw_cosine)"),
    "clip_norm": Key(None, float, "clip the global gradient norm to this (null: no clipping; "
                                  "adamw_cosine: 1.0)"),
    "jit_compile": Key("auto", (bool, str), "Keras' jit_compile: auto, true (XLA on jax and "
                                            "tensorflow, torch.compile on torch) or false"),
    "mixed_precision": Key(False, bool, "true: an older spelling of precision: "
                                        "mixed_bfloat16"),
    "precision": Key("float32", str, "mixed_bfloat16: bfloat16 math, float32 weights; "
                                     "mixed_float16: float16 math with loss scaling",
                     PRECISIONS),
    "distribution": Key("none", str, "several devices (JAX backend): data_parallel or "
                                     "model_parallel (training/distribution.py)",
                        DISTRIBUTIONS),
    "devices": Key(None, int, "number of devices to distribute over (null: all)"),
    "process_timeout": Key("30m", str, "several processes (torchrun, JAX): how long a "
                                       "process waits for the others before it stops with "
                                       "an error: 90s, 10m"),
    "model_parallel_size": Key(None, int, "model_parallel: devices along the model axis "
                                          "(null: all)"),
    "samples": Key(5, int, "translations (GPT: generated texts) written to samples.txt at "
                           "the end"),
    "eval_max_sentences": Key(None, int, "validation sentences translated for the final "
                                         "BLEU and chrF (null: all)"),
    "decode_max_length": Key(None, int, "longest translation, in tokens, in evaluation and "
                                        "samples (null: the model's max_length)"),
    "checkpoints_to_keep": Key(2, int, "checkpoints kept in RUN/checkpoints, epoch ends and "
                                       "checkpoint_every ones (best.keras besides)"),
    "checkpoint_every": Key(None, int, "also checkpoint every N optimizer steps inside an "
                                       "epoch; --resume continues there (null: epoch ends)"),
    "average_last": Key(None, int, "at the end, average the last N checkpoints into "
                                   "RUN/averaged.keras and evaluate it too (paper: 5)"),
    "patience": Key(None, int, "early stopping: stop after N evaluations of "
                               "early_stopping_metric without improvement (null: never)"),
    "early_stopping_metric": Key("val_loss", str, "what patience and best.keras watch: "
                                                  "val_loss (lower), val_bleu (higher, "
                                                  "needs bleu_every) or val_accuracy "
                                                  "(higher; an encoder classifier)",
                                 STOPPING_METRICS),
    "accumulate_steps": Key(1, int, "batches per optimizer update: gradients of k batches "
                                    "weighted by their tokens, one update (steps count "
                                    "updates)"),
    "verbose": Key("auto", (int, str), "progress of model.fit: auto, 0 (silent), 1 (progress "
                                       "bar) or 2 (one line per epoch)"),
    "sample_every": Key(None, int, "print sample translations (GPT: texts) every N "
                                   "sample_units while training (null: never)"),
    "sample_unit": Key("epoch", str, "the unit of sample_every", SAMPLE_UNITS),
    "sample_prompts": Key(None, list, "GPT: prompts the samples continue, during training "
                                      "and in samples.txt (null: the start of the "
                                      "validation text)"),
    "sample_max_tokens": Key(None, int, "GPT: tokens generated per sample (null: "
                                        "decode_max_length, else 200)"),
    "sample_temperature": Key(0.8, float, "GPT: sampling temperature of the samples (0: "
                                          "greedy)"),
    "sample_top_k": Key(50, int, "GPT: sample among the k most likely tokens (null: all)"),
    "sample_top_p": Key(None, float, "GPT: sample within top-p probability mass (null: off)"),
    "bleu_every": Key(None, int, "validation BLEU and chrF every N epochs, in history.csv as "
                                 "val_bleu, val_chrf (null: never)"),
    "bleu_max_sentences": Key(200, int, "validation sentences that bleu_every translates"),
    "eval_beam_size": Key(1, int, "beam size of the validation translations (1: greedy)"),
}


@functools.cache
def schema():
    """``{section: {key: Key(default, allowed types, help, ...)}}``; a None default means
    "not set".

    The ``model`` section is derived from the models' option dataclasses
    (:mod:`transformerkit.models.options`, whose fields carry the ``help``): ``type``, one
    key per option a run config may set, and ``pretrained_embeddings`` (a ``.npy`` matrix).
    The options every model takes default to the paper's base model whatever ``model.type``
    (data preparation reads ``model.max_length``), except the conventions each model sets
    its own way (``norm_position``, ``activation``, ...); those and the options only some
    models take default to None, the model's own default. Built on first use: importing the
    ``transformerkit.models`` package imports Keras, which importing this module must not.
    """
    from transformerkit.models import options

    shared = {f.name: f for f in fields(options.ModelOptions)}
    model = {"type": Key("transformer", str, "which model: transformer (encoder-decoder), gpt "
                                             "(decoder only) or encoder (BERT-like; `train` "
                                             "trains it as a text classifier)", MODEL_TYPES)}
    takers = {}
    for kind, options_class in options.MODEL_OPTIONS.items():
        for f in options.config_fields(options_class):
            base = shared.get(f.name)
            own = base is None or base.metadata.get("own_default")
            takers.setdefault(f.name, {})[kind] = f.default
            model.setdefault(f.name, Key(None if own else base.default, options.value_type(f),
                                         f.metadata["help"], f.metadata["choices"]))
    for name, defaults_by_model in takers.items():
        if model[name].default is None and (len(defaults_by_model) < len(MODEL_TYPES) or any(
                default is not None for default in defaults_by_model.values())):
            model[name] = model[name]._replace(models=defaults_by_model)
    model["pretrained_embeddings"] = Key(None, str, ".npy file of a (vocab, d_model) matrix "
                                                    "the token embeddings start from "
                                                    "(Transformer: the source's)")
    model["embeddings"] = Key(None, dict, "pretrained vectors (word2vec/GloVe text, BPEmb "
                                          "pieces, .gz): {source|target|shared: FILE or {file, "
                                          "tokens: auto|words|pieces, limit}}; the tokenizer "
                                          "is built from the file's tokens (see README)")
    model["pretrained"] = Key(None, str, "encoder: a local Hugging Face BERT or DistilBERT "
                                         "folder to start from (its architecture, dropout, "
                                         "weights and tokenizer; of the other model keys only "
                                         "pooling and num_classes are used)")
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
            default, types = sections[section][key][:2]
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
                        bool: "true/false", list: "a list", dict: "a mapping"}[t]
                       for t in types)


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
    if data["tokenizer_sample"] < 1:
        raise ConfigError(f"{source}: data.tokenizer_sample must be positive, got "
                          f"{data['tokenizer_sample']}")
    if train["max_steps"] is not None and train["max_steps"] < 1:
        raise ConfigError(f"{source}: train.max_steps must be positive")
    if train["time_budget"] is not None:
        parse_duration(train["time_budget"], "train.time_budget")
    if not parse_duration(train["process_timeout"], "train.process_timeout") > 0:
        raise ConfigError(f"{source}: train.process_timeout must be positive")
    if train["sample_unit"] not in ("epoch", "step"):
        raise ConfigError(f"{source}: train.sample_unit must be 'epoch' or 'step', "
                          f"got {train['sample_unit']!r}")
    for key in ("sample_every", "bleu_every", "bleu_max_sentences", "eval_beam_size",
                "sample_max_tokens", "sample_top_k"):
        if train[key] is not None and train[key] < 1:
            raise ConfigError(f"{source}: train.{key} must be positive, got {train[key]}")
    _check_sampling_keys(train, source)
    _check_embeddings(model, source)
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
    _check_long_run_keys(train, source)
    _check_model_task(config, source)


def _check_model_task(config, source):
    """What only a translation model or only an encoder classifier has."""
    model, train = config["model"], config["train"]
    if model["type"] == "encoder":
        for key in ("bleu_every", "sample_every"):
            if train[key] is not None:
                raise ConfigError(f"{source}: train.{key} translates or generates; an encoder "
                                  "classifier has no text to show (its validation accuracy "
                                  "is in history.csv as val_accuracy)")
        if train["early_stopping_metric"] == "val_bleu":
            raise ConfigError(f"{source}: train.early_stopping_metric val_bleu is a "
                              "translation score; an encoder uses val_loss or val_accuracy")
        return
    if train["early_stopping_metric"] == "val_accuracy":
        raise ConfigError(f"{source}: train.early_stopping_metric val_accuracy is an encoder "
                          "classifier's; use val_loss (or val_bleu with train.bleu_every)")
    if model["pretrained"] is not None:
        raise ConfigError(f"{source}: model.pretrained (a Hugging Face BERT/DistilBERT "
                          "folder) starts an encoder; this model.type is "
                          f"{model['type']!r}")


def _check_embeddings(model, source):
    """model.embeddings (pretrained vectors files): its form, and no .npy matrix beside it."""
    from transformerkit.data.vectors import embedding_files

    try:
        files = embedding_files(model["embeddings"])
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
    if files and model["pretrained_embeddings"] is not None:
        raise ConfigError(f"{source}: give model.embeddings (vectors files) or "
                          "model.pretrained_embeddings (a .npy matrix), not both")


def _check_sampling_keys(train, source):
    """sample_prompts (non-empty strings), sample_temperature, sample_top_p."""
    prompts = train["sample_prompts"]
    if prompts is not None and (not prompts or not all(
            isinstance(p, str) and p for p in prompts)):
        raise ConfigError(f"{source}: train.sample_prompts must be a non-empty list of "
                          f"non-empty strings, got {prompts!r}")
    if train["sample_temperature"] < 0:
        raise ConfigError(f"{source}: train.sample_temperature must be >= 0, got "
                          f"{train['sample_temperature']}")
    if train["sample_top_p"] is not None and not 0 < train["sample_top_p"] <= 1:
        raise ConfigError(f"{source}: train.sample_top_p must be in (0, 1], got "
                          f"{train['sample_top_p']}")


def _check_long_run_keys(train, source):
    """checkpoint_every, average_last, patience, early_stopping_metric, accumulate_steps."""
    for key in ("checkpoint_every", "average_last", "patience", "accumulate_steps",
                "checkpoints_to_keep"):
        if train[key] is not None and train[key] < 1:
            raise ConfigError(f"{source}: train.{key} must be positive, got {train[key]}")
    if train["early_stopping_metric"] not in STOPPING_METRICS:
        raise ConfigError(f"{source}: train.early_stopping_metric must be one of "
                          f"{STOPPING_METRICS}, got {train['early_stopping_metric']!r}")
    if train["early_stopping_metric"] == "val_bleu" and not train["bleu_every"]:
        raise ConfigError(f"{source}: train.early_stopping_metric val_bleu needs "
                          "train.bleu_every (validation BLEU is computed only then); set "
                          "train.bleu_every: 1 or use val_loss")
    if train["average_last"] is not None and train["average_last"] > train["checkpoints_to_keep"]:
        raise ConfigError(f"{source}: train.average_last={train['average_last']} needs at least "
                          f"that many checkpoints kept; set train.checkpoints_to_keep >= "
                          f"{train['average_last']}")


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


def describe(config=None, source=None):
    """``config`` (resolved; default: the defaults) as commented YAML that
    :func:`load_config` reads back to the same config: every key of every section with its
    value, then after ``#`` its type (or allowed values), its default and its meaning.
    ``source`` names where the values come from, in the header."""
    sections = schema()
    config = defaults() if config is None else config
    lines = [f"# transformerkit configuration: {source or 'the defaults'}",
             "# Every key: its value, then its type (or allowed values), default and meaning; "
             "null: not set.",
             "# `transformerkit train` reads this file back; `--set section.key=value` "
             "overrides a key."]
    entries = {section: [f"  {name}: {_yaml_scalar(config[section][name])}" for name in keys]
               for section, keys in sections.items()}
    width = min(max(len(entry) for section in entries.values() for entry in section), 34)
    for section, keys in sections.items():
        lines += ["", f"# {section}: {SECTIONS[section]}", f"{section}:"]
        for entry, key in zip(entries[section], keys.values(), strict=True):
            lines.append(f"{entry.ljust(width)}  # {_comment(key)}")
    return "\n".join(lines) + "\n"


def _yaml_scalar(value):
    """``value`` as one line of YAML (``null``, ``true``, ``1.0e-06``, ``'yes'``)."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 30)
    text = text.removesuffix("\n...\n").rstrip("\n")
    return json.dumps(value, ensure_ascii=False) if "\n" in text else text


def _comment(key):
    """``type or choices, default D: help``, with the model types that take a ``model:`` key
    when not all do, and each one's own default."""
    if key.choices:
        allowed = " | ".join(map(_yaml_scalar, key.choices))
    else:
        allowed = " or ".join(t.__name__ for t in (key.types if isinstance(key.types, tuple)
                                                else (key.types,)))
    default, only = _yaml_scalar(key.default), ""
    if key.models is not None:
        if len(key.models) < len(MODEL_TYPES):
            only = f"{', '.join(key.models)} only; "
        if any(value is not None for value in key.models.values()):
            default += " = the model's (" + ", ".join(
                f"{model_type} {_yaml_scalar(value)}"
                for model_type, value in key.models.items()) + ")"
    return f"{only}{allowed}, default {default}: {key.help}"
