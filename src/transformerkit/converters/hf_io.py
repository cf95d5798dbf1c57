"""The Hugging Face checkpoint files every converter reads and writes.

A Hugging Face checkpoint folder holds ``config.json`` (its ``model_type`` says which
converter reads it), the weights (``model.safetensors``, a sharded
``model.safetensors.index.json``, or ``pytorch_model.bin``) and the tokenizer's files. This
module reads the first two into plain data (a dict, ``{name: float32 array}``), writes a
folder of files atomically, and holds what the converters share: :class:`CheckpointError`,
the message naming missing tensors and the log line naming unused ones. It knows no
architecture: :mod:`~transformerkit.converters.bert`, :mod:`~transformerkit.converters.gpt2`
and :mod:`~transformerkit.converters.marian` map the data onto a model.
"""

import json
import logging
import os
import pathlib
import shutil
import tempfile

import numpy as np

from transformerkit.extras import require
from transformerkit.files import TEMPORARY_PREFIX

log = logging.getLogger("transformerkit")


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be imported; the message says what is wrong."""


# -- reading ----------------------------------------------------------------------------------
def read_json(path):
    """The value of the JSON file ``path``; :class:`CheckpointError` naming it when it is
    not valid JSON."""
    try:
        return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from err


def read_json_object(path):
    """The object of the JSON file ``path`` (:class:`CheckpointError` for another value)."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return value


def read_config(folder):
    """``(config dict, path)`` of ``folder/config.json``, unchecked beyond being a JSON
    object (``FileNotFoundError`` / :class:`CheckpointError` otherwise)."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {folder}")
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face checkpoint "
                                "folder")
    return read_json_object(path), path


def read_weights(folder):
    """All tensors of a checkpoint folder as ``{name: float32 NumPy array}``.

    Reads ``model.safetensors``, sharded ``model.safetensors.index.json``, or (with
    PyTorch installed) ``pytorch_model.bin`` loaded with ``weights_only=True``.
    """
    folder = pathlib.Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return _read_safetensors(single)
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                                .values()))
        except (ValueError, KeyError, AttributeError) as err:
            raise CheckpointError(f"{index} is not a valid safetensors index: {err}") from err
        weights = {}
        for shard in shards:
            if not (folder / shard).is_file():
                raise FileNotFoundError(f"{index} names shard {shard}, which is missing")
            weights.update(_read_safetensors(folder / shard))
        return weights
    if (folder / "pytorch_model.bin").is_file():
        return _read_torch_bin(folder / "pytorch_model.bin")
    present = sorted(p.name for p in folder.iterdir())
    raise FileNotFoundError(f"{folder} has no weights: expected model.safetensors, "
                            "model.safetensors.index.json or pytorch_model.bin; found "
                            f"{', '.join(present) or 'nothing'}")


def _read_safetensors(path):
    require("safetensors", "reading a Hugging Face checkpoint's weights")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is corrupt or not a safetensors file: {err}") from err
    return {name: np.asarray(value, dtype="float32") for name, value in tensors.items()
            if np.issubdtype(value.dtype, np.floating)}


def _read_torch_bin(path):
    try:
        import torch
    except ImportError as err:
        raise ImportError(f"reading {path} needs PyTorch (or convert it to safetensors)") \
            from err
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a broken pickle or zip
        raise CheckpointError(f"{path} is corrupt or not a PyTorch state dict: {err}") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict")
    return {name: value.float().numpy() for name, value in state.items()
            if hasattr(value, "is_floating_point") and value.is_floating_point()}


def missing_tensors_error(folder, missing, needed_by):
    """The :class:`CheckpointError` naming the first five ``missing`` tensor names that
    ``needed_by`` ("a GPT-2") needs."""
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                      else "")
    return CheckpointError(f"{folder}: the weights lack {len(missing)} tensor(s) {needed_by} "
                           f"needs: {shown}")


def log_unused(folder, unused, model):
    """One log line naming the first five tensors of a checkpoint that ``model`` (a class
    name) does not use."""
    if unused:
        log.info("%s: %d tensor(s) not used by %s: %s", folder, len(unused), model,
                 ", ".join(unused[:5]))


# -- writing ----------------------------------------------------------------------------------
def float32_array(variable):
    """A Keras variable as a contiguous float32 NumPy array (a tensor to write)."""
    from keras import ops

    return np.ascontiguousarray(ops.convert_to_numpy(variable), dtype=np.float32)


def json_bytes(value):
    """``value`` as the UTF-8 bytes of an indented JSON file."""
    return json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8")


def safetensors_bytes(tensors):
    """``{name: array}`` as the bytes of a ``model.safetensors`` file, marked as PyTorch's
    (``transformers`` reads it as a saved state dict)."""
    require("safetensors", "writing a Hugging Face checkpoint's weights")
    from safetensors.numpy import save

    return save(tensors, metadata={"format": "pt"})


def write_folder(out_dir, files, force=False):
    """Write ``files`` (``{name: str or bytes}``) as the folder ``out_dir``: into a temporary
    folder beside it, renamed onto it at the end (``force`` replaces an existing one), so
    ``out_dir`` is never half written. Returns ``out_dir``."""
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and not force:
        raise FileExistsError(f"{out_dir} exists; pass --force to replace it")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, dir=parent)
    try:
        for name, content in files.items():
            mode, encoding = ("wb", None) if isinstance(content, bytes) else ("w", "utf-8")
            with open(os.path.join(tmp, name), mode, encoding=encoding) as f:
                f.write(content)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


__all__ = ["CheckpointError", "float32_array", "json_bytes", "log_unused",
           "missing_tensors_error", "read_config", "read_json", "read_json_object",
           "read_weights", "safetensors_bytes", "write_folder"]
