"""Build a model from the ``model:`` section of a run config."""

import os

import numpy as np

from transformerkit.models.encoder import Encoder
from transformerkit.models.gpt import GPT
from transformerkit.models.options import MODEL_OPTIONS, config_fields
from transformerkit.models.transformer import Transformer


def build_model(model_config, source_vocab_size, target_vocab_size=None):
    """Instantiate the model described by ``model_config`` (a resolved ``model:`` section).

    ``source_vocab_size`` is the (only) vocabulary of GPT and Encoder models. Keys left at
    None take the model's own default; a key set for a model type that does not take it
    (``model.use_bias`` for a Transformer) is a ``ValueError``.
    """
    kind = model_config["type"]
    if kind not in MODEL_OPTIONS:
        raise ValueError(f"unknown model type {kind!r}")
    taken = {f.name for f in config_fields(MODEL_OPTIONS[kind])}
    kwargs = {}
    for key, value in model_config.items():
        if key in ("type", "pretrained_embeddings") or value is None:
            continue
        if key not in taken:
            takers = [t for t, options in MODEL_OPTIONS.items()
                      if key in {f.name for f in config_fields(options)}]
            if not takers:
                raise ValueError(f"unknown model option model.{key}")
            raise ValueError(f"model.{key} applies to model.type {' or '.join(takers)} only, "
                             f"not {kind!r}")
        kwargs[key] = value
    embeddings = _load_embeddings(model_config.get("pretrained_embeddings"))
    if kind == "transformer":
        return Transformer(source_vocab_size, target_vocab_size or source_vocab_size,
                           source_embeddings=embeddings, **kwargs)
    model = GPT if kind == "gpt" else Encoder
    return model(source_vocab_size, embeddings=embeddings, **kwargs)


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
