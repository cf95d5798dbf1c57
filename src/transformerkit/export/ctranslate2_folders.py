"""A run's CTranslate2 export folders: where they are (``RUN/ctranslate2``,
``RUN/ctranslate2-int8``, ...), the metadata beside CTranslate2's files, and whether an
export stands for given weights, or for a given ``.keras`` file without loading it.

No CTranslate2 converter and no Keras at import: the CTranslate2 engine reads these to answer
from a current export without importing either (:mod:`transformerkit.export.runtime`);
:mod:`transformerkit.export.ctranslate2` writes the exports.
"""

import hashlib
import json
import os

import numpy as np

from transformerkit.files import atomic_write_text, remembered_sha256

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16", "float32")
METADATA_FILE = "transformerkit.json"  # what the runtime needs beside CTranslate2's files


def check_quantization(quantization):
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got "
                         f"{quantization!r}")


EXPORT_FOLDER = "ctranslate2"  # RUN/ctranslate2, RUN/ctranslate2-int8, ...


def default_export_dir(run_dir, quantization=None):
    """``RUN/ctranslate2`` (float32 weights) or ``RUN/ctranslate2-<quantization>``."""
    check_quantization(quantization)
    name = EXPORT_FOLDER if quantization in (None, "float32") else \
        f"{EXPORT_FOLDER}-{quantization}"
    return os.path.join(os.fspath(run_dir), name)


def read_metadata(model_dir):
    """The :data:`METADATA_FILE` of an export, or None if there is none (not ours, or
    not complete) or it is not a JSON object (damaged: the export is then made again)."""
    path = os.path.join(os.fspath(model_dir), METADATA_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            metadata = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return metadata if isinstance(metadata, dict) else None


def weights_fingerprint(model):
    """sha256 of all of ``model``'s weights (names, shapes and values): an export made
    from these weights records it (:func:`is_current`)."""
    from keras import ops

    digest = hashlib.sha256()
    for variable in model.weights:
        value = np.ascontiguousarray(ops.convert_to_numpy(variable), dtype=np.float32)
        digest.update(f"{variable.path}{value.shape}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def is_current(model_dir, model):
    """Whether ``model_dir`` is a complete export of ``model``'s weights as they are now."""
    metadata = read_metadata(model_dir)
    if metadata is None or not os.path.isfile(os.path.join(model_dir, "model.bin")):
        return False
    return metadata.get("weights_sha256") == weights_fingerprint(model)


def file_record(run_dir, model_file):
    """``{"model_file": its path relative to run_dir, "model_file_sha256": its digest}``:
    what an export made from ``model_file``'s weights, unchanged, records
    (:func:`stands_for_file`)."""
    return {"model_file": _relative(run_dir, model_file),
            "model_file_sha256": remembered_sha256(model_file)}


def record_file(model_dir, run_dir, model_file, parameters):
    """Add :func:`file_record` of ``model_file`` and the model's number of ``parameters``
    (an export made before they were recorded) to the metadata of the export ``model_dir``
    (made from that file's weights), atomically."""
    metadata = read_metadata(model_dir)
    metadata.update(file_record(run_dir, model_file), parameters=int(parameters))
    atomic_write_text(os.path.join(model_dir, METADATA_FILE), json.dumps(metadata, indent=2))


def stands_for_file(model_dir, run_dir, model_file):
    """Whether ``model_dir`` is a complete export made from the weights of ``model_file``
    (a ``.keras`` file of the run ``run_dir``) as the file is now, told without loading it:
    the file's sha256 is the one the export recorded (remembered by the file's identity:
    :func:`~transformerkit.files.remembered_sha256`). A file that is gone counts as the one
    recorded when the path is the same (a deployment may keep the export only). A record
    without the model's parameter count (an older export's) does not count: the model is
    loaded once more and the record completed (:func:`record_file`)."""
    metadata = read_metadata(model_dir)
    if metadata is None or not os.path.isfile(os.path.join(model_dir, "model.bin")):
        return False
    recorded = metadata.get("model_file_sha256")
    if recorded is None or metadata.get("model_file") != _relative(run_dir, model_file) \
            or "parameters" not in metadata:
        return False
    if not os.path.exists(model_file):
        return True
    return recorded == remembered_sha256(model_file)


def _relative(run_dir, path):
    return os.path.relpath(os.path.abspath(path), os.path.abspath(run_dir))
