"""``model.pretrained: SOURCE`` in a translation or GPT config: fine-tune a checkpoint.

SOURCE is a Hugging Face checkpoint, a folder or a hub name, read by the importer of its
``model_type`` as ``transformerkit import`` reads it (:func:`transformerkit.importing.
read_checkpoint`), or a transformerkit run directory (its ``config.yaml``, ``model.keras``
and tokenizer files: an imported, trained or fine-tuned run). The run trains the
checkpoint's model, with its architecture, weights and vocabulary:

- ``model:`` becomes the checkpoint's section. A key the config sets to a value other than
  its default that differs from the checkpoint's is a :class:`ConfigError` naming it
  (``model.d_model: 256 conflicts with the pretrained checkpoint's 512``); ``model.type``
  must be the checkpoint's; ``model.embeddings`` and ``model.pretrained_embeddings`` are
  refused (the checkpoint brings its embeddings). The dropout rates (``dropout``,
  ``attention_dropout``, ``activation_dropout``) are training settings: the config's apply
  (their defaults when unset), whatever the checkpoint was trained with.
- The vocabulary keys of ``data:`` (:data:`VOCABULARY_KEYS`) follow the same rule as the
  model keys, and the checkpoint's tokenizer files are written into the run as they are
  (never trained again); ``data.max_length`` may not exceed the checkpoint's
  ``model.max_length``.
- The rest of ``data:`` (corpora, limits, batching) and all of ``train:`` are the config's.

A key left at its default cannot be told from one set to the default (the config is
resolved before this runs), so such a key takes the checkpoint's value silently.

The merged config is the one ``train`` saves in the run's ``config.yaml``, with
``model.pretrained`` kept as the record of where the weights came from; ``--resume``,
``evaluate``, ``translate``, ``export`` and the rest read that config and the run's own
files and never the source again.
"""

import dataclasses
import logging
import os
import shutil

from transformerkit.config import ConfigError, load_config, resolve
from transformerkit.files import atomic_path
from transformerkit.run_directory import RunDirectory

log = logging.getLogger("transformerkit")

DROPOUT_KEYS = ("dropout", "attention_dropout", "activation_dropout")
VOCABULARY_KEYS = ("tokenizer", "vocab_size", "lowercase", "shared_vocab")
_REFUSED_KEYS = ("embeddings", "pretrained_embeddings")  # the checkpoint brings its own
FINETUNED_TYPES = ("transformer", "gpt")  # an encoder's model.pretrained: data_setup/factory


@dataclasses.dataclass
class Pretrained:
    """A checkpoint to fine-tune: its ``model`` (built, with the weights), its resolved run
    ``config`` and its tokenizers ``{run file name: tokenizer}``."""

    source: str
    model: object
    config: object  # RunConfig
    tokenizers: dict

    def write_tokenizers(self, run_dir):
        """Save the tokenizer files into ``run_dir`` under the names a run reads."""
        run = RunDirectory(run_dir)
        paths = [os.path.join(run.path, name) for name in self.tokenizers]
        run.remove_other_tokenizers(paths)
        for path, tokenizer in zip(paths, self.tokenizers.values(), strict=True):
            if isinstance(tokenizer, str):  # a run's file: copied byte for byte
                with atomic_path(path) as tmp:
                    shutil.copyfile(tokenizer, tmp)
            else:
                tokenizer.save(path)


def fine_tunes(config):
    """Does ``config`` fine-tune a checkpoint (``model.pretrained`` on a Transformer or
    GPT)? An encoder's ``model.pretrained`` is a BERT folder read by the data and model
    setup (docs/encoders.md)."""
    return (config.model.pretrained is not None
            and config.model.type in FINETUNED_TYPES)


def load_pretrained(source):
    """The :class:`Pretrained` of ``source``: a run directory (a folder with
    ``config.yaml``) or a Hugging Face folder or hub name."""
    source = os.path.expanduser(str(source))
    run = RunDirectory(source)
    if os.path.isfile(run.config):
        return _from_run(source, run)
    from transformerkit.importing import read_checkpoint

    model, sections, tokenizers, _ = read_checkpoint(source)
    return Pretrained(str(source), model, resolve(sections, source=f"the import of {source}"),
                      tokenizers)


def recorded(config, run_dir):
    """The :class:`Pretrained` a resumed fine-tune merges ``config`` with: the run's own
    ``config.yaml`` (the merged config it started with; the source is not read again), so
    that the original config and the saved one resume the same run."""
    return Pretrained(config.model.pretrained, None,
                      load_config(RunDirectory(run_dir).config), {})


def _from_run(source, run):
    from transformerkit.saving import load_model

    if not os.path.isfile(run.model):
        raise FileNotFoundError(f"model.pretrained: the run directory {source} has no "
                                f"{os.path.basename(run.model)} (was its training "
                                "interrupted? finish it with --resume first)")
    paths = sorted(set(run.tokenizer_paths()))
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"model.pretrained: the run directory {source} has no "
                                f"tokenizer file {os.path.basename(missing[0])}")
    config = load_config(run.config)
    model = load_model(run.model, compile=False)
    return Pretrained(str(source), model, config,
                      {os.path.basename(p): str(p) for p in paths})


def finetune_config(config, pretrained, source="config"):
    """``config`` with the architecture and vocabulary of ``pretrained`` (see the module
    docstring); a :class:`ConfigError` naming the first key that conflicts."""
    from transformerkit.config import defaults

    default = defaults()
    own, theirs = config.model, pretrained.config.model
    where = f"{source}: model.pretrained {pretrained.source}"
    if own.type != theirs.type:
        raise ConfigError(f"{where}: model.type: {own.type!r} conflicts with the "
                          f"pretrained checkpoint's {theirs.type!r}")
    for key in _REFUSED_KEYS:
        if own[key] is not None:
            raise ConfigError(f"{where}: model.{key}: the pretrained checkpoint brings its own "
                              "embeddings; remove it")
    model = dict(theirs)
    origin = pretrained.source  # a local folder's absolute path, a hub name as given
    model["pretrained"] = os.path.abspath(origin) if os.path.isdir(origin) else origin
    for key, value in own.items():
        if key in DROPOUT_KEYS:
            model[key] = value
        elif key not in ("type", "pretrained"):
            _check_same("model", key, value, default["model"].get(key), theirs.get(key), where)
    data = config.data.to_dict()
    their_data = pretrained.config.data
    for key in VOCABULARY_KEYS:
        theirs_value = getattr(their_data, key)
        _check_same("data", key, data[key], default["data"][key], theirs_value, where)
        data[key] = theirs_value
    if data["max_length"] is not None and data["max_length"] > model["max_length"]:
        raise ConfigError(f"{where}: data.max_length: {data['max_length']} exceeds the "
                          f"pretrained checkpoint's model.max_length {model['max_length']}")
    return resolve({"model": model, "data": data, "train": config.train.to_dict()},
                   source=where)


def _check_same(section, key, value, default, theirs, where):
    if value != default and value != theirs:
        raise ConfigError(f"{where}: {section}.{key}: {value!r} conflicts with the pretrained "
                          f"checkpoint's {theirs!r} (leave it out to use the checkpoint's)")


def copy_weights(pretrained, model):
    """Build ``model`` (the fine-tune config's, the checkpoint's architecture with the
    config's dropout) and give it the checkpoint's weights, variable by variable."""
    if not model.built:
        model.build(None)
    source = pretrained.model.weights
    if len(source) != len(model.weights):
        raise ValueError(f"model.pretrained {pretrained.source}: its model has "
                         f"{len(source)} variables, the model of the merged config "
                         f"{len(model.weights)}")
    for theirs, ours in zip(source, model.weights, strict=True):
        if tuple(theirs.shape) != tuple(ours.shape):
            raise ValueError(f"model.pretrained {pretrained.source}: {theirs.path} has shape "
                             f"{tuple(theirs.shape)}, the merged config's {ours.path} "
                             f"{tuple(ours.shape)}")
        ours.assign(theirs.value)
    log.info("fine-tuning %s (%d variables)", pretrained.source, len(source))
    return model
