"""Hugging Face BERT and DistilBERT checkpoints to ``Encoder`` (import only).

A checkpoint folder holds ``config.json`` (``model_type`` ``bert`` or ``distilbert``), the
weights (``model.safetensors``, a sharded ``model.safetensors.index.json``, or
``pytorch_model.bin``) and usually its tokenizer (``tokenizer.json``, ``vocab.txt``). Both are
the paper's encoder with post-LayerNorm blocks, exact (erf) GELU or ReLU, absolute positions
and a LayerNorm over the summed embeddings, without the sqrt(d_model) embedding scale: all
options of :class:`~transformerkit.models.Encoder`, so the import is a renaming of tensors,
one :class:`HFArchitecture` per ``model_type`` (tensor names without ``.weight``/``.bias`` and
without the task models' ``bert.``/``distilbert.`` prefix; ``L`` = ``encoder.layer.i``,
``T`` = ``transformer.layer.i``):

==================================  ==============================  ==============================
Hugging Face ``BertModel``          ``DistilBertModel``             transformerkit ``Encoder``
==================================  ==============================  ==============================
embeddings.word_embeddings          embeddings.word_embeddings      token_embedding
embeddings.position_embeddings      embeddings.position_embeddings  positions
embeddings.token_type_embeddings    (none: type_vocab_size=0)       type_embedding
embeddings.LayerNorm                embeddings.LayerNorm            embedding_norm
L.attention.self.{query,key,value}  T.attention.{q,k,v}_lin         block_i.self_attention.{q,k,v}
L.attention.output.dense            T.attention.out_lin             block_i.self_attention.output
L.attention.output.LayerNorm        T.sa_layer_norm                 block_i.self_attention_norm
L.intermediate.dense                T.ffn.lin1                      block_i.feedforward.inner
L.output.dense                      T.ffn.lin2                      block_i.feedforward.outer
L.output.LayerNorm                  T.output_layer_norm             block_i.feedforward_norm
pooler.dense                        (none)                          pooler (pooling="cls")
classifier (…ForSequence…)          (never imported, see below)     classifier (num_classes)
==================================  ==============================  ==============================

PyTorch ``Linear`` weights are ``(out, in)``; Keras ``Dense`` kernels are ``(in, out)``, so
they are transposed. DistilBERT's config names its sizes ``dim``, ``n_layers``, ``n_heads``,
``hidden_dim``, its LayerNorm epsilon is fixed at 1e-12, and it has no token types. With
``sinusoidal_pos_embds: true`` its positions are the paper's fixed sinusoid (section 3.5),
still stored in ``position_embeddings.weight``: the Encoder gets ``positional="sinusoidal"``
(a frozen table) and is filled with the stored values, so it computes what ``transformers``
computes; a stored table that is not the sinusoid (trained further) is used as stored and
logged as a warning.

Heads. BERT's ``pooler.dense`` (tanh) and ``classifier`` fill the pooler of ``pooling="cls"``
and the classifier of ``num_classes`` when the checkpoint has them with fitting shapes; else
these start from random values (logged). DistilBERT has no tanh pooler, and the head of
``DistilBertForSequenceClassification`` (``pre_classifier`` Dense, ReLU, ``classifier``) is not
the Encoder's (tanh pooler, Dense), so it is never imported: such a folder loads as its
encoder (``pooling`` None, "mean" or "cls" with a new pooler; the head is named in a log line),
and ``num_classes`` on it is refused with :class:`CheckpointError` rather than silently
replacing the trained head by a random one. To fine-tune a new head on that encoder anyway,
build ``Encoder(**convert_backbone_config(config), pooling=..., num_classes=...)`` and pass
:func:`convert_weights` the tensors of :func:`~transformerkit.converters.hf_io.read_weights`
without the head's.

Everything else a checkpoint could hold that this mapping cannot reproduce (another
``model_type``, an activation other than ``gelu``/``relu``, relative position embeddings, a
decoder, a padding id other than 0) is refused with a :class:`CheckpointError` naming it.

The steps: :func:`load_config` (``config.json``, checked), :func:`convert_backbone_config`
(the ``Encoder`` options), :func:`convert_weights` (the table above, into a built Encoder),
:func:`convert_tokenizer` (``tokenizer.json`` or ``vocab.txt``; BERT's ids are ours as they
are: ``[PAD]`` is 0). There is no export back to a Hugging Face folder. The entry point is
:meth:`Encoder.from_pretrained`, which builds the Encoder from the options and fills it;
like every converter, this module works on the model it is given and imports no model class
(the converters sit below ``models/``, which calls them).

Example:
>>> encoder = Encoder.from_pretrained("all-MiniLM-L6-v2", pooling="mean")
>>> tokenizer = convert_tokenizer("all-MiniLM-L6-v2")
>>> ids = tokenizer.encode("A dog runs.", add_bos=True, add_eos=True)  # [CLS] ... [SEP]
>>> encoder(np.array([ids])).shape
(1, 384)
"""

import dataclasses
import logging
from collections.abc import Callable

import numpy as np

from transformerkit.converters.hf_io import (
    CheckpointError,
    log_unused,
    missing_tensors_error,
    read_config,
    read_weights,
)
from transformerkit.data.tokenizers import load_hf_tokenizer
from transformerkit.layers.embeddings import sinusoidal_table

log = logging.getLogger("transformerkit")

_ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}  # HF "gelu" is the exact erf form


@dataclasses.dataclass(frozen=True)
class HFArchitecture:
    """How the checkpoints of one Hugging Face ``model_type`` map onto ``Encoder``.

    Args:
        name: str, the model family in messages ("BERT").
        sizes: dict, ``Encoder`` argument -> the required integer ``config.json`` key.
        checks: tuple of ``(config key, default, allowed values)``; other values are refused.
        options: callable, ``config`` dict -> the other ``Encoder`` arguments it determines.
        tensors: dict, Encoder part -> tensor name (``{i}``: the layer index; ``.weight`` and
            ``.bias`` appended), or None where the architecture has no such part.
        prefix: str, under which task models (``BertForSequenceClassification``, ...) nest
            the encoder; stripped.
        ignored: tuple of tensor-name prefixes not reported as unused (buffers, pre-training
            heads).
        foreign_heads: tuple of tensor-name prefixes of task heads with no Encoder
            equivalent: never imported, and ``num_classes`` on a checkpoint holding one is
            refused.
    """

    name: str
    sizes: dict
    checks: tuple
    options: Callable[[dict], dict]
    tensors: dict
    prefix: str
    ignored: tuple = ()
    foreign_heads: tuple = ()


BERT = HFArchitecture(
    name="BERT",
    sizes=dict(vocab_size="vocab_size", num_layers="num_hidden_layers", d_model="hidden_size",
               num_heads="num_attention_heads", d_ff="intermediate_size",
               max_length="max_position_embeddings"),
    checks=(("hidden_act", "gelu", tuple(_ACTIVATIONS)),
            ("position_embedding_type", "absolute", ("absolute",)),
            ("is_decoder", False, (False,)),
            ("add_cross_attention", False, (False,)),
            ("pad_token_id", 0, (0, None))),
    options=lambda config: dict(
        dropout=float(config.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
        activation=_ACTIVATIONS[config.get("hidden_act", "gelu")], positional="learned",
        layer_norm_epsilon=float(config.get("layer_norm_eps", 1e-12)),
        type_vocab_size=int(config.get("type_vocab_size", 2))),
    tensors=dict(
        token_embedding="embeddings.word_embeddings",
        positions="embeddings.position_embeddings",
        type_embedding="embeddings.token_type_embeddings",
        embedding_norm="embeddings.LayerNorm",
        query="encoder.layer.{i}.attention.self.query",
        key="encoder.layer.{i}.attention.self.key",
        value="encoder.layer.{i}.attention.self.value",
        attention_output="encoder.layer.{i}.attention.output.dense",
        attention_norm="encoder.layer.{i}.attention.output.LayerNorm",
        inner="encoder.layer.{i}.intermediate.dense",
        outer="encoder.layer.{i}.output.dense",
        feedforward_norm="encoder.layer.{i}.output.LayerNorm",
        pooler="pooler.dense", classifier="classifier"),
    prefix="bert.",
    ignored=("embeddings.position_ids", "cls.", "pooler."))

DISTILBERT = HFArchitecture(
    name="DistilBERT",
    sizes=dict(vocab_size="vocab_size", num_layers="n_layers", d_model="dim",
               num_heads="n_heads", d_ff="hidden_dim", max_length="max_position_embeddings"),
    checks=(("activation", "gelu", tuple(_ACTIVATIONS)),
            ("sinusoidal_pos_embds", False, (False, True)),
            ("pad_token_id", 0, (0, None))),
    options=lambda config: dict(
        dropout=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.1)),
        activation=_ACTIVATIONS[config.get("activation", "gelu")],
        positional="sinusoidal" if config.get("sinusoidal_pos_embds") else "learned",
        layer_norm_epsilon=1e-12, type_vocab_size=0),  # eps is fixed in DistilBERT's code
    tensors=dict(
        token_embedding="embeddings.word_embeddings",
        positions="embeddings.position_embeddings",
        type_embedding=None,
        embedding_norm="embeddings.LayerNorm",
        query="transformer.layer.{i}.attention.q_lin",
        key="transformer.layer.{i}.attention.k_lin",
        value="transformer.layer.{i}.attention.v_lin",
        attention_output="transformer.layer.{i}.attention.out_lin",
        attention_norm="transformer.layer.{i}.sa_layer_norm",
        inner="transformer.layer.{i}.ffn.lin1",
        outer="transformer.layer.{i}.ffn.lin2",
        feedforward_norm="transformer.layer.{i}.output_layer_norm",
        pooler=None, classifier=None),
    prefix="distilbert.",
    ignored=("embeddings.position_ids", "vocab_transform.", "vocab_layer_norm.",
             "vocab_projector."),  # the masked-LM head
    foreign_heads=("pre_classifier.", "classifier."))

ARCHITECTURES = {"bert": BERT, "distilbert": DISTILBERT}


def architecture(model_type, where="config.json"):
    """The :class:`HFArchitecture` of a ``model_type``; :class:`CheckpointError` if none."""
    if model_type not in ARCHITECTURES:
        raise CheckpointError(f"{where}: model_type {model_type!r} cannot be mapped onto "
                              f"Encoder; supported: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]


def load_config(folder):
    """``config.json`` of a checkpoint folder as a dict, checked for what we can map.

    Raises ``FileNotFoundError`` for a missing folder or file, :class:`CheckpointError`
    for unparsable JSON or an architecture the
    :class:`~transformerkit.models.Encoder` cannot reproduce.
    """
    config, path = read_config(folder)
    _check_architecture(config, path)
    return config


def _check_architecture(config, path):
    arch = architecture(config.get("model_type"), path)
    missing = [key for key in arch.sizes.values() if not isinstance(config.get(key), int)]
    if missing:
        raise CheckpointError(f"{path}: missing or non-integer {', '.join(missing)}")
    for key, default, allowed in arch.checks:
        value = config.get(key, default)
        if value not in allowed:
            raise CheckpointError(f"{path}: {key}={value!r} cannot be mapped onto Encoder "
                                  f"(supported: {', '.join(map(repr, allowed))})")
    width, heads = arch.sizes["d_model"], arch.sizes["num_heads"]
    if config[width] % config[heads]:
        raise CheckpointError(f"{path}: {width} {config[width]} is not divisible by {heads} "
                              f"{config[heads]}")


def convert_backbone_config(config):
    """``Encoder`` constructor arguments equivalent to a checked ``config.json`` dict
    (:func:`load_config`)."""
    arch = architecture(config.get("model_type"))
    kwargs = {argument: config[key] for argument, key in arch.sizes.items()}
    return dict(kwargs, norm_position="post", embedding_norm=True, scale_embeddings=False,
                **arch.options(config))


def _strip_prefix(weights, prefix):
    """Task models nest the encoder under ``prefix``; old checkpoints say gamma/beta."""
    renamed = {}
    for name, value in weights.items():
        if name.startswith(prefix):
            name = name[len(prefix):]
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight")
        name = name.replace("LayerNorm.beta", "LayerNorm.bias")
        renamed[name] = value
    return renamed


def _weight_map(encoder, arch):
    """``[(keras variable, HF tensor name, transpose?)]`` for every encoder weight."""
    names = arch.tensors

    def dense(layer, part, i):
        name = names[part].format(i=i)
        return [(layer.kernel, f"{name}.weight", True), (layer.bias, f"{name}.bias", False)]

    def norm(layer, part, i=None):
        name = names[part].format(i=i)
        return [(layer.gamma, f"{name}.weight", False), (layer.beta, f"{name}.bias", False)]

    pairs = [(encoder.token_embedding.embeddings, f"{names['token_embedding']}.weight", False),
             (encoder.positions.table, f"{names['positions']}.weight", False)]
    if encoder.type_embedding is not None:
        if names["type_embedding"] is None:
            raise CheckpointError(f"{arch.name} has no token-type embeddings, but the Encoder "
                                  f"was built with type_vocab_size={encoder.type_vocab_size}")
        pairs.append((encoder.type_embedding.embeddings, f"{names['type_embedding']}.weight",
                      False))
    pairs += norm(encoder.embedding_layer_norm, "embedding_norm")
    for i, block in enumerate(encoder.blocks):
        attention, feedforward = block.self_attention, block.feedforward
        for part, layer in [("query", attention.query_dense), ("key", attention.key_dense),
                            ("value", attention.value_dense),
                            ("attention_output", attention.output_dense),
                            ("inner", feedforward.inner), ("outer", feedforward.outer)]:
            pairs += dense(layer, part, i)
        pairs += norm(block.self_attention_norm, "attention_norm", i)
        pairs += norm(block.feedforward_norm, "feedforward_norm", i)
    return pairs


def _optional_heads(encoder, weights, folder, arch):
    """Pooler and classifier: loaded when the checkpoint has them, else left initialised.

    Raises :class:`CheckpointError` when ``num_classes`` is asked of a checkpoint whose
    classification head has no Encoder equivalent (it would be silently replaced).
    """
    foreign = sorted({name.rsplit(".", 1)[0] for name in weights
                      if name.startswith(arch.foreign_heads)})
    if foreign and encoder.classifier is not None:
        raise CheckpointError(
            f"{folder}: num_classes={encoder.num_classes} asks for a classifier, but this "
            f"{arch.name} checkpoint's head ({', '.join(foreign)}) differs from Encoder's "
            "(tanh pooler + Dense) and is not imported; leave num_classes out to load the "
            "encoder (see transformerkit.converters.bert to fine-tune a new head)")
    if foreign:
        log.info("%s: %s head %s has no Encoder equivalent and is not imported; only the "
                 "encoder is loaded", folder, arch.name, ", ".join(foreign))
    pairs = []
    heads = [(encoder.pooler, "pooler", "the pooler (pooling='cls')"),
             (encoder.classifier, "classifier", "the classifier")]
    for layer, part, what in heads:
        if layer is None:
            continue
        name = arch.tensors[part]
        shapes_fit = (name is not None and weights.get(f"{name}.weight") is not None and
                      weights[f"{name}.weight"].shape[::-1] == tuple(layer.kernel.shape))
        if shapes_fit and f"{name}.bias" in weights:
            pairs += [(layer.kernel, f"{name}.weight", True), (layer.bias, f"{name}.bias", False)]
        else:
            log.info("%s: no matching %s weights; %s starts from random values (fine-tune it)",
                     folder, name or f"{arch.name} {part}", what)
    return pairs


def _check_fixed_positions(encoder, folder):
    """A fixed (sinusoidal) table is loaded as stored; say so if it is not the formula's."""
    if encoder.positional == "learned":
        return
    stored = encoder.positions.table.numpy()
    expected = sinusoidal_table(encoder.max_length, encoder.d_model, encoder.positional,
                                encoder.min_timescale, encoder.max_timescale)
    deviation = float(np.max(np.abs(stored - expected)))
    if deviation > 1e-5:
        log.warning("%s: the stored position table differs from the %s formula (max |diff| "
                    "%.3g); it is used as stored, and stays frozen", folder, encoder.positional,
                    deviation)


def convert_weights(encoder, folder, weights=None, model_type=None):
    """Copy the tensors of a checkpoint ``folder`` into a built ``encoder``.

    Args:
        encoder: an ``Encoder`` built from :func:`convert_backbone_config` of the folder's
            config.
        folder: the checkpoint folder (its weights are read unless ``weights`` is given).
        weights: ``{name: array}`` as from
            :func:`~transformerkit.converters.hf_io.read_weights`, or None.
        model_type: "bert" or "distilbert"; None reads it from ``folder/config.json``.

    Raises :class:`CheckpointError` naming the missing tensors, the first tensor whose shape
    differs, or a classification head that ``num_classes`` cannot take (see the module
    docstring). Tensors the mapping does not use (unknown extras) are reported in one log
    line.
    """
    arch = (architecture(model_type, folder) if model_type is not None
            else architecture(load_config(folder)["model_type"]))
    weights = read_weights(folder) if weights is None else weights
    weights = _strip_prefix(weights, arch.prefix)
    encoder._ensure_built()
    try:
        pairs = _weight_map(encoder, arch)
    except CheckpointError as err:
        raise CheckpointError(f"{folder}: {err}") from None
    pairs += _optional_heads(encoder, weights, folder, arch)
    missing = [name for _, name, _ in pairs if name not in weights]
    if missing:
        raise missing_tensors_error(folder, missing, f"a {arch.name} encoder")
    for variable, name, transpose in pairs:
        value = weights[name].T if transpose else weights[name]
        if tuple(value.shape) != tuple(variable.shape):
            expected = tuple(variable.shape)[::-1] if transpose else tuple(variable.shape)
            raise CheckpointError(f"{folder}: tensor {name} has shape {weights[name].shape}, "
                                  f"but config.json implies {expected}")
        variable.assign(value.astype(variable.dtype))
    _check_fixed_positions(encoder, folder)
    used = {name for _, name, _ in pairs}
    skipped = arch.ignored + arch.foreign_heads
    unused = sorted(n for n in weights if n not in used and not n.startswith(skipped))
    log_unused(folder, unused, "Encoder")
    return encoder


def convert_tokenizer(folder):
    """The tokenizer of a BERT or DistilBERT folder, in the checkpoint's own ids
    (:func:`~transformerkit.data.tokenizers.load_hf_tokenizer`)."""
    return load_hf_tokenizer(folder)


__all__ = ["ARCHITECTURES", "BERT", "DISTILBERT", "HFArchitecture", "architecture",
           "convert_backbone_config", "convert_tokenizer", "convert_weights", "load_config"]
