"""Import a local Hugging Face BERT-family checkpoint folder into a transformerkit ``Encoder``.

A checkpoint folder holds ``config.json`` (``model_type: bert``), the weights
(``model.safetensors``, a sharded ``model.safetensors.index.json``, or ``pytorch_model.bin``)
and usually its tokenizer (``tokenizer.json``, ``vocab.txt``). BERT is the paper's encoder
with post-LayerNorm blocks, exact (erf) GELU, learned absolute positions, token-type
embeddings and a LayerNorm over the summed embeddings, without the sqrt(d_model)
embedding scale: all options of :class:`~transformerkit.models.Encoder`, so the import is a
renaming of tensors:

==========================================================  =====================================
Hugging Face (``BertModel``; ``bert.`` prefix stripped)       transformerkit ``Encoder``
==========================================================  =====================================
``embeddings.word_embeddings.weight``                       ``token_embedding.embeddings``
``embeddings.position_embeddings.weight``                   ``positions.position_embeddings``
``embeddings.token_type_embeddings.weight``                 ``type_embedding.embeddings``
``embeddings.LayerNorm``                                    ``embedding_norm``
``encoder.layer.i.attention.self.{query,key,value}``        ``block_i.self_attention.{query,..}``
``encoder.layer.i.attention.output.dense``                  ``block_i.self_attention.output``
``encoder.layer.i.attention.output.LayerNorm``              ``block_i.self_attention_norm``
``encoder.layer.i.intermediate.dense``                      ``block_i.feedforward.inner``
``encoder.layer.i.output.dense``                            ``block_i.feedforward.outer``
``encoder.layer.i.output.LayerNorm``                        ``block_i.feedforward_norm``
``pooler.dense`` (``pooling="cls"``)                        ``pooler``
``classifier`` (``BertForSequenceClassification``)          ``classifier``
==========================================================  =====================================

PyTorch ``Linear`` weights are ``(out, in)``; Keras ``Dense`` kernels are ``(in, out)``, so
they are transposed. Everything a checkpoint could hold that this mapping cannot reproduce
(another ``model_type``, a ``hidden_act`` other than ``gelu``/``relu``, relative position
embeddings, a decoder, a padding id other than 0) is refused with an error naming it.

The entry point is :meth:`Encoder.from_pretrained`, which builds the Encoder from
:func:`encoder_kwargs` and fills it with :func:`load_hf_weights`; this module works on the
encoder it is given and does not import ``encoder.py`` (which imports this one).

Example:
>>> encoder = Encoder.from_pretrained("all-MiniLM-L6-v2", pooling="mean")
>>> tokenizer = load_hf_tokenizer("all-MiniLM-L6-v2")
>>> ids = tokenizer.encode("A dog runs.", add_bos=True, add_eos=True)  # [CLS] ... [SEP]
>>> encoder(np.array([ids])).shape
(1, 384)
"""

import json
import logging
import pathlib

import numpy as np

log = logging.getLogger("transformerkit")

SUPPORTED_MODEL_TYPES = ("bert",)
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}  # HF "gelu" is the exact erf form
_PREFIXES = ("bert.",)  # task models (BertForSequenceClassification, ...) nest the encoder
_IGNORED = ("embeddings.position_ids", "cls.", "pooler.")  # buffers, heads not asked for


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be imported; the message says what is wrong."""


def load_hf_config(folder):
    """``config.json`` of a checkpoint folder as a dict, checked for what we can map.

    Raises ``FileNotFoundError`` for a missing folder or file, :class:`CheckpointError`
    for unparsable JSON or an architecture the
    :class:`~transformerkit.models.Encoder` cannot reproduce.
    """
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {folder}")
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face checkpoint "
                                "folder")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    _check_architecture(config, path)
    return config


def _check_architecture(config, path):
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(f"{path}: model_type {model_type!r} cannot be mapped onto "
                              f"Encoder; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings")
    missing = [key for key in required if not isinstance(config.get(key), int)]
    if missing:
        raise CheckpointError(f"{path}: missing or non-integer {', '.join(missing)}")
    checks = [
        ("hidden_act", config.get("hidden_act", "gelu"), tuple(_ACTIVATIONS)),
        ("position_embedding_type", config.get("position_embedding_type", "absolute"),
         ("absolute",)),
        ("is_decoder", config.get("is_decoder", False), (False,)),
        ("add_cross_attention", config.get("add_cross_attention", False), (False,)),
        ("pad_token_id", config.get("pad_token_id", 0), (0, None)),
    ]
    for key, value, allowed in checks:
        if value not in allowed:
            raise CheckpointError(f"{path}: {key}={value!r} cannot be mapped onto Encoder "
                                  f"(supported: {', '.join(map(repr, allowed))})")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise CheckpointError(f"{path}: hidden_size {config['hidden_size']} is not divisible "
                              f"by num_attention_heads {config['num_attention_heads']}")


def encoder_kwargs(config):
    """``Encoder`` constructor arguments equivalent to a BERT ``config.json`` dict."""
    return dict(
        vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
        d_model=config["hidden_size"], num_heads=config["num_attention_heads"],
        d_ff=config["intermediate_size"], max_length=config["max_position_embeddings"],
        dropout=float(config.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
        norm_position="post", activation=_ACTIVATIONS[config.get("hidden_act", "gelu")],
        positional="learned", layer_norm_epsilon=float(config.get("layer_norm_eps", 1e-12)),
        type_vocab_size=int(config.get("type_vocab_size", 2)), embedding_norm=True,
        scale_embeddings=False)


def read_hf_weights(folder):
    """All tensors of a checkpoint folder as ``{name: float32 NumPy array}``.

    Reads ``model.safetensors``, sharded ``model.safetensors.index.json``, or (with
    PyTorch installed) ``pytorch_model.bin`` loaded with ``weights_only=True``.
    """
    folder = pathlib.Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return _read_safetensors(single)
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                                .values()))
        except (ValueError, KeyError, AttributeError) as err:
            raise CheckpointError(f"{index} is not a valid safetensors index: {err}") from err
        weights = {}
        for shard in shards:
            if not (folder / shard).is_file():
                raise FileNotFoundError(f"{index} names shard {shard}, which is missing")
            weights.update(_read_safetensors(folder / shard))
        return weights
    if (folder / "pytorch_model.bin").is_file():
        return _read_torch_bin(folder / "pytorch_model.bin")
    present = sorted(p.name for p in folder.iterdir())
    raise FileNotFoundError(f"{folder} has no weights: expected model.safetensors, "
                            "model.safetensors.index.json or pytorch_model.bin; found "
                            f"{', '.join(present) or 'nothing'}")


def _read_safetensors(path):
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is corrupt or not a safetensors file: {err}") from err
    return {name: np.asarray(value, dtype="float32") for name, value in tensors.items()
            if np.issubdtype(value.dtype, np.floating)}


def _read_torch_bin(path):
    try:
        import torch
    except ImportError as err:
        raise ImportError(f"reading {path} needs PyTorch (or convert it to safetensors)") \
            from err
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a broken pickle or zip
        raise CheckpointError(f"{path} is corrupt or not a PyTorch state dict: {err}") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict")
    return {name: value.float().numpy() for name, value in state.items()
            if hasattr(value, "is_floating_point") and value.is_floating_point()}


def _strip_prefix(weights):
    """Task models store the encoder under ``bert.``; old checkpoints say gamma/beta."""
    renamed = {}
    for name, value in weights.items():
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight")
        name = name.replace("LayerNorm.beta", "LayerNorm.bias")
        renamed[name] = value
    return renamed


def _weight_map(encoder):
    """``[(keras variable, HF tensor name, transpose?)]`` for every weight of ``encoder``."""
    def dense(layer, name):
        return [(layer.kernel, f"{name}.weight", True), (layer.bias, f"{name}.bias", False)]

    def norm(layer, name):
        return [(layer.gamma, f"{name}.weight", False), (layer.beta, f"{name}.bias", False)]

    pairs = [(encoder.token_embedding.embeddings, "embeddings.word_embeddings.weight", False),
             (encoder.positions.table, "embeddings.position_embeddings.weight", False),
             (encoder.type_embedding.embeddings, "embeddings.token_type_embeddings.weight",
              False)]
    pairs += norm(encoder.embedding_layer_norm, "embeddings.LayerNorm")
    for i, block in enumerate(encoder.blocks):
        hf = f"encoder.layer.{i}"
        attention = block.self_attention
        pairs += dense(attention.query_dense, f"{hf}.attention.self.query")
        pairs += dense(attention.key_dense, f"{hf}.attention.self.key")
        pairs += dense(attention.value_dense, f"{hf}.attention.self.value")
        pairs += dense(attention.output_dense, f"{hf}.attention.output.dense")
        pairs += norm(block.self_attention_norm, f"{hf}.attention.output.LayerNorm")
        pairs += dense(block.feedforward.inner, f"{hf}.intermediate.dense")
        pairs += dense(block.feedforward.outer, f"{hf}.output.dense")
        pairs += norm(block.feedforward_norm, f"{hf}.output.LayerNorm")
    return pairs


def _optional_heads(encoder, weights, folder):
    """Pooler and classifier: loaded when the checkpoint has them, else left initialised."""
    pairs = []
    heads = [(encoder.pooler, "pooler.dense", "the pooler (pooling='cls')"),
             (encoder.classifier, "classifier", "the classifier")]
    for layer, name, what in heads:
        if layer is None:
            continue
        shapes_fit = (weights.get(f"{name}.weight") is not None and
                      weights[f"{name}.weight"].shape[::-1] == tuple(layer.kernel.shape))
        if shapes_fit and f"{name}.bias" in weights:
            pairs += [(layer.kernel, f"{name}.weight", True), (layer.bias, f"{name}.bias", False)]
        else:
            log.info("%s: no matching %s weights; %s starts from random values (fine-tune it)",
                     folder, name, what)
    return pairs


def load_hf_weights(encoder, folder, weights=None):
    """Copy the tensors of a BERT checkpoint ``folder`` into a built ``encoder``.

    Raises :class:`CheckpointError` naming the missing tensors or the first tensor whose
    shape differs. Tensors the mapping does not use (pre-training heads, unknown extras)
    are reported in one log line.
    """
    weights = _strip_prefix(read_hf_weights(folder) if weights is None else weights)
    encoder._ensure_built()
    pairs = _weight_map(encoder) + _optional_heads(encoder, weights, folder)
    missing = [name for _, name, _ in pairs if name not in weights]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise CheckpointError(f"{folder}: the weights lack {len(missing)} tensor(s) a BERT "
                              f"encoder needs: {shown}")
    for variable, name, transpose in pairs:
        value = weights[name].T if transpose else weights[name]
        if tuple(value.shape) != tuple(variable.shape):
            expected = tuple(variable.shape)[::-1] if transpose else tuple(variable.shape)
            raise CheckpointError(f"{folder}: tensor {name} has shape {weights[name].shape}, "
                                  f"but config.json implies {expected}")
        variable.assign(value.astype(variable.dtype))
    used = {name for _, name, _ in pairs}
    unused = sorted(n for n in weights if n not in used and not n.startswith(_IGNORED))
    if unused:
        log.info("%s: %d tensor(s) not used by Encoder: %s", folder, len(unused),
                 ", ".join(unused[:5]))
    return encoder


__all__ = ["CheckpointError", "encoder_kwargs", "load_hf_config", "load_hf_weights",
           "read_hf_weights"]
