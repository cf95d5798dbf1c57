"""Build a model from the ``model:`` section of a run config."""

import os

import numpy as np

from transformerkit.models.encoder import Encoder
from transformerkit.models.gpt import GPT
from transformerkit.models.options import MODEL_OPTIONS, config_fields
from transformerkit.models.transformer import Transformer


def build_model(model_config, source_vocab_size, target_vocab_size=None, embeddings=None):
    """Instantiate the model described by ``model_config`` (a resolved ``model:`` section).

    ``source_vocab_size`` is the (only) vocabulary of GPT and Encoder models. Keys left at
    None take the model's own default; a key set for a model type that does not take it
    (``model.use_bias`` for a Transformer) is a ``ValueError``. ``embeddings``: the initial
    matrices ``{"source": (source_vocab, d_model), "target": ...}`` that the data side read
    from ``model.embeddings`` (vectors files; NaN rows keep the model's own initial values;
    GPT and Encoder take ``"source"``, their one vocabulary); a matrix whose width is not
    ``d_model`` is a ``ValueError`` that says how to fix it.
    """
    kind = model_config["type"]
    if kind not in MODEL_OPTIONS:
        raise ValueError(f"unknown model type {kind!r}")
    taken = {f.name for f in config_fields(MODEL_OPTIONS[kind])}
    kwargs = {}
    for key, value in model_config.items():
        if key in ("type", "pretrained_embeddings", "embeddings", "pretrained") or value is None:
            continue
        if key not in taken:
            takers = [t for t, options in MODEL_OPTIONS.items()
                      if key in {f.name for f in config_fields(options)}]
            if not takers:
                raise ValueError(f"unknown model option model.{key}")
            raise ValueError(f"model.{key} applies to model.type {' or '.join(takers)} only, "
                             f"not {kind!r}")
        kwargs[key] = value
    if model_config.get("pretrained") is not None:
        return _pretrained_encoder(model_config, kwargs, embeddings)
    matrices = dict(embeddings or {})
    npy = _load_embeddings(model_config.get("pretrained_embeddings"))
    if npy is not None:
        matrices["source"] = npy
    target_vocab_size = target_vocab_size or source_vocab_size
    d_model = kwargs.get("d_model", MODEL_OPTIONS[kind].__dataclass_fields__["d_model"].default)
    vocab = {"source": source_vocab_size, "target": target_vocab_size}
    for side, matrix in matrices.items():
        check_embedding_matrix(side, matrix, vocab[side], d_model)
    if kind == "transformer":
        if kwargs.get("tie_embeddings") == "all":
            matrices.pop("target", None)  # one matrix: the shared vocabulary's
        return Transformer(source_vocab_size, target_vocab_size,
                           source_embeddings=matrices.get("source"),
                           target_embeddings=matrices.get("target"), **kwargs)
    if "target" in matrices:
        raise ValueError(f"model.type {kind} has one vocabulary: give its vectors as "
                         "model.embeddings.shared")
    model = GPT if kind == "gpt" else Encoder
    return model(source_vocab_size, embeddings=matrices.get("source"), **kwargs)


def _pretrained_encoder(model_config, kwargs, embeddings):
    """``model.pretrained``: an Encoder with the architecture and weights of a Hugging Face
    folder (its dropout rates included); of the config's model keys only the task's,
    pooling and num_classes, apply (the others describe a model built from scratch)."""
    if model_config["type"] != "encoder":  # fine-tuning: training/finetune.py merges first
        raise ValueError(f"model.pretrained: a {model_config['type']} fine-tuned from a "
                         "checkpoint has the checkpoint's architecture, which `train` reads; "
                         "give a run directory instead (`transformerkit import SOURCE --out "
                         "RUN`)")
    if embeddings or model_config.get("pretrained_embeddings") is not None:
        raise ValueError("model.pretrained brings its own embeddings; remove model.embeddings "
                         "/ model.pretrained_embeddings")
    taken = ("pooling", "num_classes")
    return Encoder.from_pretrained(model_config["pretrained"],
                                   **{k: v for k, v in kwargs.items() if k in taken})


def check_embedding_matrix(side, matrix, vocab_size, d_model):
    """A ``(vocab_size, d_model)`` matrix, or a ValueError saying what to change.

    A width other than ``d_model`` is refused rather than projected: every consumer of the
    embedding (the tied output projection, the one-position decode step, the CTranslate2
    export) takes it as the model's own ``d_model``-wide table, as in the paper (section
    3.4); a projection would be an extra layer each of them must know about."""
    rows, width = np.shape(matrix)
    if width != d_model:
        raise ValueError(f"the {side} vectors have width {width} but model.d_model is "
                         f"{d_model}: set model.d_model: {width} (with model.num_heads dividing "
                         f"it) or use vectors of width {d_model}")
    if rows != vocab_size:
        raise ValueError(f"the {side} embedding matrix has {rows} rows but the {side} "
                         f"vocabulary has {vocab_size} tokens: the matrix must have one row per "
                         "token id of the run's tokenizer")


def _load_embeddings(path):
    """A pretrained ``(vocab, d_model)`` matrix from a ``.npy`` file (no pickles)."""
    if path is None:
        return None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model.pretrained_embeddings: no such file {path}")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as err:
        raise ValueError(f"model.pretrained_embeddings: {path} is not a .npy array: {err}") from err
