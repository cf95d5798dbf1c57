"""Hugging Face GPT-2 checkpoints (``GPT2LMHeadModel``) to ``GPT`` and back.

A GPT-2 folder holds ``config.json`` (``model_type`` ``gpt2``), the weights
(``model.safetensors``, a sharded index, or ``pytorch_model.bin``, read by
:mod:`transformerkit.converters.hf_io`) and its byte-level BPE tokenizer
(:mod:`transformerkit.data.gpt2_tokenizer`). GPT-2 is a ``GPT`` with pre-LayerNorm blocks,
a final LayerNorm, learned positions, no embedding scale, biases everywhere but the output
head, and the output head tied to the token embedding, so the import is a renaming of
tensors (``H`` = ``h.i``; the ``transformer.`` prefix of ``GPT2LMHeadModel`` is optional,
``GPT2Model`` folders have none):

==============================  ======================================================
Hugging Face ``GPT2LMHeadModel``  transformerkit ``GPT``
==============================  ======================================================
wte                             token_embedding (rows shifted by 2, see below)
wpe                             positions (``positional="learned"``, ``n_positions`` rows)
H.ln_1                          block_i.self_attention_norm (``norm_position="pre"``)
H.attn.c_attn                   block_i.self_attention.{query,key,value}: the fused
                                ``(d, 3d)`` matrix split in three along its columns
H.attn.c_proj                   block_i.self_attention.output
H.ln_2                          block_i.feedforward_norm
H.mlp.c_fc, H.mlp.c_proj        block_i.feedforward.inner, .outer
ln_f                            final_norm
lm_head (tied to wte)           ``tie_embeddings="all"``; untied: output_projection, bias 0
==============================  ======================================================

``config.json``: ``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` (null: ``4 n_embd``),
``n_positions``, ``layer_norm_epsilon``, ``resid_pdrop`` (dropout), ``attn_pdrop``
(attention_dropout), ``activation_function``: ``gelu_new`` and ``gelu_pytorch_tanh`` are
``activation="gelu_tanh"``, ``gelu`` (exact erf) ``"gelu"``, ``relu`` ``"relu"``.

GPT-2's ``Conv1D`` stores its weights ``(in, out)``, as Keras ``Dense`` kernels do: no
transpose (the untied ``lm_head`` is a ``Linear``, ``(out, in)``: transposed).

Ids. Every model here masks id 0 as padding and never generates ids 0 and 1, while they are
ordinary tokens of GPT-2 (``!`` and ``"``). So our ids are GPT-2's + 2
(:data:`~transformerkit.data.gpt2_tokenizer.ID_OFFSET`): ``vocab_size`` is GPT-2's + 2, rows
0 and 1 of the embedding are zero (logit 0 for ``<pad>`` and ``<s>``, which decoding
forbids) and logits ``[..., 2:]`` are GPT-2's. The tokenizer import shifts the same way. A
folder whose tokenizer already starts with ``<pad>`` and ``<s>`` (an export of ours) is not
shifted (:func:`~transformerkit.data.gpt2_tokenizer.vocabulary_offset`).

Refused with :class:`~transformerkit.converters.hf_io.CheckpointError` naming the key, as the
``GPT`` cannot reproduce them: another ``activation_function`` (``gelu_fast``, ``silu``, ...),
``scale_attn_weights: false`` (no 1/sqrt(d) scale), ``scale_attn_by_inverse_layer_idx:
true`` (a per-layer 1/(i+1) scale), ``add_cross_attention: true``, ``n_embd`` not divisible
by ``n_head``. ``reorder_and_upcast_attn`` only changes how float16 is computed (the same
math in float32) and is accepted. Dropout rates are kept for fine-tuning; ``embd_pdrop``
becomes the one ``dropout`` with ``resid_pdrop`` (a differing value is logged).

The import, step by step: :func:`load_config` (``config.json``, checked),
:func:`convert_backbone_config` (the ``GPT`` options), :func:`convert_weights` (the table
above, into a built GPT), :func:`convert_tokenizer` (ids shifted as the rows);
:meth:`GPT.from_pretrained` builds and fills the model.

Back (:func:`export_files`, written by ``transformerkit export --format huggingface``): a
``GPT`` whose options are GPT-2's (pre-norm, learned positions, no embedding scale, biases,
equal key and value widths with ``num_heads * key_dim = d_model``, relu/gelu/gelu_tanh, a
tied head or an untied one without bias) becomes a ``GPT2LMHeadModel`` of the same
vocabulary size (ids as ours: ``pad_token_id`` 0), giving the same logits
(:func:`export_config`, :func:`export_weights`: a tied head is stored once, as
``transformers`` does); any other option is refused naming it (:func:`check_exportable`).
When the run's tokenizer is a byte-level BPE (``data.tokenizer: bpe``, or an imported
GPT-2's), :func:`export_tokenizer` writes its ``tokenizer.json`` with a
``tokenizer_config.json`` naming the special tokens, which ``AutoTokenizer`` loads as a
``GPT2TokenizerFast`` encoding as the run does (except that ``transformers`` reads the
spelling of a special token inside a text as that token, which the run's tokenizer reads as
text); other tokenizers are not written (a line in the log says so).
"""

import json
import logging

import numpy as np

from transformerkit.converters.generation import generation_section, read_generation_config
from transformerkit.converters.hf_io import (
    CheckpointError,
    float32_array,
    json_bytes,
    log_unused,
    missing_tensors_error,
    read_config,
    read_weights,
    safetensors_bytes,
)
from transformerkit.data.gpt2_tokenizer import (
    ID_OFFSET,
    is_gpt2_layout,
    load_gpt2_tokenizer,
    vocabulary_offset,
)
from transformerkit.data.tokenizer_base import METADATA_KEY

log = logging.getLogger("transformerkit")

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
               "relu": "relu"}
EXPORTED_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
SIZES = ("vocab_size", "n_layer", "n_embd", "n_head", "n_positions")
# (config key, GPT2Config's default, the values the GPT reproduces)
CHECKS = (("scale_attn_weights", True, (True,)),
          ("scale_attn_by_inverse_layer_idx", False, (False,)),
          ("add_cross_attention", False, (False,)))
_IGNORED = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of old checkpoints


def load_config(folder):
    """``config.json`` of a GPT-2 folder as a dict, checked for what ``GPT`` reproduces
    (``FileNotFoundError`` / :class:`CheckpointError` naming the problem)."""
    config, path = read_config(folder)
    if config.get("model_type") != "gpt2":
        raise CheckpointError(f"{path}: model_type {config.get('model_type')!r} is not "
                              "gpt2")
    missing = [key for key in SIZES if not isinstance(config.get(key), int)]
    if missing:
        raise CheckpointError(f"{path}: missing or non-integer {', '.join(missing)}")
    activation = config.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        raise CheckpointError(f"{path}: activation_function={activation!r} cannot be mapped "
                              f"onto GPT (supported: {', '.join(ACTIVATIONS)})")
    for key, default, allowed in CHECKS:
        value = config.get(key, default)
        if value not in allowed:
            raise CheckpointError(f"{path}: {key}={value!r} cannot be mapped onto GPT "
                                  f"(supported: {', '.join(map(repr, allowed))})")
    if config["n_embd"] % config["n_head"]:
        raise CheckpointError(f"{path}: n_embd {config['n_embd']} is not divisible by n_head "
                              f"{config['n_head']}")
    if config.get("n_inner") is not None and not isinstance(config["n_inner"], int):
        raise CheckpointError(f"{path}: n_inner must be an integer or null, got "
                              f"{config['n_inner']!r}")
    return config


def convert_generation_config(folder, config):
    """The ``generation:`` section of a run imported from the GPT-2 ``folder`` (its checked
    ``config``): how ``transformers``' ``generate`` continues a prompt with the folder's
    generation settings (:func:`~transformerkit.converters.generation.generation_section`);
    the settings it has no counterpart to are named in one warning line."""
    settings, path = read_generation_config(folder, config)
    never = (0, 1) if folder_offset(folder) == 0 else ()  # our <pad> and <s>: never picked
    generation, unsupported = generation_section(settings, config.get("eos_token_id", 50256),
                                                 config["n_positions"], never, path)
    if unsupported:
        log.warning("%s: not reproduced by transformerkit's generate, which runs without "
                    "them: %s", path, ", ".join(unsupported))
    return generation


def folder_offset(folder):
    """The id shift of a GPT-2 folder: its tokenizer's (0 or 2), :data:`ID_OFFSET` for a
    folder without one."""
    try:
        return vocabulary_offset(folder)
    except FileNotFoundError:
        return ID_OFFSET


def convert_backbone_config(config, offset=ID_OFFSET):
    """``GPT`` constructor arguments equivalent to a checked GPT-2 ``config.json`` dict
    whose ids are shifted by ``offset``."""
    dropout = float(config.get("resid_pdrop", 0.1))
    if float(config.get("embd_pdrop", dropout)) != dropout:
        log.info("GPT-2 embd_pdrop=%s differs from resid_pdrop=%s: the GPT has one dropout "
                 "rate, resid_pdrop's", config.get("embd_pdrop"), dropout)
    return dict(vocab_size=config["vocab_size"] + offset, num_layers=config["n_layer"],
                d_model=config["n_embd"], num_heads=config["n_head"],
                d_ff=config.get("n_inner") or 4 * config["n_embd"],
                max_length=config["n_positions"], norm_position="pre",
                activation=ACTIVATIONS[config.get("activation_function", "gelu_new")],
                positional="learned",
                tie_embeddings="all" if config.get("tie_word_embeddings", True) else "none",
                dropout=dropout, attention_dropout=float(config.get("attn_pdrop", 0.1)),
                layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-5)),
                scale_embeddings=False, use_bias=True)


def _strip(weights):
    return {name.removeprefix("transformer."): value for name, value in weights.items()}


def _block_pairs(gpt):
    """``[(keras variable, GPT-2 tensor name, column slice or None)]`` of every block."""
    pairs, d = [], gpt.d_model
    for i, block in enumerate(gpt.blocks):
        attention, feedforward = block.self_attention, block.feedforward
        h = f"h.{i}"
        for part, dense in enumerate((attention.query_dense, attention.key_dense,
                                      attention.value_dense)):
            columns = slice(part * d, (part + 1) * d)
            pairs += [(dense.kernel, f"{h}.attn.c_attn.weight", columns),
                      (dense.bias, f"{h}.attn.c_attn.bias", columns)]
        for dense, name in ((attention.output_dense, "attn.c_proj"),
                            (feedforward.inner, "mlp.c_fc"), (feedforward.outer, "mlp.c_proj")):
            pairs += [(dense.kernel, f"{h}.{name}.weight", None),
                      (dense.bias, f"{h}.{name}.bias", None)]
        for norm, name in ((block.self_attention_norm, "ln_1"), (block.feedforward_norm, "ln_2")):
            pairs += [(norm.gamma, f"{h}.{name}.weight", None), (norm.beta, f"{h}.{name}.bias",
                                                                 None)]
    pairs += [(gpt.final_norm.gamma, "ln_f.weight", None), (gpt.final_norm.beta, "ln_f.bias",
                                                            None)]
    return pairs


def _shifted_rows(matrix, offset):
    """GPT-2's ``(vocab, d)`` rows after ``offset`` zero rows: ours."""
    return np.concatenate([np.zeros((offset, matrix.shape[1]), matrix.dtype), matrix])


def convert_weights(gpt, folder, weights=None, offset=None):
    """Copy the tensors of a GPT-2 ``folder`` into ``gpt`` (built from
    :func:`convert_backbone_config`),
    its ids shifted by ``offset`` (None: :func:`folder_offset`).

    Raises :class:`CheckpointError` naming missing tensors or the first tensor whose shape
    differs from the config's; tensors not used are named in one log line."""
    offset = folder_offset(folder) if offset is None else offset
    weights = _strip(read_weights(folder) if weights is None else weights)
    gpt._ensure_built()
    pairs = _block_pairs(gpt)
    embedding = gpt.token_embedding.embeddings
    needed = [name for _, name, _ in pairs] + ["wte.weight", "wpe.weight"]
    if gpt.output_projection is not None:
        needed.append("lm_head.weight")
    missing = list(dict.fromkeys(n for n in needed if n not in weights))
    if missing:
        raise missing_tensors_error(folder, missing, "a GPT-2")
    values = [(embedding, "wte.weight", _shifted_rows(weights["wte.weight"], offset)),
              (gpt.positions.table, "wpe.weight", weights["wpe.weight"])]
    values += [(variable, name, weights[name] if columns is None else
                weights[name][..., columns]) for variable, name, columns in pairs]
    if gpt.output_projection is not None:
        head = gpt.output_projection
        rows = _shifted_rows(weights["lm_head.weight"], offset)
        values += [(head.kernel, "lm_head.weight", rows.T),
                   (head.bias, "lm_head (no bias)", np.zeros(head.bias.shape, "float32"))]
    for variable, name, value in values:
        if tuple(value.shape) != tuple(variable.shape):
            raise CheckpointError(f"{folder}: tensor {name} has shape "
                                  f"{weights[name].shape}, which does not fit config.json "
                                  f"(the GPT's {variable.path} is {tuple(variable.shape)})")
        variable.assign(value.astype(variable.dtype))
    used = set(needed)
    unused = sorted(n for n in weights if n not in used and not n.endswith(_IGNORED))
    log_unused(folder, unused, "GPT")
    return gpt


def convert_tokenizer(folder):
    """The byte-level BPE tokenizer of a GPT-2 folder, its ids shifted as the embedding rows
    (:func:`~transformerkit.data.gpt2_tokenizer.load_gpt2_tokenizer`)."""
    return load_gpt2_tokenizer(folder)


# -- back to GPT-2 ----------------------------------------------------------------------------
def check_exportable(gpt):
    """Raise ``ValueError`` naming the first option of ``gpt`` a ``GPT2LMHeadModel`` cannot
    reproduce (see the module docstring)."""
    if type(gpt).__name__ != "GPT":
        raise ValueError(f"the Hugging Face export covers GPT runs (as GPT2LMHeadModel), not "
                         f"{type(gpt).__name__}")
    wanted = (("norm_position", "pre"), ("positional", "learned"), ("scale_embeddings", False),
              ("use_bias", True))
    for option, value in wanted:
        if getattr(gpt, option) != value:
            raise ValueError(f"model.{option}={getattr(gpt, option)!r} has no GPT-2 "
                             f"equivalent (GPT2LMHeadModel needs {option}={value!r})")
    if gpt.activation not in EXPORTED_ACTIVATIONS:
        raise ValueError(f"model.activation={gpt.activation!r} has no GPT-2 equivalent")
    if gpt.key_dim != gpt.value_dim or gpt.key_dim * gpt.num_heads != gpt.d_model:
        raise ValueError(f"model.key_dim={gpt.key_dim} / value_dim={gpt.value_dim}: GPT-2's "
                         f"heads are d_model / num_heads = {gpt.d_model // gpt.num_heads} wide "
                         "for queries, keys and values")
    gpt._ensure_built()
    head = gpt.output_projection
    if head is not None and head.bias is not None and np.any(float32_array(head.bias)):
        raise ValueError("model.tie_embeddings='none' with use_bias: the output projection "
                         "has a bias, which GPT-2's lm_head lacks (train with "
                         "tie_embeddings: all to export)")


def export_config(gpt, tokenizer=None):
    """The ``config.json`` dict of a ``GPT2LMHeadModel`` equivalent to ``gpt`` (checked
    with :func:`check_exportable`); the special ids are ``tokenizer``'s."""
    check_exportable(gpt)
    if gpt.activation_dropout:
        log.info("model.activation_dropout=%s has no GPT-2 equivalent; it only affects "
                 "training and is not exported", gpt.activation_dropout)
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
              "vocab_size": gpt.vocab_size, "n_positions": gpt.max_length,
              "n_embd": gpt.d_model, "n_layer": gpt.num_layers, "n_head": gpt.num_heads,
              "n_inner": gpt.d_ff, "activation_function": EXPORTED_ACTIVATIONS[gpt.activation],
              "resid_pdrop": gpt.dropout, "embd_pdrop": gpt.dropout,
              "attn_pdrop": gpt.attention_dropout, "layer_norm_epsilon": gpt.layer_norm_epsilon,
              "tie_word_embeddings": gpt.output_projection is None,
              "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
              "reorder_and_upcast_attn": False, "pad_token_id": 0}
    if tokenizer is not None:
        config.update(bos_token_id=int(tokenizer.bos_id), eos_token_id=int(tokenizer.eos_id))
    return config


def export_weights(gpt):
    """``{GPT2LMHeadModel tensor name: float32 array}`` of ``gpt`` (the inverse of
    :func:`convert_weights`, ids as ours: no row is dropped)."""
    check_exportable(gpt)
    tensors = {}
    columns_of = {}
    for variable, name, columns in _block_pairs(gpt):
        if columns is None:
            tensors[f"transformer.{name}"] = float32_array(variable)
        else:
            columns_of.setdefault(name, []).append(float32_array(variable))
    for name, parts in columns_of.items():
        tensors[f"transformer.{name}"] = np.concatenate(parts, axis=-1)
    tensors["transformer.wte.weight"] = float32_array(gpt.token_embedding.embeddings)
    tensors["transformer.wpe.weight"] = float32_array(gpt.positions.table)
    if gpt.output_projection is not None:
        head = float32_array(gpt.output_projection.kernel)
        tensors["lm_head.weight"] = np.ascontiguousarray(head.T)
    return tensors


def export_tokenizer(tokenizer, max_length):
    """``{file name: text}`` of a byte-level BPE tokenizer for ``transformers``, or None
    for another kind."""
    if not is_gpt2_layout(tokenizer):
        return None
    payload = json.loads(tokenizer.backend_tokenizer.to_str())
    payload.pop(METADATA_KEY, None)
    names = {key: tokenizer.id_to_token(getattr(tokenizer, f"{key}_id"))
             for key in ("pad", "bos", "eos", "unk")}
    config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False,
              "model_max_length": int(max_length), "clean_up_tokenization_spaces": False,
              **{f"{key}_token": name for key, name in names.items()}}
    return {"tokenizer.json": json.dumps(payload, ensure_ascii=False),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False)}


def export_generation_config(generation, tokenizer, max_length):
    """The ``generation_config.json`` dict with which ``generate`` continues a prompt as the
    run's ``generation`` options (a
    :class:`~transformerkit.decoding.options.GenerationOptions`) do: the inverse of
    :func:`~transformerkit.converters.generation.generation_section` (greedy where
    ``temperature`` is 0, else ``do_sample`` with ``temperature``, ``top_k`` (0: none) and
    ``top_p``; ``max_new_tokens``, else ``max_length``, else the model's ``max_length``
    positions; ``min_new_tokens``, ``no_repeat_ngram_size``; ``bad_words_ids`` of ``<pad>``
    and ``<s>``, which our generation never picks). A ``seed`` is a call's, and
    ``stop_at_eos: false`` has no counterpart there (a line in the log says so)."""
    config = {"bos_token_id": int(tokenizer.bos_id), "eos_token_id": int(tokenizer.eos_id),
              "pad_token_id": 0, "do_sample": bool(generation.temperature),
              # ours never picks <pad> or <s>: nor does generate then
              "bad_words_ids": [[int(tokenizer.pad_id)], [int(tokenizer.bos_id)]]}
    if generation.temperature:
        config.update(temperature=generation.temperature, top_k=generation.top_k or 0,
                      top_p=1.0 if generation.top_p is None else generation.top_p)
    if generation.max_new_tokens is not None:
        config["max_new_tokens"] = generation.max_new_tokens
    else:
        config["max_length"] = generation.max_length or max_length
    if generation.min_new_tokens:
        config["min_new_tokens"] = generation.min_new_tokens
    if generation.no_repeat_ngram_size:
        config["no_repeat_ngram_size"] = generation.no_repeat_ngram_size
    if not generation.stop_at_eos:
        log.info("generation.stop_at_eos=false has no generation_config.json equivalent: "
                 "generate stops at the end-of-text token")
    return config


def export_files(gpt, tokenizer, generation=None):
    """``{file name: str or bytes}`` of the ``GPT2LMHeadModel`` folder of ``gpt`` and its
    ``tokenizer``, with ``generation_config.json`` from the run's ``generation`` options
    where given (:func:`export_generation_config`); a ``ValueError`` naming what has no
    equivalent, before any is made."""
    check_exportable(gpt)
    if tokenizer.vocab_size != gpt.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's "
                         f"vocabulary has {gpt.vocab_size}")
    files = {"config.json": json_bytes(export_config(gpt, tokenizer)),
             "model.safetensors": safetensors_bytes(export_weights(gpt))}
    if generation is not None:
        files["generation_config.json"] = json_bytes(
            export_generation_config(generation, tokenizer, gpt.max_length))
    tokenizer_texts = export_tokenizer(tokenizer, gpt.max_length)
    if tokenizer_texts is None:
        log.info("the run's %s tokenizer has no Hugging Face GPT-2 equivalent (a "
                 "byte-level BPE); only the model is exported", type(tokenizer).__name__)
    return {**files, **(tokenizer_texts or {})}


__all__ = ["check_exportable", "convert_backbone_config", "convert_tokenizer",
           "convert_weights", "export_config", "export_files", "export_generation_config",
           "export_tokenizer",
           "export_weights", "folder_offset", "load_config"]
