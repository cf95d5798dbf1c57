"""Hugging Face checkpoint folders and bounds for the import tests of ``converters/bert.py``
(``models/test_hf_encoder.py``, ``models/test_hf_distilbert.py``): the chain bound of a
BERT-style forward pass (two float32 paths, ours and ``transformers``), padded id batches,
and folders of a config and safetensors weights written by hand."""

import hashlib
import json
import os

import keras
import numpy as np
import tolerances as tol


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def bert_roundings(encoder, length, pooled=0):
    """Roundings of a BERT-style forward pass over ``length`` positions:
    ``tolerances.model_roundings`` (the embedding sum of word, position and token type and
    its LayerNorm, the post-norm blocks with their GELU) without the final LayerNorm and
    output projection BERT lacks; ``pooled``: the mean over the positions (``length``, the
    division) or the tanh pooler (``d_model``, the bias, tanh)."""
    d = encoder.d_model
    return (tol.model_roundings(encoder, target_len=length) - tol.layer_norm_roundings(d)
            - d - 1 + pooled)


def hf_atol(encoder, ids, expected, pooled=0):
    """The bound of ours against ``transformers`` on ``ids``: two float32 paths."""
    return tol.chain_atol(bert_roundings(encoder, ids.shape[1], pooled), expected, paths=2)


def padded(rows):
    batch = np.zeros((len(rows), max(map(len, rows))), "int32")
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    return batch


BERT_CONFIG = {"model_type": "bert", "vocab_size": 50, "hidden_size": 16,
               "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 24,
               "max_position_embeddings": 20, "type_vocab_size": 2, "hidden_act": "gelu"}


def write_folder(folder, config=BERT_CONFIG, tensors=None):
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        from safetensors.numpy import save_file

        save_file(tensors, str(folder / "model.safetensors"))
    return folder


def fill_hub_cache(cache, repo, folder, revision="0123456789abcdef0123456789abcdef01234567"):
    """``folder``'s files in ``huggingface_hub``'s cache layout: content-addressed blobs,
    a snapshot of relative links to them, ``refs/main`` naming the snapshot."""
    base = cache / f"models--{repo.replace('/', '--')}"
    snapshot = base / "snapshots" / revision
    (base / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(revision)
    return snapshot
