"""A translation run (``Transformer``) as a Hugging Face ``MarianMTModel`` folder: its files.

``export --format huggingface`` of a translation run writes (through
:func:`transformerkit.export.huggingface.export_translation`) the files of
:func:`marian_files`, which ``MarianMTModel.from_pretrained`` and
``MarianTokenizer.from_pretrained`` load, giving the run's logits and, with the same search
settings, its translations token for token:

- ``config.json`` (``model_type: marian``: every size and id), ``model.safetensors`` (the
  inverse of the import, :mod:`transformerkit.models.pretrained_marian`, through its tensor
  table :func:`~transformerkit.models.pretrained_marian.block_tensors`), ``generation_config.json``;
- ``source.spm``, ``target.spm`` (each side's SentencePiece model), ``vocab.json`` (one table
  for both sides) or, for separate vocabularies, ``vocab.json`` + ``target_vocab.json`` with
  ``separate_vocabs`` in ``tokenizer_config.json``.

Ids: the folder is in Marian's own layout (:meth:`MarianIds.layout
<transformerkit.models.pretrained_marian.MarianIds.layout>`): ``</s>`` 0, ``<unk>`` 1, the
run's ids 4.. in order, ``<pad>`` last, which is also ``decoder_start_token_id`` and takes the
run's ``<s>`` row (the decoder's first input); the run's ``<pad>`` row, which no output
depends on, is left out, so each vocabulary has one id fewer than the run's. This is the
layout of every OPUS-MT folder, so an imported OPUS-MT model exports back to its own ids
and tensors (fine-tuned: with the new values), and an export imports back to the run's ids.
The same layout serves runs trained here with ``data.tokenizer: sentencepiece`` (or
``sentencepiece-bpe``), whose ``.model`` files become ``source.spm`` / ``target.spm``.

Decoding: this package's decoders never pick ``<pad>`` or ``<s>`` (beam search sets their
log-probabilities to -inf after the log-softmax, sampling their logits before the softmax);
``generation_config.json`` makes ``generate`` do the same: ``bad_words_ids`` ``[[pad]]`` (as
OPUS-MT's configs; ``generate`` applies it at the same two places), ``forced_eos_token_id``
null (ours never forces ``</s>``), ``num_beams`` 4 and ``early_stopping`` true (our beam
search's defaults) and ``max_length`` the model's. The length penalties differ by
definition (ours GNMT's ``((5+n)/6)^alpha``, theirs ``n^length_penalty``); both are off at
``alpha=0`` / ``length_penalty=0``.

Refused, with a ``ValueError`` naming the option before anything is written: another model
than ``Transformer``; ``model.positional`` other than ``sinusoidal_split`` (or a position
table that is not its formula), ``model.max_timescale`` other than 10000,
``model.norm_position: pre``, ``model.activation`` other than relu/gelu/swish (the ones the
import reads back), ``model.layer_norm_epsilon`` other than 1e-5 (``MarianMTModel``'s
LayerNorms use PyTorch's default), ``key_dim``/``value_dim`` other than ``d_model /
num_heads``; a tokenizer that is not SentencePiece (``data.tokenizer`` char, word, bpe, ...)
or a Marian vocabulary still in a checkpoint's own ids.
"""

import json

import numpy as np

from transformerkit.data.marian_vocab import MarianTokenizer
from transformerkit.data.sentencepiece_tokenizer import SentencePieceTokenizer
from transformerkit.layers.embeddings import sinusoidal_table
from transformerkit.models.pretrained_marian import (
    ACTIVATIONS,
    DECODER_EMBEDDING,
    ENCODER_EMBEDDING,
    FINAL_LOGITS_BIAS,
    LAYER_NORM_EPSILON,
    LM_HEAD,
    SHARED_EMBEDDING,
    UNPREFIXED,
    MarianIds,
    block_tensors,
)

EXPORTED_ACTIVATIONS = {ours: theirs for theirs, ours in reversed(ACTIVATIONS.items())}
DEFAULT_BEAMS = 4  # our beam search's default width
POSITION_TOLERANCE = 1e-5  # the import's check of a stored table against the formula


def _numpy(variable):
    from keras import ops

    return np.ascontiguousarray(ops.convert_to_numpy(variable), dtype=np.float32)


def _refuse(option, value, wanted):
    return ValueError(f"model.{option}={value!r} has no MarianMTModel equivalent "
                      f"(MarianMTModel needs {option}={wanted!r})")


def check_marian_exportable(model, source_tokenizer, target_tokenizer):
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
    expected = sinusoidal_table(model.max_length, model.d_model, "sinusoidal_split")
    for layer in (model.source_positions, model.target_positions):
        deviation = float(np.max(np.abs(_numpy(layer.table) - expected)))
        if deviation > POSITION_TOLERANCE:
            raise ValueError(f"model.{layer.name}: the position table differs from the "
                             f"sinusoidal_split formula (max |diff| {deviation:.3g}), which "
                             "MarianMTModel recomputes instead of reading it")
    for side, tokenizer, size in (("source", source_tokenizer, model.source_vocab_size),
                                  ("target", target_tokenizer, model.target_vocab_size)):
        _check_tokenizer(side, tokenizer, size)


def _check_tokenizer(side, tokenizer, size):
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


def marian_ids(model):
    """The :class:`MarianIds` of ``model``'s export (Marian's layout, one id fewer)."""
    return MarianIds.layout(model.source_vocab_size, model.target_vocab_size)


def marian_config(model):
    """The ``config.json`` dict of a ``MarianMTModel`` equivalent to ``model``."""
    source, target = model.source_vocab_size - 1, model.target_vocab_size - 1
    pad = target - 1  # Marian's pad, last, is also the decoder start
    return {
        "model_type": "marian", "architectures": ["MarianMTModel"],
        "vocab_size": source, "decoder_vocab_size": target, "d_model": model.d_model,
        "encoder_layers": model.num_layers, "decoder_layers": model.num_decoder_layers,
        "encoder_attention_heads": model.num_heads, "decoder_attention_heads": model.num_heads,
        "encoder_ffn_dim": model.d_ff, "decoder_ffn_dim": model.d_ff,
        "max_position_embeddings": model.max_length,
        "activation_function": EXPORTED_ACTIVATIONS[model.activation],
        "dropout": model.dropout, "attention_dropout": model.attention_dropout,
        "activation_dropout": model.activation_dropout, "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0, "scale_embedding": bool(model.scale_embeddings),
        "share_encoder_decoder_embeddings": model.tie_embeddings == "all",
        "tie_word_embeddings": model.tie_embeddings != "none",
        "pad_token_id": pad, "decoder_start_token_id": pad, "eos_token_id": 0,
        "bos_token_id": None, "forced_eos_token_id": None, "is_encoder_decoder": True,
        "use_cache": True, "init_std": 0.02, "dtype": "float32"}


def generation_config(model):
    """The ``generation_config.json`` dict: ``generate`` searches as our decoders do."""
    pad = model.target_vocab_size - 2
    return {"decoder_start_token_id": pad, "pad_token_id": pad, "eos_token_id": 0,
            "bos_token_id": None, "forced_eos_token_id": None, "bad_words_ids": [[pad]],
            "num_beams": DEFAULT_BEAMS, "early_stopping": True,
            "max_length": model.max_length}


def marian_tensors(model):
    """``{MarianMTModel tensor name: float32 array}`` of ``model`` (the inverse of
    :func:`~transformerkit.models.pretrained_marian.load_marian_weights`, rows in Marian's
    layout: :meth:`MarianIds.rows_for_marian`). The position tables are left out, as
    ``save_pretrained`` leaves them (``MarianMTModel`` computes them)."""
    model._ensure_built()
    ids = marian_ids(model)
    source_rows, target_rows = ids.rows_for_marian("source"), ids.rows_for_marian("target")
    tensors = {}
    source = _numpy(model.source_embedding.embeddings)
    if model.tie_embeddings == "all":
        tensors[SHARED_EMBEDDING] = source[source_rows]
    else:
        tensors[ENCODER_EMBEDDING] = source[source_rows]
        tensors[DECODER_EMBEDDING] = _numpy(model.target_embedding.embeddings)[target_rows]
    projection = model.output_projection
    if projection is not None:
        tensors[LM_HEAD] = _numpy(projection.kernel).T[target_rows]
    if model.logits_bias is not None:
        bias = _numpy(model.logits_bias.bias)
    elif projection is not None and projection.bias is not None:
        bias = _numpy(projection.bias)  # lm_head has no bias: final_logits_bias holds it
    else:
        bias = np.zeros(model.target_vocab_size, dtype="float32")
    tensors[FINAL_LOGITS_BIAS] = bias[target_rows].reshape(1, -1)
    for variable, name, transposed in block_tensors(model):
        value = _numpy(variable)
        tensors[name] = value.T if transposed else value
    return {(name if name in UNPREFIXED else f"model.{name}"): np.ascontiguousarray(value)
            for name, value in tensors.items()}


def vocabulary_table(tokenizer, side, ids):
    """``{piece: Marian id}`` of one side (``vocab.json``): each of the run's ids but ``<s>``
    (which becomes the pad's id: ``<pad>``'s piece keeps it)."""
    to_marian = ids.to_marian(np.arange(tokenizer.vocab_size), side)
    return {tokenizer.id_to_token(i): int(to_marian[i])
            for i in range(tokenizer.vocab_size) if i != 1}


def tokenizer_files(source_tokenizer, target_tokenizer, ids, max_length):
    """``{file name: bytes}`` of the ``MarianTokenizer`` files."""
    tables = [vocabulary_table(source_tokenizer, "source", ids),
              vocabulary_table(target_tokenizer, "target", ids)]
    separate = tables[0] != tables[1]
    config = {"tokenizer_class": "MarianTokenizer", "separate_vocabs": separate,
              "source_lang": None, "target_lang": None, "model_max_length": int(max_length),
              "sp_model_kwargs": {},
              **{f"{name}_token": source_tokenizer.id_to_token(i)
                 for name, i in (("pad", 0), ("eos", 2), ("unk", 3))}}
    files = {"source.spm": source_tokenizer.serialized_model,
             "target.spm": target_tokenizer.serialized_model,
             "vocab.json": _json(tables[0]), "tokenizer_config.json": _json(config)}
    if separate:
        files["target_vocab.json"] = _json(tables[1])
    return files


def _json(value):
    return json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8")


def marian_files(model, source_tokenizer, target_tokenizer):
    """``{file name: bytes}`` of the ``MarianMTModel`` folder of ``model`` and its
    tokenizers; a ``ValueError`` naming what has no equivalent, before any is made."""
    from safetensors.numpy import save

    check_marian_exportable(model, source_tokenizer, target_tokenizer)
    ids = marian_ids(model)
    return {"config.json": _json(marian_config(model)),
            "generation_config.json": _json(generation_config(model)),
            "model.safetensors": save(marian_tensors(model), metadata={"format": "pt"}),
            **tokenizer_files(source_tokenizer, target_tokenizer, ids, model.max_length)}


__all__ = ["check_marian_exportable", "generation_config", "marian_config", "marian_files",
           "marian_ids", "marian_tensors", "tokenizer_files", "vocabulary_table"]
