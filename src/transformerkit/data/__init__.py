"""Data: tokenizers, corpora and batch pipelines.

>>> from transformerkit.data import (SubwordTokenizer, TranslationBatches, encode_pairs,
...                                  load_multi30k)
>>> src, tgt = load_multi30k("train", "de", "en")
>>> tok = SubwordTokenizer.train(src + tgt, vocab_size=8000)
>>> batches = TranslationBatches(encode_pairs(src, tgt, tok, tok, 128), tokens_per_batch=4096)
"""

import importlib

# name -> the module that defines it; resolved on first use, so that importing one module
# of this package (the tokenizers, to translate with an engine that needs no Keras model)
# does not import the batch pipelines, which need Keras
_EXPORTS = {
    **dict.fromkeys(("LANGS", "ChecksumError", "load_multi30k", "load_ted_hrlr", "load_text",
                     "read_lines", "read_parallel", "read_tsv", "resolve_data_dir"),
                    "corpora"),
    "MarianTokenizer": "marian_vocab", "load_marian_tokenizers": "marian_vocab",
    **dict.fromkeys(("EncodedPairs", "EpochSync", "LanguageModelBatches",
                     "TranslationBatches", "encode_pairs", "split_train_val",
                     "teacher_forcing"), "pipeline"),
    "pad_batch": "padding",
    "SentencePieceTokenizer": "sentencepiece_tokenizer",
    **dict.fromkeys(("CharTokenizer", "SubwordTokenizer", "load_hf_tokenizer",
                     "load_tokenizer"), "tokenizers"),
    **dict.fromkeys(("BOS", "EOS", "PAD", "UNK"), "special_tokens"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        module = _EXPORTS[name]
        package = "transformerkit" if module == "special_tokens" else __name__
        return getattr(importlib.import_module(f"{package}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
