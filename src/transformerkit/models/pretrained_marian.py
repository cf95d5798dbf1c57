"""Import a local Hugging Face Marian (OPUS-MT) checkpoint folder into a ``Transformer``.

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
model.shared (or encoder.embed_tokens)      source_embedding (rows reordered, see below)
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

Vocabulary ids. This package reserves ids 0..3 for ``<pad> <s> </s> <unk>`` in every
vocabulary (:mod:`transformerkit.special_tokens`; id 0 is padding in every mask, loss and
decoder). Marian puts ``</s>`` at 0, ``<unk>`` at 1 and ``<pad>`` last, and starts the
decoder from ``decoder_start_token_id`` (its pad id) instead of a begin token. The import
therefore reorders the rows of each vocabulary (:class:`MarianIds`): ours 0 = Marian's pad,
ours 1 (``<s>``, the decoder's first input) = a copy of Marian's ``decoder_start_token_id``
row, ours 2 = its ``eos_token_id``, ours 3 = its ``<unk>`` (from ``vocab.json``, else id
1), then every other Marian id in its order: one more row than Marian's vocabulary, and the
decoder starts where Marian starts without any option. Masks find padding as everywhere,
greedy, beam and sampling start from ``<s>`` and stop at ``</s>``, and the CTranslate2 export
needs nothing new. Decoding never picks ``<pad>`` or ``<s>`` (OPUS-MT configs forbid the pad
with ``bad_words_ids`` too). A tokenizer for an imported model maps pieces to ids with
:meth:`MarianIds.to_ours`.

Refused, with a :class:`CheckpointError` naming the key: another ``model_type``;
``activation_function`` other than swish/silu/gelu/relu; encoder and decoder with different
head counts (``decoder_attention_heads``) or feed-forward widths (``decoder_ffn_dim``);
``encoder_layerdrop``/``decoder_layerdrop`` above 0 (layer dropout is not implemented);
``normalize_before``, ``normalize_embedding``, ``add_final_layer_norm`` true (transformers'
``MarianMTModel`` and CTranslate2's converter ignore them and compute post-LN blocks, so a
pre-LN checkpoint is reproduced by neither); ``share_encoder_decoder_embeddings`` true with
``tie_word_embeddings`` false (shared embeddings, separate ``lm_head``: no such option);
``decoder_vocab_size`` differing from ``vocab_size`` with shared embeddings; a list of
``eos_token_id``; ``pad_token_id``, ``eos_token_id`` or the unknown-token id equal or
outside the vocabulary.

Example:
>>> model = Transformer.from_pretrained("opus-mt-de-en")
>>> ids = MarianIds.from_folder("opus-mt-de-en")  # Marian ids <-> this model's ids
"""

import dataclasses
import json
import logging
import pathlib

import numpy as np

from transformerkit.layers.embeddings import sinusoidal_table
from transformerkit.models.pretrained import CheckpointError, read_hf_config, read_hf_weights
from transformerkit.models.pretrained_generation import read_generation_config, search_section

log = logging.getLogger("transformerkit")

ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}
LAYER_NORM_EPSILON = 1e-5  # Marian's nn.LayerNorm layers keep PyTorch's default
UNK_FALLBACK = 1  # Marian vocabularies: </s> 0, <unk> 1, ..., <pad> last
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


def _error(folder, key, value, why):
    return CheckpointError(f"{folder}/config.json: {key}={value!r} cannot be mapped onto "
                           f"Transformer: {why}")


def load_marian_config(folder):
    """``config.json`` of a Marian folder as a dict, checked: :class:`CheckpointError` naming
    the first key the ``Transformer`` cannot reproduce (see the module docstring)."""
    config = read_hf_config(folder)
    if config.get("model_type") != "marian":
        raise _error(folder, "model_type", config.get("model_type"),
                     "Transformer.from_pretrained reads Marian (model_type marian) folders")
    for key in _REQUIRED:
        if isinstance(config.get(key), bool) or not isinstance(config.get(key), int):
            raise _error(folder, key, config.get(key), "it must be one integer")
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise _error(folder, "activation_function", activation,
                     f"supported: {', '.join(ACTIVATIONS)}")
    for key, own in (("decoder_attention_heads", "encoder_attention_heads"),
                     ("decoder_ffn_dim", "encoder_ffn_dim")):
        if config.get(key, config[own]) != config[own]:
            raise _error(folder, key, config[key], f"it differs from {own}={config[own]} "
                         "(one value for both stacks)")
    for key, default, needed, why in _FIXED:
        if config.get(key, default) != needed:
            raise _error(folder, key, config.get(key), why)
    if config["d_model"] % config["encoder_attention_heads"]:
        raise _error(folder, "d_model", config["d_model"], "not divisible by "
                     f"encoder_attention_heads={config['encoder_attention_heads']}")
    shared = config.get("share_encoder_decoder_embeddings", True)
    if shared and not config.get("tie_word_embeddings", True):
        raise _error(folder, "tie_word_embeddings", False, "with "
                     "share_encoder_decoder_embeddings the Transformer ties the output "
                     "projection too (tie_embeddings all)")
    decoder_vocab = config.get("decoder_vocab_size") or config["vocab_size"]
    if shared and decoder_vocab != config["vocab_size"]:
        raise _error(folder, "decoder_vocab_size", decoder_vocab, "shared embeddings need "
                     f"one vocabulary (vocab_size={config['vocab_size']})")
    return config


def transformer_kwargs(config):
    """``Transformer`` constructor arguments equivalent to a checked Marian config (the
    vocabulary sizes are Marian's plus one, see :class:`MarianIds`)."""
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


def marian_search(folder, config):
    """The ``search:`` section of a run imported from the Marian ``folder`` (its checked
    ``config``): the search ``transformers``' ``generate`` does with the folder's
    generation settings (:mod:`transformerkit.models.pretrained_generation`); the settings
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


@dataclasses.dataclass(frozen=True)
class MarianIds:
    """How this package's ids relate to a Marian checkpoint's, one map per side.

    ``source_rows[i]`` / ``target_rows[i]``: the Marian id whose embedding row becomes id
    ``i`` here (0: pad, 1: the decoder start, 2: eos, 3: unk, then the other ids in order).
    """

    source_rows: np.ndarray
    target_rows: np.ndarray

    @classmethod
    def from_config(cls, config, unk_id=UNK_FALLBACK, folder="config"):
        """The maps of a checked config; ``unk_id``: Marian's ``<unk>`` id."""
        shared = config.get("share_encoder_decoder_embeddings", True)
        target_vocab = config["vocab_size"] if shared else (
            config.get("decoder_vocab_size") or config["vocab_size"])
        pad, eos = config["pad_token_id"], config["eos_token_id"]
        start = config.get("decoder_start_token_id", pad)
        start = pad if start is None else start
        sides = []
        for vocab in (config["vocab_size"], target_vocab):  # one layout: shared matrices
            specials = {"pad_token_id": pad, "decoder_start_token_id": start,
                        "eos_token_id": eos, "<unk> id": unk_id}
            for key, value in specials.items():
                if not isinstance(value, int) or not 0 <= value < vocab:
                    raise _error(folder, key, value, f"not an id of the {vocab} ids")
            if len({pad, eos, unk_id}) < 3:
                raise _error(folder, "pad_token_id", pad, f"pad ({pad}), eos ({eos}) and "
                             f"<unk> ({unk_id}) must be three different ids")
            sides.append(_side_rows(vocab, pad, start, eos, unk_id))
        return cls(*sides)

    @classmethod
    def layout(cls, source_size, target_size):
        """The maps of Marian's own layout for vocabularies of ``source_size`` /
        ``target_size`` ids here (``<pad> <s> </s> <unk>`` at 0..3): one id fewer each,
        ``</s>`` 0, ``<unk>`` 1, our ids 4.. in order, and ``<pad>`` last, which is also
        the decoder start (an OPUS-MT folder's layout: its import gives back these ids)."""
        return cls(*(_side_rows(size - 1, size - 2, size - 2, 0, 1)
                     for size in (source_size, target_size)))

    def rows_for_marian(self, side="target"):
        """For each Marian id, the id here whose embedding row (and logit) it takes: the
        inverse of the import, except that a decoder start that is the pad (Marian's
        rule) takes ours 1 (``<s>``, the row the decoder starts from, which fine-tuning
        trains), not 0 (``<pad>``, a row no output depends on)."""
        rows = self.source_rows if side == "source" else self.target_rows
        ours = self.to_ours(np.arange(rows.max() + 1), side)
        if rows[1] == rows[0]:
            ours[rows[0]] = 1
        return ours

    @classmethod
    def from_folder(cls, folder, config=None):
        """The maps of a Marian folder (``<unk>`` from its ``vocab.json`` when present)."""
        config = load_marian_config(folder) if config is None else config
        return cls.from_config(config, _unk_id(folder), folder)

    def to_ours(self, marian_ids, side="source"):
        """Marian ids (any shape) -> ours; Marian's pad becomes our pad (0), so a decoder
        input must start with our ``<s>`` (1) where Marian's starts with its pad."""
        rows = self.source_rows if side == "source" else self.target_rows
        inverse = np.empty(rows.max() + 1, dtype="int64")
        inverse[rows[::-1]] = np.arange(len(rows))[::-1]  # the first of duplicates wins
        return inverse[np.asarray(marian_ids, dtype="int64")]

    def to_marian(self, ids, side="target"):
        """Our ids (any shape) -> Marian's (our ``<s>`` becomes the decoder start id)."""
        rows = self.source_rows if side == "source" else self.target_rows
        return rows[np.asarray(ids, dtype="int64")]


def _side_rows(vocab, pad, start, eos, unk):
    """One side's map: pad, start, eos, unk, then every other Marian id in order."""
    others = [i for i in range(vocab) if i not in (pad, eos, unk)]
    return np.array([pad, start, eos, unk, *others], dtype="int64")


def _unk_id(folder):
    path = pathlib.Path(folder) / "vocab.json"
    if not path.is_file():
        return UNK_FALLBACK
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from err
    return vocab.get("<unk>", UNK_FALLBACK) if isinstance(vocab, dict) else UNK_FALLBACK


def _first(weights, names, folder):
    for name in names:
        if name in weights:
            return weights[name]
    raise CheckpointError(f"{folder}: the weights lack {' or '.join(names)}")


# Tensor names of a MarianMTModel state dict without ``model.`` (``lm_head.weight`` and
# ``final_logits_bias`` have none); the export (``export/huggingface_marian.py``) writes them.
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
    expected = sinusoidal_table(model.max_length, model.d_model, "sinusoidal_split")
    for layer in (model.source_positions, model.target_positions):
        deviation = float(np.max(np.abs(np.asarray(layer.table.numpy()) - expected)))
        if deviation > 1e-5:
            log.warning("%s: the stored position table differs from Marian's sinusoid (max "
                        "|diff| %.3g); it is used as stored, and stays frozen", folder,
                        deviation)


def load_marian_weights(model, folder, weights=None, config=None):
    """Copy the tensors of a Marian ``folder`` into ``model``, a ``Transformer`` built from
    :func:`transformer_kwargs` of its config; returns ``model``.

    Raises :class:`CheckpointError` naming a missing tensor or one whose shape differs.
    Tensors the mapping does not use are reported in one log line.
    """
    config = load_marian_config(folder) if config is None else config
    weights = read_hf_weights(folder) if weights is None else weights
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
    if unused:
        log.info("%s: %d tensor(s) not used by Transformer: %s", folder, len(unused),
                 ", ".join(unused[:5]))
    return model


__all__ = ["MarianIds", "block_tensors", "load_marian_config", "load_marian_weights",
           "marian_search", "transformer_kwargs"]
