"""What a Marian (OPUS-MT) conversion refuses, both ways: the checks of
:mod:`transformerkit.converters.marian`, each refusal naming the key or option.

Import. :func:`load_config` refuses, with a :class:`CheckpointError` naming the key: another
``model_type``; ``activation_function`` other than swish/silu/gelu/relu; encoder and decoder
with different head counts (``decoder_attention_heads``) or feed-forward widths
(``decoder_ffn_dim``); ``encoder_layerdrop``/``decoder_layerdrop`` above 0 (layer dropout is
not implemented); ``normalize_before``, ``normalize_embedding``, ``add_final_layer_norm`` true
(transformers' ``MarianMTModel`` and CTranslate2's converter ignore them and compute post-LN
blocks, so a pre-LN checkpoint is reproduced by neither); ``share_encoder_decoder_embeddings``
true with ``tie_word_embeddings`` false (shared embeddings, separate ``lm_head``: no such
option); ``decoder_vocab_size`` differing from ``vocab_size`` with shared embeddings; a list
of ``eos_token_id``; ``pad_token_id``, ``eos_token_id`` or the unknown-token id equal or
outside the vocabulary (:meth:`~transformerkit.converters.marian_ids.MarianIds.from_config`).
:func:`check_sides` refuses, with a ``ValueError`` naming both, a vocabulary side whose size,
``<pad>`` or ``</s>`` contradicts ``config.json``.

Export. :func:`check_exportable` refuses, with a ``ValueError`` naming the option before
anything is written: another model than ``Transformer``; ``model.positional`` other than
``sinusoidal_split`` (or a position table that is not its formula), ``model.max_timescale``
other than 10000, ``model.norm_position: pre``, ``model.activation`` other than
relu/gelu/swish (the ones the import reads back), ``model.layer_norm_epsilon`` other than
1e-5 (``MarianMTModel``'s LayerNorms use PyTorch's default), ``key_dim``/``value_dim`` other
than ``d_model / num_heads``; and (:func:`check_tokenizer`) a tokenizer that is not
SentencePiece (``data.tokenizer`` char, word, bpe, ...) or a Marian vocabulary still in a
checkpoint's own ids.
"""

import numpy as np

from transformerkit.converters.hf_io import CheckpointError, float32_array, read_config
from transformerkit.data.marian_vocab import MarianTokenizer
from transformerkit.data.sentencepiece_tokenizer import SentencePieceTokenizer
from transformerkit.layers.embeddings import sinusoidal_table

ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}
EXPORTED_ACTIVATIONS = {ours: theirs for theirs, ours in reversed(ACTIVATIONS.items())}
LAYER_NORM_EPSILON = 1e-5  # Marian's nn.LayerNorm layers keep PyTorch's default
POSITION_TOLERANCE = 1e-5  # a position table against the formula
_REQUIRED = ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
             "encoder_attention_heads", "encoder_ffn_dim", "max_position_embeddings",
             "pad_token_id", "eos_token_id")
# (key, transformers' default, the value this import needs, why another value is refused)
_FIXED = (
    ("encoder_layerdrop", 0.0, 0.0, "layer dropout is not implemented"),
    ("decoder_layerdrop", 0.0, 0.0, "layer dropout is not implemented"),
    ("normalize_before", False, False, "transformers' MarianMTModel and CTranslate2 ignore it "
     "and compute post-LN blocks, so a pre-LN checkpoint is reproduced by neither"),
    ("normalize_embedding", False, False, "MarianMTModel has no embedding LayerNorm"),
    ("add_final_layer_norm", False, False, "MarianMTModel has no final LayerNorm"),
)


def config_error(folder, key, value, why):
    """The :class:`CheckpointError` of a ``config.json`` key the Transformer cannot take."""
    return CheckpointError(f"{folder}/config.json: {key}={value!r} cannot be mapped onto "
                           f"Transformer: {why}")


def load_config(folder):
    """``config.json`` of a Marian folder as a dict, checked: :class:`CheckpointError` naming
    the first key the ``Transformer`` cannot reproduce (see the module docstring)."""
    config = read_config(folder)[0]
    if config.get("model_type") != "marian":
        raise config_error(folder, "model_type", config.get("model_type"),
                           "Transformer.from_pretrained reads Marian (model_type marian) folders")
    for key in _REQUIRED:
        if isinstance(config.get(key), bool) or not isinstance(config.get(key), int):
            raise config_error(folder, key, config.get(key), "it must be one integer")
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise config_error(folder, "activation_function", activation,
                           f"supported: {', '.join(ACTIVATIONS)}")
    for key, own in (("decoder_attention_heads", "encoder_attention_heads"),
                     ("decoder_ffn_dim", "encoder_ffn_dim")):
        if config.get(key, config[own]) != config[own]:
            raise config_error(folder, key, config[key], f"it differs from "
                               f"{own}={config[own]} (one value for both stacks)")
    for key, default, needed, why in _FIXED:
        if config.get(key, default) != needed:
            raise config_error(folder, key, config.get(key), why)
    if config["d_model"] % config["encoder_attention_heads"]:
        raise config_error(folder, "d_model", config["d_model"], "not divisible by "
                           f"encoder_attention_heads={config['encoder_attention_heads']}")
    shared = config.get("share_encoder_decoder_embeddings", True)
    if shared and not config.get("tie_word_embeddings", True):
        raise config_error(folder, "tie_word_embeddings", False, "with "
                           "share_encoder_decoder_embeddings the Transformer ties the output "
                           "projection too (tie_embeddings all)")
    decoder_vocab = config.get("decoder_vocab_size") or config["vocab_size"]
    if shared and decoder_vocab != config["vocab_size"]:
        raise config_error(folder, "decoder_vocab_size", decoder_vocab, "shared embeddings "
                           f"need one vocabulary (vocab_size={config['vocab_size']})")
    return config


def check_sides(folder, ids, source, target, shared):
    """One clear ValueError where a vocabulary side (a Marian-id :class:`MarianTokenizer`)
    contradicts ``config.json`` (its size, its ``<pad>`` or ``</s>`` id), instead of a
    failed renumbering or a wrong embedding; ``shared``: one vocabulary for both sides."""
    for side, tokenizer, rows in (("source", source, ids.source_rows),
                                  ("target", target, ids.target_rows)):
        if tokenizer.vocab_size + 1 != len(rows):  # the renumbering adds <s>
            key = "vocab_size" if side == "source" or shared else "decoder_vocab_size"
            raise ValueError(f"{folder}: the {side} vocabulary has {tokenizer.vocab_size} "
                             f"pieces but config.json's {key} is {len(rows) - 1}")
        for key, marian, own in (("pad_token_id", rows[0], tokenizer.pad_id),
                                 ("eos_token_id", rows[2], tokenizer.eos_id)):
            if marian != own:
                raise ValueError(f"{folder}: config.json's {key} is {marian}, but the {side} "
                                 f"vocabulary has {tokenizer.id_to_token(own)!r} at id {own}")


# -- back to Marian -----------------------------------------------------------------------------
def position_deviation(model, layer):
    """The largest difference of ``layer``'s table from Marian's sinusoid."""
    expected = sinusoidal_table(model.max_length, model.d_model, "sinusoidal_split")
    return float(np.max(np.abs(float32_array(layer.table) - expected)))


def _refuse(option, value, wanted):
    return ValueError(f"model.{option}={value!r} has no MarianMTModel equivalent "
                      f"(MarianMTModel needs {option}={wanted!r})")


def check_exportable(model, source_tokenizer, target_tokenizer):
    """Raise ``ValueError`` naming the first option of ``model`` or tokenizer that a
    ``MarianMTModel`` folder cannot reproduce (see the module docstring)."""
    if type(model).__name__ != "Transformer":
        raise ValueError(f"the MarianMTModel export covers translation runs (Transformer), "
                         f"not {type(model).__name__}")
    wanted = (("positional", "sinusoidal_split"), ("max_timescale", 1.0e4),
              ("norm_position", "post"), ("layer_norm_epsilon", LAYER_NORM_EPSILON),
              ("use_bias", True))
    for option, value in wanted:
        if getattr(model, option) != value:
            raise _refuse(option, getattr(model, option), value)
    if model.activation not in EXPORTED_ACTIVATIONS:
        raise ValueError(f"model.activation={model.activation!r} has no MarianMTModel "
                         f"equivalent that imports back (use one of "
                         f"{', '.join(EXPORTED_ACTIVATIONS)})")
    head = model.d_model // model.num_heads
    if model.key_dim != head or model.value_dim != head or head * model.num_heads != \
            model.d_model:
        raise ValueError(f"model.key_dim={model.key_dim} / value_dim={model.value_dim}: "
                         f"MarianMTModel's heads are d_model / num_heads = {head} wide")
    model._ensure_built()
    for layer in (model.source_positions, model.target_positions):
        deviation = position_deviation(model, layer)
        if deviation > POSITION_TOLERANCE:
            raise ValueError(f"model.{layer.name}: the position table differs from the "
                             f"sinusoidal_split formula (max |diff| {deviation:.3g}), which "
                             "MarianMTModel recomputes instead of reading it")
    for side, tokenizer, size in (("source", source_tokenizer, model.source_vocab_size),
                                  ("target", target_tokenizer, model.target_vocab_size)):
        check_tokenizer(side, tokenizer, size)


def check_tokenizer(side, tokenizer, size):
    """A ``ValueError`` naming why ``tokenizer`` (one side, ``size`` ids in the model) has
    no ``MarianTokenizer`` equivalent."""
    if isinstance(tokenizer, MarianTokenizer) and not tokenizer.model_ids:
        raise ValueError(f"the {side} tokenizer is a Marian vocabulary in a checkpoint's own "
                         "ids, not a model's of this package (MarianTokenizer.renumbered)")
    if not isinstance(tokenizer, (MarianTokenizer, SentencePieceTokenizer)):
        kind = getattr(tokenizer, "kind", type(tokenizer).__name__)
        raise ValueError(f"data.tokenizer={kind!r} ({side}) has no MarianTokenizer "
                         "equivalent: a MarianMTModel folder needs SentencePiece vocabularies "
                         "(data.tokenizer: sentencepiece or sentencepiece-bpe, or an imported "
                         "Marian model)")
    specials = [tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id]
    if specials != [0, 1, 2, 3]:
        raise ValueError(f"the {side} tokenizer has pad/bos/eos/unk ids {specials}; the "
                         "export needs 0, 1, 2, 3")
    if tokenizer.vocab_size != size:
        raise ValueError(f"the {side} tokenizer has {tokenizer.vocab_size} ids but the "
                         f"model's {side} vocabulary has {size}")


__all__ = ["ACTIVATIONS", "EXPORTED_ACTIVATIONS", "LAYER_NORM_EPSILON", "check_exportable",
           "check_sides", "check_tokenizer", "config_error", "load_config",
           "position_deviation"]
