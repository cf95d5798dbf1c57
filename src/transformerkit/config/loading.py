"""Reading a run config: YAML and ``--set`` overrides -> a checked :class:`RunConfig`.

The ``data:`` and ``train:`` keys are the fields of :class:`~transformerkit.config.sections.
DataOptions` and :class:`~transformerkit.config.sections.TrainOptions`, the ``model:`` keys
the models' option dataclasses (:mod:`transformerkit.models.options`), the ``search:`` keys
the fields of :class:`~transformerkit.decoding.options.SearchOptions` (the run's own default
search) and the ``generation:`` keys those of
:class:`~transformerkit.decoding.options.GenerationOptions` (a GPT run's own default
generation); :func:`schema` lists them all with their default, types and meaning. Unknown keys,
wrong types, values out of range are errors naming the key; the checks that involve several
keys are written here.
"""

import copy
import dataclasses
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import fields
from typing import NamedTuple

import yaml

from transformerkit.config.sections import (
    DATA_DIR_DATASETS,
    SECTION_OPTIONS,
    ConfigError,
    DataOptions,
    TrainOptions,
    config_error,
)
from transformerkit.config.sections import check_value as check_key
from transformerkit.declared import check_value, value_types
from transformerkit.decoding.options import GenerationOptions, SearchOptions

MODEL_TYPES = ("transformer", "gpt", "encoder")


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
    "search": "how translate, evaluate and serve search unless told otherwise (an imported "
              "run: as its checkpoint's generation config says); flags and keywords "
              "override it",
    "generation": "how a GPT run's generate and serve continue a prompt unless told otherwise "
                  "(an imported run: as its checkpoint's generation config says); flags and "
                  "keywords override it",
}


def _section_keys(options_class):
    """``{key: Key}`` of a :class:`DataOptions`, :class:`TrainOptions` or
    :class:`SearchOptions` field list."""
    keys = {}
    for f in fields(options_class):
        kinds = value_types(f)
        keys[f.name] = Key(f.default, kinds[0] if len(kinds) == 1 else kinds,
                           f.metadata["help"], f.metadata["choices"])
    return keys


@functools.cache
def schema():
    """``{section: {key: Key(default, allowed types, help, ...)}}``; a None default means
    "not set".

    ``data`` and ``train`` are the fields of :class:`DataOptions` and :class:`TrainOptions`.
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
                                         "pooling and num_classes are used); transformer, "
                                         "gpt: a Hugging Face folder or hub name, or a run "
                                         "directory, to fine-tune (its architecture and "
                                         "vocabulary; docs/pretrained.md)")
    return {"model": model, **{name: _section_keys(options_class)
                               for name, options_class in SECTION_OPTIONS.items()},
            "search": _section_keys(SearchOptions),
            "generation": _section_keys(GenerationOptions)}


def defaults():
    """``{section: {key: default}}``: the config of an empty file, as plain values."""
    return {section: {k: v[0] for k, v in keys.items()} for section, keys in schema().items()}


class ModelSection(Mapping):
    """The ``model:`` section of a :class:`RunConfig`: one frozen field per key of the
    section's schema (:func:`schema`: ``type``, every option a model takes, ``pretrained``,
    ``embeddings``, ...), read as attributes (``config.model.d_model``) and, as the
    constructor arguments of the model ``type`` names, as a read-only mapping
    (``build_model(config.model, ...)``, ``dict(config.model)``). A changed copy:
    ``RunConfig.replace(model={...})``. Built by :func:`model_section`, whose class is made
    from the schema on first use (the schema reads the models' option declarations)."""

    __slots__ = ()

    def __getitem__(self, key):
        if key not in self.keys_declared:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(self.keys_declared)

    def __len__(self):
        return len(self.keys_declared)

    def _read_only(self, *args):
        raise TypeError("a resolved config's model section is read-only; use "
                        "config.replace(model={...}) or a dict(...) copy")

    __setitem__ = __delitem__ = _read_only

    def __reduce__(self):  # copy, deepcopy and pickle rebuild it from a plain dict
        return model_section, (dict(self),)


@functools.cache
def _model_section_class():
    """The frozen dataclass of the ``model:`` keys of :func:`schema`, each field typed by
    its declaration (a key that is None by default may also be None)."""
    keys = schema()["model"]
    fields_ = []
    for name, key in keys.items():
        kind = key.types if isinstance(key.types, type) else object
        fields_.append((name, kind if key.default is not None else kind | None,
                        dataclasses.field(default=key.default)))
    cls = dataclasses.make_dataclass("ModelSection", fields_, bases=(ModelSection,),
                                     frozen=True, eq=False)
    cls.keys_declared = tuple(keys)
    cls.__doc__ = ModelSection.__doc__
    cls.__module__ = __name__
    return cls


def model_section(values):
    """A :class:`ModelSection` of ``values`` (every key of the schema's ``model:`` section;
    checked by :func:`resolve`)."""
    return _model_section_class()(**values)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A resolved run config: ``model`` (the ``model:`` keys, a :class:`ModelSection`),
    ``data`` (:class:`DataOptions`), ``train`` (:class:`TrainOptions`), ``search`` (a
    :class:`~transformerkit.decoding.options.SearchOptions`: how the run translates unless
    a call says otherwise) and ``generation`` (a
    :class:`~transformerkit.decoding.options.GenerationOptions`: how a GPT run continues a
    prompt unless a call says otherwise); each the declared defaults for a trained run, an
    imported run's generation settings.

    The ``model:`` section (:class:`ModelSection`) holds the constructor arguments of the
    model ``model.type`` names, each model with its own defaults (None: the model's own),
    and what is not a model option (``pretrained``, ``embeddings``); the models' option
    dataclasses, which need the vocabulary sizes of the data, check it when
    ``build_model`` builds the model. Read ``config.model.d_model``.

    Build one with :func:`load_config` or :func:`resolve` (``RunConfig.from_dict``);
    :meth:`to_dict` gives the plain sections ``config.yaml`` holds.
    """

    model: ModelSection
    data: DataOptions
    train: TrainOptions
    search: SearchOptions = dataclasses.field(default_factory=SearchOptions)
    generation: GenerationOptions = dataclasses.field(default_factory=GenerationOptions)

    def to_dict(self):
        """``{"model": {...}, "data": {...}, "train": {...}}`` of plain values (YAML), and
        ``"search": {...}`` / ``"generation": {...}`` (every key) where they are not the
        declared defaults: a trained run's ``config.yaml`` keeps neither section, so it
        follows the defaults of the version that reads it, while an imported run pins its
        checkpoint's settings."""
        sections = self._sections()
        if self.search == SearchOptions():
            del sections["search"]
        if self.generation == GenerationOptions():
            del sections["generation"]
        return sections

    def _sections(self):
        """Every section, ``search`` and ``generation`` included."""
        return {"model": copy.deepcopy(dict(self.model)), "data": self.data.to_dict(),
                "train": self.train.to_dict(), "search": dataclasses.asdict(self.search),
                "generation": dataclasses.asdict(self.generation)}

    @classmethod
    def from_dict(cls, raw, source="config"):
        """:func:`resolve`: ``raw`` sections (missing keys: defaults) checked."""
        return resolve(raw, source)

    def replace(self, source="config", **sections):
        """A copy with some keys changed, checked again as a whole:
        ``config.replace(train={"epochs": 3}, data={"val_limit": 20})``."""
        raw = self._sections()
        for section, changes in sections.items():
            if section not in raw:
                raise ConfigError(f"{source}: unknown section {section!r}; expected "
                                  f"{sorted(raw)}")
            raw[section].update(changes)
        return resolve(raw, source)

    def with_data_dir_recorded(self):
        """This config with the places its data is read from made absolute, so that
        ``evaluate`` finds the run's data later from any working directory and without the
        variable: ``data.data_dir`` becomes the data directory read now (``data.data_dir``,
        else ``$TRANSFORMERKIT_DATA``, else the cache) for the datasets that read it
        (multi30k, text), and every corpus file named relative to the current directory
        (``train_source`` ... ``test_tsv``, the paths of ``*_files`` entries, ``text``)
        that exists there becomes its absolute path. ``train`` saves this config."""
        data = self.data
        changes = {key: _absolute(getattr(data, key)) for key in _PATH_KEYS}
        changes.update({key: _absolute_entries(getattr(data, key)) for key in _FILES_KEYS})
        if data.dataset in DATA_DIR_DATASETS:
            from transformerkit.data.corpora import resolve_data_dir

            changes["data_dir"] = os.path.abspath(resolve_data_dir(data.data_dir))
        return dataclasses.replace(self, data=dataclasses.replace(data, **changes))


_PATH_KEYS = ("train_source", "train_target", "val_source", "val_target", "test_source",
              "test_target", "train_tsv", "val_tsv", "test_tsv", "text")
_FILES_KEYS = ("train_files", "val_files", "test_files")


def _absolute(path):
    """``path`` made absolute if it names an existing file relative to the current
    directory; as given otherwise (None, absolute, or looked up elsewhere: ``data.text``
    may name a file of the data directory)."""
    if path is None or os.path.isabs(path) or not os.path.exists(path):
        return path
    return os.path.abspath(path)


def _absolute_entries(entries):
    """A ``*_files`` list with each entry's paths (a path, or a mapping's ``path``,
    ``source``, ``target``) through :func:`_absolute`; other values as given (their checks
    come when the corpora are read)."""
    if not isinstance(entries, list):
        return entries
    out = []
    for entry in entries:
        if isinstance(entry, str):
            entry = _absolute(entry)
        elif isinstance(entry, dict):
            entry = {key: _absolute(value) if key in ("path", "source", "target")
                     and isinstance(value, str) else value for key, value in entry.items()}
        out.append(entry)
    return out


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader reading ``1e-5`` as the number it is (YAML 1.2, Python and JSON
    read it so; PyYAML's YAML 1.1 rules want a dot, ``1.0e-5``, and give the string)."""


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def load_config(path=None, overrides=()):
    """Read a YAML config (or start from defaults), apply ``section.key=value`` overrides,
    validate and return the resolved :class:`RunConfig`."""
    raw = {}
    if path is not None:
        if not os.path.isfile(path):
            raise ConfigError(f"config file not found: {path}")
        try:
            with open(path, encoding="utf-8") as f:
                raw = yaml.load(f, Loader=_ConfigLoader) or {}
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
    """Validate ``raw`` (``{section: {key: value}}``) against :func:`schema`, fill the
    defaults and return the :class:`RunConfig`."""
    if isinstance(raw, RunConfig):
        raw = raw._sections()
    sections = schema()
    unknown_sections = set(raw) - set(sections)
    if unknown_sections:
        raise ConfigError(f"{source}: unknown section(s) {sorted(map(str, unknown_sections))}; "
                          f"expected {sorted(sections)}")
    given = {section: {} for section in sections}
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
            given[section][key] = value
    model = defaults()["model"]
    for key, value in given["model"].items():
        model[key] = _check_model_key(key, value, sections["model"][key], source)
    try:
        config = RunConfig(model_section(model), DataOptions(**given["data"]),
                           TrainOptions(**given["train"]),
                           _options_section(SearchOptions, "search", given["search"]),
                           _options_section(GenerationOptions, "generation",
                                            given["generation"]))
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    _check_values(config, source)
    return config


def _options_section(options_class, section, values):
    """The ``search:`` (:class:`SearchOptions`) or ``generation:`` (:class:`GenerationOptions`)
    section's options: each value checked against its field (a :class:`ConfigError` naming
    ``SECTION.KEY``), then the options as a whole (keys that contradict each other:
    ``search.n_best`` with ``search.temperature``)."""
    declared = {f.name: f for f in fields(options_class)}
    checked = {key: check_key(f"{section}.{key}", declared[key], value)
               for key, value in values.items()}
    try:
        return options_class(**checked)
    except ValueError as err:
        raise ConfigError(f"{section}: {err}") from None


def _check_model_key(key, value, declared, source):
    """A ``model:`` value: null only where the key has no default, of its type (an integer
    where a number is expected becomes a float); the models check the rest."""
    kinds = declared.types if isinstance(declared.types, tuple) else (declared.types,)
    value, problem = check_value(value, kinds, nullable=declared.default is None)
    if problem:
        raise ConfigError(f"{source}: {config_error(f'model.{key}', problem)}")
    return value


def _check_values(config, source):
    """What the declarations cannot say: model keys, durations, keys that depend on others."""
    model, train = config.model, config.train
    if model.type not in MODEL_TYPES:
        raise ConfigError(f"{source}: model.type must be one of {MODEL_TYPES}, "
                          f"got {model.type!r}")
    for key in ("num_layers", "d_model", "num_heads", "d_ff", "max_length"):
        if model[key] < 1:
            raise ConfigError(f"{source}: model.{key} must be positive, got {model[key]}")
    if train.time_budget is not None:
        parse_duration(train.time_budget, "train.time_budget")
    if not parse_duration(train.process_timeout, "train.process_timeout") > 0:
        raise ConfigError(f"{source}: train.process_timeout must be positive")
    prompts = train.sample_prompts
    if prompts is not None and (not prompts or not all(
            isinstance(p, str) and p for p in prompts)):
        raise ConfigError(f"{source}: train.sample_prompts must be a non-empty list of "
                          f"non-empty strings, got {prompts!r}")
    _check_embeddings(model, source)
    if train.early_stopping_metric == "val_bleu" and not train.bleu_every:
        raise ConfigError(f"{source}: train.early_stopping_metric val_bleu needs "
                          "train.bleu_every (validation BLEU is computed only then); set "
                          "train.bleu_every: 1 or use val_loss")
    if train.average_last is not None and train.average_last > train.checkpoints_to_keep:
        raise ConfigError(f"{source}: train.average_last={train.average_last} needs at least "
                          f"that many checkpoints kept; set train.checkpoints_to_keep >= "
                          f"{train.average_last}")
    _check_model_task(config, source)


def _check_model_task(config, source):
    """What only a translation model or only an encoder classifier has."""
    model, train = config.model, config.train
    if model.type == "encoder":
        for key in ("bleu_every", "sample_every"):
            if getattr(train, key) is not None:
                raise ConfigError(f"{source}: train.{key} translates or generates; an encoder "
                                  "classifier has no text to show (its validation accuracy "
                                  "is in history.csv as val_accuracy)")
        if train.early_stopping_metric == "val_bleu":
            raise ConfigError(f"{source}: train.early_stopping_metric val_bleu is a "
                              "translation score; an encoder uses val_loss or val_accuracy")
        return
    if train.early_stopping_metric == "val_accuracy":
        raise ConfigError(f"{source}: train.early_stopping_metric val_accuracy is an encoder "
                          "classifier's; use val_loss (or val_bleu with train.bleu_every)")


def _check_embeddings(model, source):
    """model.embeddings (pretrained vectors files): its form, and no .npy matrix beside it."""
    from transformerkit.data.vectors import embedding_files

    try:
        files = embedding_files(model.embeddings)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
    if files and model.pretrained_embeddings is not None:
        raise ConfigError(f"{source}: give model.embeddings (vectors files) or "
                          "model.pretrained_embeddings (a .npy matrix), not both")


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
        parsed = yaml.load(value, Loader=_ConfigLoader) if value != "" else None
    except yaml.YAMLError:
        parsed = value
    return section, key, parsed


def save_config(config, path):
    """Write the resolved config (a :class:`RunConfig`) as YAML, atomically."""
    from transformerkit.files import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config.to_dict(), sort_keys=False))
