"""Build a model from the ``model:`` section of a run config."""

import os

import numpy as np

from transformerkit.models.encoder import Encoder
from transformerkit.models.gpt import GPT
from transformerkit.models.transformer import Transformer

# Config keys that every model type accepts; None means "use the model's own default".
_COMMON = ("num_layers", "d_model", "num_heads", "d_ff", "dropout", "attention_dropout",
           "activation_dropout",
           "max_length", "norm_position", "activation", "positional", "key_dim", "value_dim",
           "layer_norm_epsilon", "embeddings_trainable")


_GPT_ONLY = ("scale_embeddings", "initialization", "use_bias")  # model keys only a GPT accepts


def build_model(model_config, source_vocab_size, target_vocab_size=None):
    """Instantiate the model described by ``model_config`` (a resolved ``model:`` section).

    ``source_vocab_size`` is the (only) vocabulary of GPT and Encoder models.
    """
    kwargs = {k: model_config[k] for k in _COMMON if model_config.get(k) is not None}
    embeddings = _load_embeddings(model_config.get("pretrained_embeddings"))
    kind = model_config["type"]
    gpt_only = [k for k in _GPT_ONLY if model_config.get(k) is not None]
    if gpt_only and kind != "gpt":
        raise ValueError(f"model.{gpt_only[0]} applies to model.type gpt only, not {kind!r}")
    if kind == "transformer":
        if model_config.get("num_decoder_layers") is not None:
            kwargs["num_decoder_layers"] = model_config["num_decoder_layers"]
        return Transformer(source_vocab_size, target_vocab_size or source_vocab_size,
                           tie_embeddings=model_config.get("tie_embeddings", "none"),
                           source_embeddings=embeddings, **kwargs)
    if kind == "gpt":
        kwargs.update({k: model_config[k] for k in gpt_only})
        return GPT(source_vocab_size, tie_embeddings=model_config.get("tie_embeddings", "none"),
                   embeddings=embeddings, **kwargs)
    if kind == "encoder":
        return Encoder(source_vocab_size, embeddings=embeddings, **kwargs)
    raise ValueError(f"unknown model type {kind!r}")


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
