"""Pretrained token vectors in the word2vec/GloVe text format, and tokenizers over them.

The text format is one token per line followed by its ``dim`` numbers, separated by
spaces::

    7 4                     <- optional header "count dim" (word2vec, fastText .vec)
    the 0.418 0.24968 -0.41242 0.1217
    ,   0.013441 0.23682 -0.16899 0.40951
    ...

GloVe's ``.txt`` files have no header; word2vec's and fastText's ``.vec`` have one. The
subword vectors that byte-pair embedding packages ship (BPEmb's ``.txt``/``.vec``) are the
same format with SentencePiece pieces as tokens (``▁the``, ``s``, ``▁``). ``.gz`` files are
read as they are. The files list tokens by falling frequency, so ``limit`` keeps the most
frequent ones.

:func:`vocabulary_tokenizer` builds the tokenizer whose ids are the rows of a
:class:`Vectors`: the four reserved tokens (:mod:`transformerkit.special_tokens`) at ids
0-3, then the file's tokens in file order. :func:`aligned_matrix` lays the vectors out in
that id order; rows the file lacks (the reserved tokens, unless the file has vectors for
``<s>``, ``</s>``, ``<unk>``) are NaN, which the models' embedding layers read as "keep
your own initial value" (``layers.embeddings.TokenEmbedding``).

Words or pieces:

- ``words``: a ``tokenizers`` ``WordLevel`` model behind a whitespace + punctuation
  pre-tokenizer (each punctuation mark is a token, as in GloVe's and word2vec's corpora);
  unknown words are ``<unk>``. Decoding joins the words with spaces, so ``decode(encode(t))``
  gives ``t`` with a space around each punctuation mark.
- ``pieces`` (SentencePiece spellings, ``▁`` marks a word start): BPEmb segments with its
  SentencePiece BPE model, which the vectors file does not contain. The pieces alone are
  turned into a ``tokenizers`` ``Unigram`` model whose piece scores fall with the file
  order (``-log(rank + 2)``, a Zipf frequency guess); Viterbi then picks, per word, the
  segmentation of highest total score. That is usually SentencePiece's segmentation (few,
  frequent pieces) but not always; the ids always match the rows, and characters outside
  the pieces become ``<unk>`` one at a time. Decoding is exact (``Metaspace``).
- ``auto`` (default): ``pieces`` when at least a tenth of the tokens start with ``▁``.
"""

import gzip
import logging
import math
import os
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from transformerkit.special_tokens import SPECIAL_TOKENS, UNK, UNK_ID

TOKEN_KINDS = ("auto", "words", "pieces")
WORD_START = "\u2581"  # "▁", SentencePiece's word-start mark

log = logging.getLogger("transformerkit")


@dataclass
class Vectors:
    """The tokens of a vectors file, in file order, and their ``(len(tokens), dim)``
    float32 matrix."""

    tokens: list
    matrix: np.ndarray
    path: str = ""

    @property
    def dim(self):
        return int(self.matrix.shape[1])

    def token_kind(self):
        """``pieces`` if at least a tenth of the tokens start with ``▁``, else ``words``."""
        starts = sum(t.startswith(WORD_START) for t in self.tokens)
        return "pieces" if starts * 10 >= len(self.tokens) else "words"


def _open_text(path):
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    if gzipped:
        return gzip.open(path, "rt", encoding="utf-8", errors="strict")
    return open(path, encoding="utf-8", errors="strict")


def _header(fields):
    """``(count, dim)`` if the split first line is a word2vec header, else None."""
    if len(fields) == 2 and all(f.isdigit() for f in fields):
        return int(fields[0]), int(fields[1])
    return None


def read_vectors(path, limit=None):
    """Read a word2vec/GloVe text file (optionally gzipped) -> :class:`Vectors`.

    Args:
        path: the file; a ``"count dim"`` first line is recognised and checked.
        limit: keep only the first ``limit`` tokens (the most frequent); None: all.

    A token given twice keeps its first vector (logged). Raises FileNotFoundError for a
    missing file and ValueError (with the line number) for a line that does not hold a
    token and ``dim`` numbers, or for an empty file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"vectors file not found: {path}")
    if limit is not None and int(limit) < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    tokens, rows, seen, duplicates = [], [], set(), 0
    dim = declared = None
    try:
        with _open_text(path) as lines:
            for number, line in enumerate(lines, start=1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                if dim is None:
                    header = _header(line.split())
                    if header is not None and number == 1:
                        declared, dim = header
                        continue
                    dim = len(line.rstrip().split(" ")) - 1
                    if dim < 1:
                        raise ValueError(f"{path}:{number}: expected a token and its numbers, "
                                         f"got {line[:60]!r}")
                # The token may hold spaces (some GloVe files): the numbers are the last dim.
                fields = line.rstrip().rsplit(" ", dim)
                if len(fields) != dim + 1 or not fields[0]:
                    raise ValueError(f"{path}:{number}: expected a token and {dim} numbers, got "
                                     f"{len(fields) - 1} fields: {line[:60]!r}")
                try:
                    row = np.asarray(fields[1:], dtype=np.float32)
                except ValueError as err:
                    raise ValueError(f"{path}:{number}: {err} in {line[:60]!r}") from None
                token = fields[0]
                if token in seen:
                    duplicates += 1
                    continue
                seen.add(token)
                tokens.append(token)
                rows.append(row)
                if limit is not None and len(tokens) >= limit:
                    break
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (a binary word2vec file? convert it to "
                         f"the text format): {err}") from None
    except (OSError, EOFError) as err:  # e.g. a truncated .gz
        raise ValueError(f"cannot read vectors file {path}: {err}") from None
    if not tokens:
        raise ValueError(f"vectors file {path} holds no vectors")
    if declared is not None and limit is None and declared != len(tokens) + duplicates:
        log.warning("%s: header announces %d vectors, the file holds %d", path, declared,
                    len(tokens) + duplicates)
    if duplicates:
        log.warning("%s: %d repeated tokens kept their first vector", path, duplicates)
    return Vectors(tokens, np.stack(rows), path)


def vocabulary(vectors):
    """The tokenizer vocabulary: the reserved tokens at ids 0-3, then the file's other
    tokens in file order."""
    reserved = set(SPECIAL_TOKENS)
    return list(SPECIAL_TOKENS) + [t for t in vectors.tokens if t not in reserved]


def aligned_matrix(vectors, tokenizer):
    """``(tokenizer.vocab_size, dim)`` float32: row ``i`` is the vector of token ``i``; rows
    of tokens the file lacks are NaN (the model initialises them its own way).

    Raises ValueError if the tokenizer lacks one of the file's tokens (it was not built by
    :func:`vocabulary_tokenizer` from these vectors)."""
    matrix = np.full((tokenizer.vocab_size, vectors.dim), np.nan, dtype=np.float32)
    for row, token in zip(vectors.matrix, vectors.tokens, strict=True):
        i = tokenizer.token_to_id(token)
        if i is None:
            raise ValueError(f"the tokenizer has no id for {token!r} of {vectors.path}; "
                             "build it with vocabulary_tokenizer from the same file")
        matrix[i] = row
    return matrix


def vocabulary_tokenizer(vectors, tokens="auto", lowercase=False):
    """A ``tokenizers.Tokenizer`` whose ids are :func:`vocabulary` (see the module
    docstring for ``tokens``: words, pieces or auto). ``lowercase`` adds a lowercasing
    normalizer (for lowercased vectors such as GloVe's 6B)."""
    if tokens not in TOKEN_KINDS:
        raise ValueError(f"tokens must be one of {TOKEN_KINDS}, got {tokens!r}")
    if tokens == "auto":
        tokens = vectors.token_kind()
    vocab = vocabulary(vectors)
    if tokens == "words":
        tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)},
                                               unk_token=UNK))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("isolated")])
    else:
        # Scores fall with the file order (a Zipf guess); the reserved tokens never match
        # text (encode_special_tokens keeps their spellings plain text).
        scores = [(t, 0.0 if i < len(SPECIAL_TOKENS) else -math.log(i - len(SPECIAL_TOKENS) + 2))
                  for i, t in enumerate(vocab)]
        tokenizer = Tokenizer(models.Unigram(scores, unk_id=UNK_ID, byte_fallback=False))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
    steps = [normalizers.NFKC()] + [normalizers.Lowercase()] * bool(lowercase)
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    got = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    if got != list(range(len(SPECIAL_TOKENS))):  # a guard on the library
        raise RuntimeError(f"reserved tokens got ids {got}, expected 0..3")
    return tokenizer, tokens


EMBEDDING_SIDES = ("source", "target", "shared")
_ENTRY_KEYS = {"file": str, "tokens": str, "limit": int}


def embedding_files(value, where="model.embeddings"):
    """Check a run config's ``model.embeddings`` and normalise it: ``{side: {"file": PATH,
    "tokens": auto|words|pieces, "limit": int or None}}`` for the sides it names (``source``,
    ``target``, or ``shared``: one vocabulary for both). A side may be given as just the
    path. ``{}`` for None. Raises ValueError naming the key."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{where} must be a mapping of source, target or shared to a vectors "
                         f"file (or to {{file, tokens, limit}}), got {value!r}")
    unknown = set(value) - set(EMBEDDING_SIDES)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(map(str, unknown))}; allowed: "
                         f"{', '.join(EMBEDDING_SIDES)} (trainability: model."
                         "source_embeddings_trainable, target_embeddings_trainable, "
                         "embeddings_trainable, projection_trainable)")
    if "shared" in value and len(value) > 1:
        raise ValueError(f"{where}: shared is one vocabulary for source and target; give either "
                         "shared or source/target, not both")
    files = {}
    for side, entry in value.items():
        entry = {"file": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or "file" not in entry:
            raise ValueError(f"{where}.{side} must be a path or a mapping with file, got "
                             f"{entry!r}")
        for key, item in entry.items():
            if key not in _ENTRY_KEYS:
                raise ValueError(f"{where}.{side}: unknown key {key!r}; allowed: "
                                 f"{', '.join(_ENTRY_KEYS)}")
            if item is not None and (not isinstance(item, _ENTRY_KEYS[key])
                                     or isinstance(item, bool)):
                raise ValueError(f"{where}.{side}.{key} must be a {_ENTRY_KEYS[key].__name__}, "
                                 f"got {item!r}")
        tokens, limit = entry.get("tokens") or "auto", entry.get("limit")
        if tokens not in TOKEN_KINDS:
            raise ValueError(f"{where}.{side}.tokens must be one of {TOKEN_KINDS}, got "
                             f"{tokens!r}")
        if limit is not None and limit < 1:
            raise ValueError(f"{where}.{side}.limit must be positive, got {limit}")
        files[side] = {"file": entry["file"], "tokens": tokens, "limit": limit}
    return files
