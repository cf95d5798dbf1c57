"""A trained ``Transformer`` or ``GPT`` as a CTranslate2 model, built with CTranslate2's own
specification API (``ctranslate2.specs``).

The paper's encoder-decoder becomes a ``TransformerSpec`` and the GPT a
``TransformerDecoderModelSpec``; every weight is copied from the Keras layers:

    ======================================  =============================================
    transformerkit (Keras)                  CTranslate2 spec
    ======================================  =============================================
    token embedding (x sqrt(d_model))       ``embeddings.weight``, ``scale_embeddings``
    positional table (sinusoidal, t2t or    ``position_encodings.encodings``: the model's
    learned)                                own table, whatever its kind
    query, key, value Dense (self)          ``self_attention.linear[0]``: the three fused
    query / key+value Dense (cross)         ``attention.linear[0]`` / ``linear[1]``
    attention output Dense                  last ``linear`` of the attention
    LayerNorm before/after each sublayer    ``layer_norm`` of the sublayer, ``pre_norm``
    final LayerNorm (pre-norm only)         ``encoder.layer_norm`` / ``decoder.layer_norm``
    feed-forward inner, outer Dense         ``ffn.linear_0``, ``ffn.linear_1``; relu, gelu
                                            or swish: ``Activation`` RELU, GELU, SWISH
    output projection (or the tied          ``decoder.projection``; a tied matrix is
    embedding)                              stored once (CTranslate2 aliases equal arrays)
    final_logits_bias (frozen)              ``decoder.projection.bias``
    LayerNorm epsilon                       the model config's ``layer_norm_epsilon``
    ======================================  =============================================

Keras ``Dense`` kernels are ``(in, out)``; CTranslate2's linear weights are ``(out, in)``.
Vocabularies are the tokenizers' own token strings by id (``<pad> <s> </s> <unk>`` = 0..3,
:mod:`transformerkit.special_tokens`), and the run's tokenizer files are stored in the model
directory (:func:`tokenizer_file_name`: ``source_tokenizer.json``, or ``.model`` for a
SentencePiece model, which CTranslate2's users tokenize with directly) with
:data:`METADATA_FILE`, so the folder holds all that is needed to tokenize, translate and
detokenize. A SentencePiece run's vocabulary is the model file's pieces by id.

What CTranslate2 cannot express is refused with a ``ValueError`` naming the option
(:func:`check_exportable`): key and value widths per head that differ, and models other
than ``Transformer`` and ``GPT``.
"""

import json
import os
import shutil
import tempfile

import numpy as np

from transformerkit.export.ctranslate2_folders import (  # noqa: F401 (named here too)
    EXPORT_FOLDER,
    METADATA_FILE,
    QUANTIZATIONS,
    check_quantization,
    default_export_dir,
    file_record,
    is_current,
    read_metadata,
    weights_fingerprint,
)
from transformerkit.extras import require
from transformerkit.files import TEMPORARY_PREFIX

TOKENIZER_FILES = {"source": "source_tokenizer.json", "target": "target_tokenizer.json"}

ctranslate2 = require("ctranslate2", "the CTranslate2 export and engine")


def tokenizer_file_name(side, path):
    """The name of ``side``'s tokenizer file in an export: :data:`TOKENIZER_FILES`'s, with
    the suffix of the run's file ``path`` (``.model`` for a SentencePiece model)."""
    stem, _ = os.path.splitext(TOKENIZER_FILES[side])
    return stem + (os.path.splitext(os.fspath(path))[1] or ".json")


def check_exportable(model):
    """Raise ``ValueError`` naming each option of ``model`` CTranslate2 cannot express."""
    kind = type(model).__name__
    if kind not in ("Transformer", "GPT"):
        raise ValueError(f"CTranslate2 export covers Transformer and GPT models, not {kind}")
    if model.key_dim != model.value_dim:
        raise ValueError(
            f"key_dim={model.key_dim} differs from value_dim={model.value_dim}: CTranslate2's "
            "attention has one width per head (head_dim) for queries, keys and values; "
            "models with value_dim == key_dim export")
    if not model.built:
        raise ValueError(f"the {kind} is not built, so it has no weights to export: load a "
                         "trained model or call it once on a batch")


def _array(variable):
    from keras import ops

    return np.ascontiguousarray(ops.convert_to_numpy(variable), dtype=np.float32)


def _linear(spec, *denses):
    """Fill a ``LinearSpec`` from one or more Keras ``Dense`` layers (fused along outputs)."""
    spec.weight = np.concatenate([_array(d.kernel).T for d in denses], axis=0)
    if denses[0].use_bias:
        spec.bias = np.concatenate([_array(d.bias) for d in denses], axis=0)


def _norm(spec, layer):
    """Fill a ``LayerNormSpec`` from a Keras ``LayerNormalization`` (no offset: zeros)."""
    spec.gamma = _array(layer.gamma)
    spec.beta = _array(layer.beta) if layer.beta is not None else np.zeros_like(spec.gamma)


def _attention(spec, layer, norm, cross):
    if cross:
        _linear(spec.linear[0], layer.query_dense)
        _linear(spec.linear[1], layer.key_dense, layer.value_dense)
    else:
        _linear(spec.linear[0], layer.query_dense, layer.key_dense, layer.value_dense)
    _linear(spec.linear[-1], layer.output_dense)
    _norm(spec.layer_norm, norm)


def _block(spec, block):
    """One encoder or decoder block (``EncoderBlock`` / ``DecoderBlock``)."""
    _attention(spec.self_attention, block.self_attention, block.self_attention_norm, False)
    if getattr(block, "cross_attention", False):
        _attention(spec.attention, block.cross_attention_layer, block.cross_attention_norm,
                   True)
    _linear(spec.ffn.linear_0, block.feedforward.inner)
    _linear(spec.ffn.linear_1, block.feedforward.outer)
    _norm(spec.ffn.layer_norm, block.feedforward_norm)


def _stack_options(model):
    activation = {"relu": ctranslate2.specs.Activation.RELU,
                  "gelu": ctranslate2.specs.Activation.GELU,  # Keras: exact erf
                  "swish": ctranslate2.specs.Activation.SWISH,
                  "gelu_tanh": ctranslate2.specs.Activation.GELUTanh}[model.activation]
    head_dim = None if model.key_dim * model.num_heads == model.d_model else model.key_dim
    return dict(pre_norm=model.norm_position == "pre", activation=activation,
                head_dim=head_dim)


def _stack(spec, model, token_embedding, positions, blocks, final_norm):
    spec.embeddings.weight = _array(token_embedding.embeddings)
    spec.scale_embeddings = bool(token_embedding.scale)
    spec.position_encodings.encodings = _array(positions.table)
    for layer_spec, block in zip(spec.layer, blocks, strict=True):
        _block(layer_spec, block)
    if final_norm is not None:
        _norm(spec.layer_norm, final_norm)


def _projection(spec, model, token_embedding):
    if model.output_projection is None:  # tied: the embedding matrix itself
        spec.weight = _array(token_embedding.embeddings)
    else:
        _linear(spec, model.output_projection)
    bias = getattr(model, "logits_bias", None)
    if bias is not None:  # final_logits_bias: the projection's bias (it has none of its own)
        spec.bias = _array(bias.bias)


def transformer_spec(model, source_tokens, target_tokens, special_tokens):
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights (a ``Transformer``)."""
    specs = ctranslate2.specs
    options = _stack_options(model)
    encoder = specs.TransformerEncoderSpec(model.num_layers, model.num_heads, **options)
    decoder = specs.TransformerDecoderSpec(model.num_decoder_layers, model.num_heads,
                                           **options)
    # the encoder spec keeps one embedding list (factored sources): ours is the one entry
    source = encoder.embeddings[0]
    source.weight = _array(model.source_embedding.embeddings)
    encoder.scale_embeddings = bool(model.source_embedding.scale)
    encoder.position_encodings.encodings = _array(model.source_positions.table)
    for layer_spec, block in zip(encoder.layer, model.encoder_blocks, strict=True):
        _block(layer_spec, block)
    if model.encoder_norm is not None:
        _norm(encoder.layer_norm, model.encoder_norm)
    _stack(decoder, model, model.target_embedding, model.target_positions,
           model.decoder_blocks, model.decoder_norm)
    _projection(decoder.projection, model, model.target_embedding)
    spec = specs.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = float(model.layer_norm_epsilon)
    _special_config(spec.config, special_tokens)
    spec.config.decoder_start_token = special_tokens["bos"]
    spec.config.add_source_eos = True  # the encoder reads pieces + </s>, as in training
    spec.register_source_vocabulary(list(source_tokens))
    spec.register_target_vocabulary(list(target_tokens))
    return spec


def gpt_spec(model, tokens, special_tokens):
    """A ``ctranslate2.specs.TransformerDecoderModelSpec`` holding a ``GPT``'s weights."""
    specs = ctranslate2.specs
    decoder = specs.TransformerDecoderSpec(model.num_layers, model.num_heads,
                                           with_encoder_attention=False,
                                           **_stack_options(model))
    _stack(decoder, model, model.token_embedding, model.positions, model.blocks,
           model.final_norm)
    _projection(decoder.projection, model, model.token_embedding)
    spec = specs.TransformerDecoderModelSpec(decoder)
    spec.config.layer_norm_epsilon = float(model.layer_norm_epsilon)
    _special_config(spec.config, special_tokens)
    spec.register_vocabulary(list(tokens))
    return spec


def _special_config(config, special_tokens):
    config.bos_token = special_tokens["bos"]
    config.eos_token = special_tokens["eos"]
    config.unk_token = special_tokens["unk"]


def vocabulary(tokenizer, size):
    """The token string of each id ``0 .. size - 1`` of ``tokenizer``; ``ValueError`` if two
    ids share a spelling (CTranslate2 looks tokens up by their string)."""
    if tokenizer.vocab_size != size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's "
                         f"vocabulary has {size}")
    tokens = [tokenizer.id_to_token(i) for i in range(size)]
    seen = {}
    for i, token in enumerate(tokens):
        if token in seen:
            raise ValueError(f"ids {seen[token]} and {i} of the vocabulary are both spelled "
                             f"{token!r}: CTranslate2 needs one id per token string")
        seen[token] = i
    return tokens


def special_tokens(tokenizer):
    """``{"pad", "bos", "eos", "unk"}`` -> the tokenizer's spelling of each special id."""
    return {name: tokenizer.id_to_token(getattr(tokenizer, f"{name}_id"))
            for name in ("pad", "bos", "eos", "unk")}


class KerasConverter(ctranslate2.converters.Converter):
    """A CTranslate2 converter for a Keras ``Transformer`` or ``GPT`` of this package:
    ``KerasConverter(model, source_tokenizer, target_tokenizer).convert(out_dir,
    quantization=...)`` (``target_tokenizer`` defaults to the source one: a shared
    vocabulary, or a GPT)."""

    def __init__(self, model, source_tokenizer, target_tokenizer=None):
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer or source_tokenizer

    def _load(self):
        model = self.model
        check_exportable(model)
        if type(model).__name__ == "GPT":
            return gpt_spec(model, vocabulary(self.source_tokenizer, model.vocab_size),
                            special_tokens(self.source_tokenizer))
        return transformer_spec(
            model, vocabulary(self.source_tokenizer, model.source_vocab_size),
            vocabulary(self.target_tokenizer, model.target_vocab_size),
            special_tokens(self.target_tokenizer))


def export_model(model, source_tokenizer, target_tokenizer, out_dir, quantization=None,
                 force=False, tokenizer_files=None, extra_metadata=None):
    """Write ``model`` as a CTranslate2 model directory ``out_dir``, atomically: the model
    is converted into a temporary folder beside ``out_dir`` and renamed onto it, so a
    half-written export never stands under ``out_dir``.

    Args:
        quantization: None (float32 weights as trained) or one of :data:`QUANTIZATIONS`.
        force: replace an existing ``out_dir`` (else ``FileExistsError``).
        tokenizer_files: ``{"source": path, "target": path}`` copied into the directory
            (:func:`tokenizer_file_name`); a GPT has ``source`` only.
        extra_metadata: more keys for :data:`METADATA_FILE`.

    Returns ``out_dir``.
    """
    check_quantization(quantization)
    check_exportable(model)
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and not force:
        raise FileExistsError(f"{out_dir} exists; pass force=True (--force) to replace it")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, dir=parent)
    try:
        KerasConverter(model, source_tokenizer, target_tokenizer).convert(
            tmp, quantization=quantization, force=True)
        for side, path in (tokenizer_files or {}).items():
            shutil.copyfile(path, os.path.join(tmp, tokenizer_file_name(side, path)))
        metadata = {"model": type(model).__name__.lower(), "max_length": model.max_length,
                    "parameters": int(model.count_params()),
                    "weights_sha256": weights_fingerprint(model),
                    "quantization": quantization or "float32",
                    "tokenizers": {side: tokenizer_file_name(side, path)
                                   for side, path in (tokenizer_files or {}).items()},
                    **(extra_metadata or {})}
        with open(os.path.join(tmp, METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2)
        _replace_directory(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _replace_directory(new, target):
    """Rename the finished folder ``new`` onto ``target`` (an old ``target`` is moved aside
    first and removed after)."""
    old = None
    if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, dir=os.path.dirname(
            os.path.abspath(target)))
        os.rmdir(old)
        os.rename(target, old)
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- run directories --------------------------------------------------------------------------
def export_run(run, out_dir=None, quantization=None, force=False):
    """Export a loaded run (``transformerkit.api.Run``) to ``out_dir`` (default
    :func:`default_export_dir`), with its tokenizer files; returns ``out_dir``."""
    from transformerkit.run_directory import RunDirectory

    if run.run_dir is None:
        raise ValueError("this Run has no run directory; give out_dir")
    directory = RunDirectory(run.run_dir)
    out_dir = out_dir or default_export_dir(run.run_dir, quantization)
    source, target = directory.tokenizer_paths(shared=True if run.kind == "gpt" else None)
    files = {"source": source} if run.kind == "gpt" else {"source": source, "target": target}
    model_file = run.weights_file()  # recorded while the weights are still the file's
    return export_model(run.model, run.source_tokenizer, run.target_tokenizer, out_dir,
                        quantization=quantization, force=force, tokenizer_files=files,
                        extra_metadata=file_record(run.run_dir, model_file) if model_file
                        else None)
