"""Data: tokenizers, corpora and batch pipelines.

>>> from transformerkit.data import (SubwordTokenizer, TranslationBatches, encode_pairs,
...                                  load_multi30k)
>>> src, tgt = load_multi30k("train", "de", "en")
>>> tok = SubwordTokenizer.train(src + tgt, vocab_size=8000)
>>> batches = TranslationBatches(encode_pairs(src, tgt, tok, tok, 128), tokens_per_batch=4096)
"""

from transformerkit.data.corpora import (
    LANGS,
    ChecksumError,
    load_multi30k,
    load_ted_hrlr,
    load_text,
    read_lines,
    read_parallel,
    read_tsv,
    resolve_data_dir,
)
from transformerkit.data.marian_vocab import MarianTokenizer, load_marian_tokenizers
from transformerkit.data.pipeline import (
    EncodedPairs,
    EpochSync,
    LanguageModelBatches,
    TranslationBatches,
    encode_pairs,
    pad_batch,
    split_train_val,
    teacher_forcing,
)
from transformerkit.data.sentencepiece_tokenizer import SentencePieceTokenizer
from transformerkit.data.tokenizers import (
    CharTokenizer,
    SubwordTokenizer,
    load_hf_tokenizer,
    load_tokenizer,
)
from transformerkit.special_tokens import BOS, EOS, PAD, UNK

__all__ = [
    "BOS", "EOS", "LANGS", "PAD", "UNK", "CharTokenizer", "ChecksumError", "EncodedPairs",
    "EpochSync", "LanguageModelBatches", "MarianTokenizer", "SentencePieceTokenizer",
    "SubwordTokenizer", "TranslationBatches", "encode_pairs", "load_hf_tokenizer",
    "load_marian_tokenizers", "load_multi30k", "load_ted_hrlr",
    "load_text", "load_tokenizer", "pad_batch", "read_lines", "read_parallel", "read_tsv",
    "resolve_data_dir", "split_train_val", "teacher_forcing",
]
