"""``transformerkit import SOURCE --out RUN``: a Hugging Face checkpoint as a run directory.

SOURCE is a local checkpoint folder (a ``save_pretrained`` or ``huggingface-cli download
--local-dir`` folder, or a snapshot folder of the Hugging Face cache,
``models--org--name/snapshots/REVISION``) or a hub name (``gpt2``,
``Helsinki-NLP/opus-mt-de-en``), which ``huggingface_hub.snapshot_download`` resolves: from
the local cache (``HF_HUB_CACHE``) when offline (``HF_HUB_OFFLINE=1``), downloading the
config, tokenizer and weight files when online. Only what the import reads is fetched
(``.safetensors``, else ``pytorch_model.bin``; no TensorFlow, Flax or ONNX files).

The conversions are the converters' (:mod:`transformerkit.converters`, one module per
architecture); this module turns what they give into a run. A BERT or DistilBERT folder
becomes an encoder run without a classifier head (``embed`` takes it; ``model.pretrained``
fine-tunes such a folder into a classifier, see docs/encoders.md). A GPT-2 folder becomes a
GPT run. A Marian (OPUS-MT) folder becomes a translation run: the ``Transformer`` of
``Transformer.from_pretrained`` and its two vocabulary sides (``source.spm`` /
``target.spm`` + ``vocab.json``) as ``source_tokenizer.json`` / ``target_tokenizer.json``,
renumbered to the model's ids (``converters/marian.py``), with ``data.tokenizer: marian``,
and a ``search:`` section that makes ``translate`` search as ``transformers``' ``generate``
does with the folder's ``generation_config.json`` (``converters/generation.py``; what it
has no counterpart to is named in one warning line); a GPT-2 run's ``generation:`` section
does the same for ``generate``.

The run directory is an ordinary one (:mod:`transformerkit.run_directory`): ``config.yaml``
with the imported model options, the tokenizer file(s) and ``model.keras``, which
``transformerkit.load``, ``generate``, ``summary``, ``attention``, ``serve`` and ``export``
take as they take a trained run. It is written into a temporary folder next to RUN and
renamed at the end, so a failed import leaves nothing behind.

What each ``model_type`` becomes is one entry of :data:`IMPORTERS`: a function
``(folder, config) -> (model, config.yaml sections, {file name: tokenizer})``.
"""

import contextlib
import os
import pathlib
import re
import shutil
import tempfile

from transformerkit.converters import bert, gpt2, marian
from transformerkit.converters.hf_io import CheckpointError, read_config, read_json
from transformerkit.extras import require
from transformerkit.files import TEMPORARY_PREFIX
from transformerkit.run_directory import SOURCE_TOKENIZER, TARGET_TOKENIZER, RunDirectory

# what the importers read: config, tokenizer and safetensors files (pytorch_model.bin only
# when a repository has no safetensors weights)
_HUB_FILES = ["config.json", "generation_config.json", "*.safetensors",
              "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "vocab.json", "target_vocab.json", "merges.txt",
              "vocab.txt", "*.spm"]
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def _import_gpt2(folder, config):
    """A GPT-2 folder -> a GPT run (``converters/gpt2.py``)."""
    from transformerkit.models.gpt import GPT

    tokenizer = gpt2.convert_tokenizer(folder)
    model = GPT.from_pretrained(folder)
    if tokenizer.vocab_size != model.vocab_size:
        offset = gpt2.folder_offset(folder)
        raise ValueError(f"{folder}: the tokenizer has {tokenizer.vocab_size - offset} tokens "
                         f"but config.json's vocab_size is {model.vocab_size - offset}")
    options = {k: v for k, v in gpt2.convert_backbone_config(config).items()
               if k != "vocab_size"}
    sections = {"model": {"type": "gpt", **options},
                "data": {"dataset": "text", "vocab_size": tokenizer.vocab_size},
                "generation": gpt2.convert_generation_config(folder, config)}
    return model, sections, {"tokenizer.json": tokenizer}


def _import_encoder(folder, config):
    """A BERT or DistilBERT folder -> an encoder run without a classifier head (its hidden
    states; ``embed`` pools them), as ``Encoder.from_pretrained`` (``converters/bert.py``)."""
    from transformerkit.models.encoder import Encoder

    options = bert.convert_backbone_config(bert.load_config(folder))
    tokenizer = bert.convert_tokenizer(folder)
    model = Encoder.from_pretrained(folder)
    if tokenizer.vocab_size != model.vocab_size:
        raise ValueError(f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but "
                         f"config.json's vocab_size is {model.vocab_size}")
    sections = {"model": {"type": "encoder",
                          **{k: v for k, v in options.items() if k != "vocab_size"}},
                "data": {"dataset": "tsv", "vocab_size": tokenizer.vocab_size}}
    return model, sections, {"tokenizer.json": tokenizer}


def _import_marian(folder, config):
    """A Marian (OPUS-MT) folder -> a translation run: ``Transformer.from_pretrained`` and
    the two vocabulary sides in the model's ids (``converters/marian.py``). Both sides are
    saved (``source_tokenizer.json``, ``target_tokenizer.json``) even when ``vocab.json`` is
    one table for both: each side has its own SentencePiece model."""
    from transformerkit.models import Transformer

    config = marian.load_config(folder)
    options = marian.convert_backbone_config(config)
    source, target = marian.convert_tokenizer(folder, config)
    model = Transformer.from_pretrained(folder)
    tokenizer_config = _read_json_object(pathlib.Path(folder) / "tokenizer_config.json")
    languages = {f"{side}_lang": tokenizer_config[f"{side}_lang"] for side in ("source", "target")
                 if isinstance(tokenizer_config.get(f"{side}_lang"), str)}
    sections = {
        "model": {"type": "transformer",
                  **{k: v for k, v in options.items() if not k.endswith("vocab_size")}},
        # what a fine-tune of the run reads: pairs in a TSV file, the imported vocabulary
        "data": {"dataset": "tsv", "tokenizer": "marian", "vocab_size": source.vocab_size,
                 "shared_vocab": options["tie_embeddings"] == "all", **languages},
        # how translate searches unless told otherwise: as transformers' generate does
        "search": marian.convert_generation_config(folder, config)}
    return model, sections, {SOURCE_TOKENIZER: source, TARGET_TOKENIZER: target}


def _read_json_object(path):
    """A json file's object, or {} when the file is absent or holds no object (an optional
    file: what it lacks keeps its default)."""
    if not path.is_file():
        return {}
    value = read_json(path)
    return value if isinstance(value, dict) else {}


IMPORTERS = {"gpt2": _import_gpt2, "bert": _import_encoder, "distilbert": _import_encoder,
             "marian": _import_marian}


def resolve_source(source):
    """The local folder of ``source``: the folder itself, or a hub name's snapshot folder
    (see the module docstring). ``FileNotFoundError`` with one line saying what is missing."""
    path = pathlib.Path(os.path.expanduser(str(source)))
    if path.is_dir():
        return path
    if path.exists():
        raise FileNotFoundError(f"{source} is a file, not a checkpoint folder or a hub name")
    if not _HUB_NAME.match(str(source)) or str(source).startswith("."):
        raise FileNotFoundError(f"checkpoint folder not found: {source}")
    return _snapshot(str(source))


def _snapshot(name):
    """``snapshot_download(name)``: the cached snapshot offline, a download online."""
    huggingface_hub = require("huggingface_hub",
                              f"{name} is not a local folder; resolving a hub name")
    from huggingface_hub import constants, errors
    offline = constants.HF_HUB_OFFLINE
    try:
        folder = pathlib.Path(huggingface_hub.snapshot_download(name, allow_patterns=_HUB_FILES))
        if not any(folder.glob("*.safetensors")):
            folder = pathlib.Path(huggingface_hub.snapshot_download(
                name, allow_patterns=_HUB_FILES + ["pytorch_model.bin"]))
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as err:
        where = constants.HF_HUB_CACHE
        if offline:
            raise FileNotFoundError(f"{name} is no folder here and not in the Hugging Face "
                                    f"cache ({where}), and HF_HUB_OFFLINE is set: download it "
                                    "on a machine with internet access, or give a local "
                                    "folder") from err
        raise FileNotFoundError(f"{name} is no folder here, could not be downloaded (no "
                                f"connection?) and is not in the Hugging Face cache "
                                f"({where})") from err
    except errors.RepositoryNotFoundError as err:
        raise FileNotFoundError(f"{name}: no such model on the Hugging Face hub (or it is "
                                "private)") from err
    except errors.HfHubHTTPError as err:
        raise FileNotFoundError(f"{name}: the Hugging Face hub answered "
                                f"{str(err).splitlines()[0]}") from err
    return folder


def read_checkpoint(source):
    """The checkpoint ``source`` (a folder or a hub name) read by its importer: ``(model,
    config.yaml sections, {file name: tokenizer}, model_type)``. ``import_checkpoint``
    writes these as a run; ``model.pretrained`` fine-tunes them (training/finetune.py)."""
    folder = resolve_source(source)
    config, path = read_config(folder)
    model_type = config.get("model_type")
    if model_type not in IMPORTERS:
        raise CheckpointError(f"{path}: model_type {model_type!r} cannot be imported as a "
                              f"run (supported: {', '.join(IMPORTERS)})")
    model, sections, tokenizers = IMPORTERS[model_type](folder, config)
    return model, sections, tokenizers, model_type


def import_checkpoint(source, out, force=False):
    """Write the run directory ``out`` from the checkpoint ``source``; returns
    ``(RunDirectory, model_type)``. ``force`` replaces an existing ``out``."""
    from transformerkit.config import resolve, save_config

    out = pathlib.Path(out)
    if out.exists() and not force and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists; choose another --out or pass --force to "
                              "replace it")
    model, sections, tokenizers, model_type = read_checkpoint(source)
    run_config = resolve(sections, source=f"the import of {source}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, dir=out.parent))
    try:
        run = RunDirectory(staging)
        save_config(run_config, run.config)
        for name, tokenizer in tokenizers.items():
            tokenizer.save(staging / name)
        model.save(run.model)
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(staging, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
    return RunDirectory(out), model_type


__all__ = ["IMPORTERS", "import_checkpoint", "read_checkpoint", "resolve_source"]
