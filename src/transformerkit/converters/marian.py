"""Hugging Face Marian (OPUS-MT) checkpoints (``MarianMTModel``) to ``Transformer`` and back.

A ``MarianMTModel`` folder holds ``config.json`` (``model_type: marian``), the weights
(``model.safetensors``, a sharded index, or ``pytorch_model.bin``) and its vocabulary
(``source.spm``, ``target.spm``, ``vocab.json``). Marian's model is the paper's
encoder-decoder with post-LayerNorm blocks (epsilon 1e-5, PyTorch's default), no final
LayerNorms, biases everywhere, the swish (SiLU) activation in OPUS-MT (``gelu`` and
``relu`` also occur), and a fixed sinusoidal table whose columns hold all sines, then all
cosines; all of it is an option of :class:`~transformerkit.models.Transformer`
(``models/options.py``), so the import is a renaming of tensors (``E``/``D`` =
``model.encoder.layers.i`` / ``model.decoder.layers.i``; ``.weight``/``.bias`` left out):

==========================================  =================================================
Hugging Face ``MarianMTModel``              transformerkit ``Transformer``
==========================================  =================================================
model.shared (or encoder.embed_tokens)      source_embedding (rows reordered: marian_ids)
model.decoder.embed_tokens (or shared)      target_embedding (tied: the source one)
lm_head (tied: the decoder embedding)       output projection (tied: the target embedding)
final_logits_bias ``(1, vocab)``            final_logits_bias (a frozen bias, as HF's buffer)
encoder/decoder.embed_positions (formula)   source/target_positions, ``sinusoidal_split``
E.self_attn.{q,k,v,out}_proj                encoder_block_i.self_attention.{query,key,
                                            value,output}
E.self_attn_layer_norm                      encoder_block_i.self_attention_norm
E.fc1, E.fc2                                encoder_block_i.feedforward.inner, .outer
E.final_layer_norm                          encoder_block_i.feedforward_norm
D.self_attn.*, D.self_attn_layer_norm       decoder_block_i.self_attention, its norm
D.encoder_attn.*, D.encoder_attn_layer_norm decoder_block_i.cross_attention, its norm
D.fc1, D.fc2, D.final_layer_norm            decoder_block_i.feedforward, its norm
==========================================  =================================================

PyTorch ``Linear`` weights are ``(out, in)``, Keras ``Dense`` kernels ``(in, out)``: they are
transposed. The config maps onto options as: ``encoder_layers`` -> ``num_layers``,
``decoder_layers`` -> ``num_decoder_layers``, ``d_model``, ``encoder_attention_heads`` ->
``num_heads``, ``encoder_ffn_dim`` -> ``d_ff``, ``max_position_embeddings`` ->
``max_length``, ``activation_function`` (``swish``/``silu``, ``gelu``, ``relu``) ->
``activation``, ``scale_embedding`` -> ``scale_embeddings``, ``dropout``,
``attention_dropout``, ``activation_dropout``; ``share_encoder_decoder_embeddings`` and
``tie_word_embeddings`` -> ``tie_embeddings`` ``all`` (one shared vocabulary, the OPUS-MT
models), ``decoder`` (separate source and target vocabularies, ``decoder_vocab_size``: the
Tatoeba-Challenge models) or ``none`` (separate vocabularies and an untied ``lm_head``).

Vocabulary ids: Marian's ``</s>`` 0, ``<unk>`` 1, ``<pad>`` last become ours ``<pad> <s> </s>
<unk>`` 0..3, every embedding row and logit reordered to match, one more row than Marian's
vocabulary (:class:`~transformerkit.converters.marian_ids.MarianIds`). What cannot be
converted either way is refused naming the key or option
(:mod:`transformerkit.converters.marian_checks`).

The import, step by step: :func:`~transformerkit.converters.marian_checks.load_config`
(``config.json``, checked), :func:`convert_backbone_config`,
:func:`convert_weights` (the table above), :func:`convert_tokenizer` (both sides in the
model's ids), :func:`convert_generation_config` (the run's ``search:`` section, as
``generate`` searches: :mod:`transformerkit.converters.generation`);
:meth:`Transformer.from_pretrained` builds and fills the model.

Back (:func:`export_files`, written by ``transformerkit export --format huggingface``): the
files that ``MarianMTModel.from_pretrained`` and ``MarianTokenizer.from_pretrained`` load,
giving the run's logits and, with the same search settings, its translations token for
token: ``config.json`` (:func:`export_config`), ``model.safetensors`` (:func:`export_weights`,
the inverse of the import through the same table, :func:`block_tensors`, in Marian's id
layout), ``generation_config.json`` (:func:`export_generation_config`) and the tokenizer
files (:func:`~transformerkit.converters.marian_ids.export_tokenizer`). Our decoders never
pick ``<pad>`` or ``<s>``, and ``generation_config.json`` makes ``generate`` do the same:
``bad_words_ids`` ``[[pad]]`` (as OPUS-MT's configs), ``forced_eos_token_id`` null (ours
never forces ``</s>``), ``num_beams`` 4 and ``early_stopping`` true (our beam search's
defaults) and ``max_length`` the model's. The length penalties differ by definition (ours
GNMT's ``((5+n)/6)^alpha``, theirs ``n^length_penalty``); both are off at ``alpha=0`` /
``length_penalty=0``.

Example:
>>> model = Transformer.from_pretrained("opus-mt-de-en")
>>> ids = MarianIds.from_folder("opus-mt-de-en")  # Marian ids <-> this model's ids
"""

import logging

import numpy as np

from transformerkit.converters.generation import read_generation_config, search_section
from transformerkit.converters.hf_io import (
    CheckpointError,
    float32_array,
    json_bytes,
    log_unused,
    read_weights,
    safetensors_bytes,
)
from transformerkit.converters.marian_checks import (
    ACTIVATIONS,
    EXPORTED_ACTIVATIONS,
    LAYER_NORM_EPSILON,
    POSITION_TOLERANCE,
    check_exportable,
    check_sides,
    load_config,
    position_deviation,
)
from transformerkit.converters.marian_ids import MarianIds, export_ids, export_tokenizer
from transformerkit.data.marian_vocab import load_marian_tokenizers

log = logging.getLogger("transformerkit")

DEFAULT_BEAMS = 4  # our beam search's default width


def convert_backbone_config(config):
    """``Transformer`` constructor arguments equivalent to a checked Marian config (the
    vocabulary sizes are Marian's plus one: the ids of
    :class:`~transformerkit.converters.marian_ids.MarianIds`)."""
    shared = config.get("share_encoder_decoder_embeddings", True)
    target_vocab = config["vocab_size"] if shared else (config.get("decoder_vocab_size")
                                                        or config["vocab_size"])
    tie = ("all" if shared else "decoder" if config.get("tie_word_embeddings", True)
           else "none")
    return dict(
        source_vocab_size=config["vocab_size"] + 1, target_vocab_size=target_vocab + 1,
        num_layers=config["encoder_layers"], num_decoder_layers=config["decoder_layers"],
        d_model=config["d_model"], num_heads=config["encoder_attention_heads"],
        d_ff=config["encoder_ffn_dim"], max_length=config["max_position_embeddings"],
        dropout=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
        activation_dropout=float(config.get("activation_dropout", 0.0)),
        activation=ACTIVATIONS[config.get("activation_function", "gelu")],
        norm_position="post", positional="sinusoidal_split",
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        scale_embeddings=bool(config.get("scale_embedding", False)),
        tie_embeddings=tie, final_logits_bias=True)


def convert_generation_config(folder, config):
    """The ``search:`` section of a run imported from the Marian ``folder`` (its checked
    ``config``): the search ``transformers``' ``generate`` does with the folder's
    generation settings (:mod:`transformerkit.converters.generation`); the settings
    it has no counterpart to are named in one warning line."""
    settings, path = read_generation_config(folder, config)
    pad = config["pad_token_id"]
    start = config.get("decoder_start_token_id")
    special = {"eos_token_id": config["eos_token_id"], "pad_token_id": pad,
               "decoder_start_token_id": pad if start is None else start}
    search, unsupported = search_section(settings, special,
                                         config["max_position_embeddings"], path)
    if unsupported:
        log.warning("%s: not reproduced by transformerkit's search, which runs without "
                    "them: %s", path, ", ".join(unsupported))
    return search


def convert_tokenizer(folder, config=None):
    """The ``(source, target)`` tokenizers of a Marian folder in the model's ids: each side's
    :class:`~transformerkit.data.marian_vocab.MarianTokenizer` renumbered by
    :class:`~transformerkit.converters.marian_ids.MarianIds`, after
    :func:`~transformerkit.converters.marian_checks.check_sides`."""
    config = load_config(folder) if config is None else config
    source, target = load_marian_tokenizers(folder)
    ids = MarianIds.from_folder(folder, config)
    check_sides(folder, ids, source, target,
                shared=config.get("share_encoder_decoder_embeddings", True))
    return source.renumbered(ids.source_rows), target.renumbered(ids.target_rows)


def _first(weights, names, folder):
    for name in names:
        if name in weights:
            return weights[name]
    raise CheckpointError(f"{folder}: the weights lack {' or '.join(names)}")


# Tensor names of a MarianMTModel state dict without ``model.`` (``lm_head.weight`` and
# ``final_logits_bias`` have none), read by the import and written by the export.
SHARED_EMBEDDING = "shared.weight"
ENCODER_EMBEDDING = "encoder.embed_tokens.weight"
DECODER_EMBEDDING = "decoder.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
FINAL_LOGITS_BIAS = "final_logits_bias"
UNPREFIXED = (LM_HEAD, FINAL_LOGITS_BIAS)
POSITIONS = {"encoder": "encoder.embed_positions.weight",
             "decoder": "decoder.embed_positions.weight"}


def block_tensors(model):
    """``[(keras variable, Marian tensor name, transposed)]`` for every weight of the
    encoder and decoder blocks: the one table both directions read (``transposed``: a
    PyTorch ``Linear`` weight, ``(out, in)``, of a Keras ``(in, out)`` kernel)."""
    def dense(layer, name):
        return [(layer.kernel, f"{name}.weight", True), (layer.bias, f"{name}.bias", False)]

    def norm(layer, name):
        return [(layer.gamma, f"{name}.weight", False), (layer.beta, f"{name}.bias", False)]

    def attention(layer, name):
        return [pair for part, sub in (("query_dense", "q_proj"), ("key_dense", "k_proj"),
                                       ("value_dense", "v_proj"), ("output_dense", "out_proj"))
                for pair in dense(getattr(layer, part), f"{name}.{sub}")]

    table = []
    for i, block in enumerate(model.encoder_blocks):
        name = f"encoder.layers.{i}"
        table += attention(block.self_attention, f"{name}.self_attn")
        table += norm(block.self_attention_norm, f"{name}.self_attn_layer_norm")
        table += dense(block.feedforward.inner, f"{name}.fc1")
        table += dense(block.feedforward.outer, f"{name}.fc2")
        table += norm(block.feedforward_norm, f"{name}.final_layer_norm")
    for i, block in enumerate(model.decoder_blocks):
        name = f"decoder.layers.{i}"
        table += attention(block.self_attention, f"{name}.self_attn")
        table += norm(block.self_attention_norm, f"{name}.self_attn_layer_norm")
        table += attention(block.cross_attention_layer, f"{name}.encoder_attn")
        table += norm(block.cross_attention_norm, f"{name}.encoder_attn_layer_norm")
        table += dense(block.feedforward.inner, f"{name}.fc1")
        table += dense(block.feedforward.outer, f"{name}.fc2")
        table += norm(block.feedforward_norm, f"{name}.final_layer_norm")
    return table


def _weight_pairs(model, weights, ids, folder):
    """``[(keras variable, array already in Keras layout, name)]`` for every weight."""
    shared = model.tie_embeddings == "all"
    source = _first(weights, [SHARED_EMBEDDING, ENCODER_EMBEDDING] if shared
                    else [ENCODER_EMBEDDING, SHARED_EMBEDDING], folder)
    pairs = [(model.source_embedding.embeddings, source[ids.source_rows], "encoder embedding")]
    if not shared:
        target = _first(weights, [DECODER_EMBEDDING], folder)
        pairs.append((model.target_embedding.embeddings, target[ids.target_rows],
                      "decoder embedding"))
    if model.output_projection is not None:
        head = _first(weights, [LM_HEAD], folder)
        pairs.append((model.output_projection.kernel, head[ids.target_rows].T, "lm_head"))
    bias = weights.get(FINAL_LOGITS_BIAS)
    if model.logits_bias is None:
        raise CheckpointError(f"{folder}: the Transformer was built with final_logits_bias="
                              "False, so it cannot hold the checkpoint's final_logits_bias")
    if bias is None:
        log.info("%s: no final_logits_bias (a MarianModel folder): zeros", folder)
        bias = np.zeros((1, len(ids.target_rows) - 1), dtype="float32")
    pairs.append((model.logits_bias.bias, bias.reshape(-1)[ids.target_rows],
                  "final_logits_bias"))
    for variable, name, transposed in block_tensors(model):
        value = _first(weights, [name], folder)
        pairs.append((variable, value.T if transposed else value, name.rsplit(".", 1)[0]))
    for layer, side in ((model.source_positions, "encoder"), (model.target_positions,
                                                              "decoder")):
        stored = weights.get(POSITIONS[side])
        if stored is not None:  # older checkpoints store the table (newer ones recompute it)
            pairs.append((layer.table, stored, f"{side}.embed_positions"))
    return pairs


def _check_positions(model, folder):
    for layer in (model.source_positions, model.target_positions):
        deviation = position_deviation(model, layer)
        if deviation > POSITION_TOLERANCE:
            log.warning("%s: the stored position table differs from Marian's sinusoid (max "
                        "|diff| %.3g); it is used as stored, and stays frozen", folder,
                        deviation)


def convert_weights(model, folder, weights=None, config=None):
    """Copy the tensors of a Marian ``folder`` into ``model``, a ``Transformer`` built from
    :func:`convert_backbone_config` of its config; returns ``model``.

    Raises :class:`CheckpointError` naming a missing tensor or one whose shape differs.
    Tensors the mapping does not use are reported in one log line.
    """
    config = load_config(folder) if config is None else config
    weights = read_weights(folder) if weights is None else weights
    weights = {name.removeprefix("model."): value for name, value in weights.items()}
    ids = MarianIds.from_folder(folder, config)
    model._ensure_built()
    pairs = _weight_pairs(model, weights, ids, folder)
    for variable, value, name in pairs:
        if tuple(value.shape) != tuple(variable.shape):
            raise CheckpointError(f"{folder}: tensor {name} has shape {value.shape} (in "
                                  f"Keras' layout), but config.json implies "
                                  f"{tuple(variable.shape)}")
        variable.assign(np.ascontiguousarray(value, dtype=variable.dtype))
    _check_positions(model, folder)
    used = {SHARED_EMBEDDING, ENCODER_EMBEDDING, DECODER_EMBEDDING, *UNPREFIXED,
            *POSITIONS.values()}
    unused = sorted(n for n in weights if n not in used and not n.startswith(
        ("encoder.layers.", "decoder.layers.")))
    log_unused(folder, unused, "Transformer")
    return model


# -- back to Marian ----------------------------------------------------------------------------
def export_config(model):
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


def export_generation_config(model):
    """The ``generation_config.json`` dict: ``generate`` searches as our decoders do."""
    pad = model.target_vocab_size - 2
    return {"decoder_start_token_id": pad, "pad_token_id": pad, "eos_token_id": 0,
            "bos_token_id": None, "forced_eos_token_id": None, "bad_words_ids": [[pad]],
            "num_beams": DEFAULT_BEAMS, "early_stopping": True,
            "max_length": model.max_length}


def export_weights(model):
    """``{MarianMTModel tensor name: float32 array}`` of ``model`` (the inverse of
    :func:`convert_weights`, rows in Marian's layout:
    :meth:`~transformerkit.converters.marian_ids.MarianIds.rows_for_marian`). The position
    tables are left out, as ``save_pretrained`` leaves them (``MarianMTModel`` computes
    them)."""
    model._ensure_built()
    ids = export_ids(model)
    source_rows, target_rows = ids.rows_for_marian("source"), ids.rows_for_marian("target")
    tensors = {}
    source = float32_array(model.source_embedding.embeddings)
    if model.tie_embeddings == "all":
        tensors[SHARED_EMBEDDING] = source[source_rows]
    else:
        tensors[ENCODER_EMBEDDING] = source[source_rows]
        target = float32_array(model.target_embedding.embeddings)
        tensors[DECODER_EMBEDDING] = target[target_rows]
    projection = model.output_projection
    if projection is not None:
        tensors[LM_HEAD] = float32_array(projection.kernel).T[target_rows]
    if model.logits_bias is not None:
        bias = float32_array(model.logits_bias.bias)
    elif projection is not None and projection.bias is not None:
        bias = float32_array(projection.bias)  # lm_head has none: final_logits_bias holds it
    else:
        bias = np.zeros(model.target_vocab_size, dtype="float32")
    tensors[FINAL_LOGITS_BIAS] = bias[target_rows].reshape(1, -1)
    for variable, name, transposed in block_tensors(model):
        value = float32_array(variable)
        tensors[name] = value.T if transposed else value
    return {(name if name in UNPREFIXED else f"model.{name}"): np.ascontiguousarray(value)
            for name, value in tensors.items()}


def export_files(model, source_tokenizer, target_tokenizer):
    """``{file name: bytes}`` of the ``MarianMTModel`` folder of ``model`` and its
    tokenizers; a ``ValueError`` naming what has no equivalent, before any is made."""
    check_exportable(model, source_tokenizer, target_tokenizer)
    return {"config.json": json_bytes(export_config(model)),
            "generation_config.json": json_bytes(export_generation_config(model)),
            "model.safetensors": safetensors_bytes(export_weights(model)),
            **export_tokenizer(source_tokenizer, target_tokenizer, export_ids(model),
                               model.max_length)}


__all__ = ["MarianIds", "block_tensors", "check_exportable", "convert_backbone_config",
           "convert_generation_config", "convert_tokenizer", "convert_weights",
           "export_config", "export_files", "export_generation_config", "export_weights",
           "load_config"]
