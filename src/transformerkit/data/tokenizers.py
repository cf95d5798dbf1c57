"""Tokenizers: subword (BPE / WordPiece / Unigram via the `tokenizers` library) and char.

Every tokenizer here reserves the same four ids, so the models can rely on them: ``<pad>``
0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3 (defined in :mod:`transformerkit.special_tokens`).

Subword pipelines (chosen for exact detokenization, ``decode(encode(t)) == t``):

- ``bpe``: byte-level BPE (GPT-2 style ``ByteLevel`` pre-tokenizer and decoder). Every byte
  is in the alphabet, so any unicode text (accents, emoji, CJK) round-trips exactly and no
  ``<unk>`` is ever produced.
- ``wordpiece``: ``Metaspace`` pre-tokenizer (spaces become ``▁`` and stay inside the
  tokens) + WordPiece model with ``##`` continuations; decoder = WordPiece (no "cleanup",
  which would rewrite e.g. "do not" to "don't") + remove the spaces it joins with +
  Metaspace. Characters never seen in training make their whole word ``<unk>``.
- ``unigram``: ``Metaspace`` pre-tokenizer and decoder (SentencePiece style). Characters
  never seen in training become ``<unk>``.

All subword kinds apply NFKC normalization (and lowercasing when asked), so round trips are
exact modulo those. Text that contains a special token's spelling (e.g. ``"</s>"``) never
yields a special id: it is tokenized as plain text (BPE, WordPiece), or, where the Unigram
model itself holds that spelling as a piece, the piece becomes ``<unk>``.

SentencePiece models (``data.tokenizer: sentencepiece``, a ``.model`` file) are
:mod:`transformerkit.data.sentencepiece_tokenizer`'s; a Marian model's vocabulary is
:mod:`transformerkit.data.marian_vocab`'s. :func:`load_tokenizer` reads every kind.
"""

import json
import pathlib

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from transformerkit.data.marian_vocab import MarianTokenizer
from transformerkit.data.sentencepiece_tokenizer import (
    SentencePieceTokenizer,
    is_sentencepiece_file,
)
from transformerkit.data.tokenizer_base import (  # noqa: F401 (the helpers: public here too)
    METADATA_KEY,
    _flatten,
    _log_training_stats,
    _nonempty_lines,
    _read_json,
    _strip_at_eos,
    _TokenizerBase,
    _write_json,
)
from transformerkit.extras import require
from transformerkit.special_tokens import BOS, EOS, PAD, PAD_ID, SPECIAL_TOKENS, UNK

SUBWORD_KINDS = ("bpe", "wordpiece", "unigram")


class SubwordTokenizer(_TokenizerBase):
    """A `tokenizers.Tokenizer` with our reserved ids, special-token policy and file format.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        kind: "bpe", "wordpiece", "unigram" or "hf" (a loaded Hugging Face tokenizer).
        lowercase: whether the normalizer lowercases (recorded for ``save``/``load``).
        special_ids: optional dict ``pad/bos/eos/unk -> id`` for tokenizers whose ids differ
            from 0..3 (Hugging Face folders); the padding id must be 0 in any case.

    Example:
    >>> tok = SubwordTokenizer.train(["Ein Hund läuft.", "Zwei Hunde laufen."], vocab_size=300)
    >>> tok.decode(tok.encode("Ein Hund läuft.", add_bos=True, add_eos=True))
    'Ein Hund läuft.'
    """

    def __init__(self, tokenizer, kind, lowercase=False, special_ids=None):
        self._tokenizer = tokenizer
        self.kind = kind
        self.lowercase = bool(lowercase)
        for name, i in (special_ids or {}).items():
            setattr(self, f"{name}_id", int(i))
        if self.pad_id != PAD_ID:
            raise ValueError(f"the padding token must have id {PAD_ID} (the models mask id "
                             f"{PAD_ID}), got pad_id={self.pad_id}")
        self.training_stats = {}
        # Spellings of special tokens inside text are plain text, never special tokens.
        self._tokenizer.encode_special_tokens = True

    # ----------------------------------------------------------------------------- train
    @classmethod
    def train(cls, texts, kind="bpe", vocab_size=8000, lowercase=False, min_frequency=2):
        """Train a subword tokenizer on ``texts`` (an iterable of str).

        Empty and whitespace-only lines are skipped (counted in
        ``tokenizer.training_stats["skipped_empty"]``, next to ``["lines"]``).

        Args:
            texts: iterable of str, e.g. the source and target sides of a corpus.
            kind: "bpe" (byte-level), "wordpiece" or "unigram".
            vocab_size: int, target size including the 4 reserved tokens.
            lowercase: bool, lowercase after NFKC normalization.
            min_frequency: int, minimum pair frequency for a BPE/WordPiece merge.
        """
        if kind not in SUBWORD_KINDS:
            raise ValueError(f"kind must be one of {SUBWORD_KINDS}, got {kind!r}")
        if int(vocab_size) <= len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
        specials = list(SPECIAL_TOKENS)
        common = dict(vocab_size=int(vocab_size), special_tokens=specials, show_progress=False)
        if kind == "bpe":
            tokenizer = Tokenizer(models.BPE(unk_token=UNK))
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tokenizer.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(min_frequency=min_frequency,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                          **common)
        elif kind == "wordpiece":
            tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
            tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
            tokenizer.decoder = decoders.Sequence([
                decoders.WordPiece(prefix="##", cleanup=False),  # "##" off, " " between words
                decoders.Replace(" ", ""),  # real spaces are "▁" here; drop the joining ones
                decoders.Metaspace()])
            trainer = trainers.WordPieceTrainer(min_frequency=min_frequency, **common)
        else:
            tokenizer = Tokenizer(models.Unigram())
            tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
            tokenizer.decoder = decoders.Metaspace()
            trainer = trainers.UnigramTrainer(unk_token=UNK, **common)
        steps = [normalizers.NFKC()] + [normalizers.Lowercase()] * bool(lowercase)
        tokenizer.normalizer = normalizers.Sequence(steps)

        stats = {"lines": 0, "skipped_empty": 0}
        tokenizer.train_from_iterator(_nonempty_lines(texts, stats), trainer)
        _log_training_stats(f"SubwordTokenizer({kind})", stats)
        got = [tokenizer.token_to_id(t) for t in specials]
        if got != list(range(len(specials))):  # a guard on the library, not a user error
            raise RuntimeError(f"reserved tokens {specials} got ids {got}, expected 0..3")
        result = cls(tokenizer, kind=kind, lowercase=lowercase)
        result.training_stats = stats
        return result

    # ---------------------------------------------------------------------- properties
    @property
    def vocab_size(self):
        """Number of ids (reserved tokens included); valid ids are ``0 .. vocab_size-1``."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def backend_tokenizer(self):
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tokenizer

    # ------------------------------------------------------------------- encode/decode
    def encode(self, text, add_bos=False, add_eos=False):
        """Text -> list of int ids (``[bos] + pieces + [eos]`` as asked)."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return self._with_specials(ids, add_bos, add_eos)

    def encode_batch(self, texts, add_bos=False, add_eos=False):
        """List of texts -> list of id lists, encoded in parallel by the Rust library."""
        texts = list(texts)
        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        encodings = encode(texts, add_special_tokens=False)  # fast: no offsets (>= 0.21)
        return [self._with_specials(e.ids, add_bos, add_eos) for e in encodings]

    def encode_batch_flat(self, texts, add_bos=False, add_eos=False):
        """:meth:`_TokenizerBase.encode_batch_flat` without a Python list per sequence: the
        Rust library encodes in parallel, NumPy places the special ids."""
        texts = list(texts)
        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        pieces, lengths = _flatten([e.ids for e in encode(texts, add_special_tokens=False)])
        reserved = np.isin(pieces, [self.pad_id, self.bos_id, self.eos_id])
        pieces[reserved] = self.unk_id  # as _with_specials: reserved ids in text are UNK
        extra = int(bool(add_bos)) + int(bool(add_eos))
        if not extra:
            return pieces, lengths
        out_lengths = lengths + extra
        ends = np.cumsum(out_lengths)  # (n,)
        ids = np.empty(int(ends[-1]) if len(ends) else 0, dtype="int32")
        is_piece = np.ones(len(ids), dtype=bool)
        if add_bos:
            ids[ends - out_lengths] = self.bos_id
            is_piece[ends - out_lengths] = False
        if add_eos:
            ids[ends - 1] = self.eos_id
            is_piece[ends - 1] = False
        ids[is_piece] = pieces
        return ids, out_lengths

    def tokenize(self, text):
        """Text -> list of subword strings (as stored in the vocabulary)."""
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def id_to_token(self, i):
        token = self._tokenizer.id_to_token(int(i))
        if token is None:
            raise ValueError(f"id {i} is outside the vocabulary (size {self.vocab_size})")
        return token

    def token_to_id(self, s):
        return self._tokenizer.token_to_id(s)

    def decode(self, ids):
        """Ids -> text. Stops at the first EOS; drops PAD and BOS; ``<unk>`` stays visible."""
        kept = _strip_at_eos(ids, self.eos_id, {self.pad_id, self.bos_id})
        return self._tokenizer.decode(kept, skip_special_tokens=False)

    def decode_batch(self, batch):
        kept = [_strip_at_eos(ids, self.eos_id, {self.pad_id, self.bos_id}) for ids in batch]
        return self._tokenizer.decode_batch(kept, skip_special_tokens=False)

    # ------------------------------------------------------------------------ save/load
    def _metadata(self):
        return {"type": "subword", "kind": self.kind, "lowercase": self.lowercase,
                "special_ids": {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id,
                                "unk": self.unk_id}}

    def save(self, path):
        """Write one json file: the `tokenizers` json plus our ``"transformerkit"`` key."""
        payload = json.loads(self._tokenizer.to_str())
        payload[METADATA_KEY] = self._metadata()
        _write_json(path, payload)

    @classmethod
    def load(cls, path):
        """Load a file written by :meth:`save` (or a plain `tokenizers` json file)."""
        return cls._from_payload(_read_json(path), path)

    @classmethod
    def _from_payload(cls, payload, path):
        meta = payload.pop(METADATA_KEY, None) or {}
        if meta.get("type", "subword") != "subword":
            raise ValueError(f"{path} holds a {meta.get('type')!r} tokenizer, not a subword one;"
                             " use load_tokenizer()")
        try:
            tokenizer = Tokenizer.from_str(json.dumps(payload))
        except Exception as e:  # the Rust library raises a bare Exception
            raise ValueError(f"tokenizer file {path} is corrupt: {e}") from e
        special_ids = meta.get("special_ids") or _special_ids_from_vocab(tokenizer, path)
        return cls(tokenizer, kind=meta.get("kind", "hf"), lowercase=meta.get("lowercase", False),
                   special_ids=special_ids)


def _special_ids_from_vocab(tokenizer, path, names=None):
    """Find pad/bos/eos/unk ids in a foreign tokenizer (ours first, then BERT/HF spellings)."""
    candidates = {"pad": [PAD, "[PAD]"], "bos": [BOS, "[CLS]", "<bos>", "<|startoftext|>"],
                  "eos": [EOS, "[SEP]", "<eos>", "<|endoftext|>"], "unk": [UNK, "[UNK]"]}
    for key, token in (names or {}).items():
        candidates[key].insert(0, token)
    ids = {}
    for key, spellings in candidates.items():
        found = [tokenizer.token_to_id(s) for s in spellings if s]
        found = [i for i in found if i is not None]
        if not found:
            raise ValueError(f"tokenizer {path} has no {key} token (tried {spellings})")
        ids[key] = found[0]
    return ids


class CharTokenizer(_TokenizerBase):
    """One id per character: the 4 reserved ids, then the training characters sorted.

    No normalization is applied (nanoGPT's shakespeare_char recipe); characters never seen
    in training map to ``unk_id``. Newlines are ordinary characters.

    Example:
    >>> tok = CharTokenizer.train(["hello"])
    >>> tok.vocab_size, tok.encode("hole")
    (8, [5, 7, 6, 4])
    """

    kind = "char"

    def __init__(self, chars):
        chars = list(chars)
        bad = [c for c in chars if len(c) != 1]
        if bad or len(set(chars)) != len(chars):
            raise ValueError(f"chars must be distinct single characters, got {bad or chars!r:.80}")
        self._chars = list(SPECIAL_TOKENS) + chars
        self._index = {c: i for i, c in enumerate(chars, start=len(SPECIAL_TOKENS))}
        self.training_stats = {}

    @classmethod
    def train(cls, texts):
        """Build the vocabulary from the characters of ``texts`` (empty lines skipped)."""
        stats = {"lines": 0, "skipped_empty": 0}
        chars = set()
        for text in _nonempty_lines(texts, stats):
            chars.update(text)
        _log_training_stats("CharTokenizer", stats)
        result = cls(sorted(chars))
        result.training_stats = stats
        return result

    @property
    def vocab_size(self):
        return len(self._chars)

    def encode(self, text, add_bos=False, add_eos=False):
        ids = [self._index.get(c, self.unk_id) for c in text]
        return self._with_specials(ids, add_bos, add_eos)

    def encode_batch(self, texts, add_bos=False, add_eos=False):
        return [self.encode(t, add_bos, add_eos) for t in texts]

    def tokenize(self, text):
        return [c if c in self._index else UNK for c in text]

    def id_to_token(self, i):
        i = int(i)
        if not 0 <= i < len(self._chars):
            raise ValueError(f"id {i} is outside the vocabulary (size {self.vocab_size})")
        return self._chars[i]

    def token_to_id(self, s):
        if s in SPECIAL_TOKENS:
            return SPECIAL_TOKENS.index(s)
        return self._index.get(s)

    def decode(self, ids):
        """Ids -> text. Stops at the first EOS; drops PAD and BOS; unknown shows ``<unk>``."""
        kept = _strip_at_eos(ids, self.eos_id, {self.pad_id, self.bos_id})
        return "".join(self._chars[i] for i in kept)

    def save(self, path):
        """Write one json file ``{"transformerkit": {...}, "chars": [...]}`` atomically."""
        _write_json(path, {METADATA_KEY: {"type": "char"},
                           "chars": self._chars[len(SPECIAL_TOKENS):]})

    @classmethod
    def load(cls, path):
        return cls._from_payload(_read_json(path), path)

    @classmethod
    def _from_payload(cls, payload, path):
        meta = payload.get(METADATA_KEY) or {}
        chars = payload.get("chars")
        if meta.get("type") != "char" or not isinstance(chars, list):
            raise ValueError(f"{path} is not a CharTokenizer file (no 'chars' list)")
        try:
            return cls(chars)
        except ValueError as e:
            raise ValueError(f"tokenizer file {path} is corrupt: {e}") from e


def load_tokenizer(path):
    """Load any tokenizer file written by ``save``: a SentencePiece ``.model`` (or ``.spm``)
    file by its name, a json file by its content."""
    if is_sentencepiece_file(path):
        return SentencePieceTokenizer.load(path)
    payload = _read_json(path)
    kind = (payload.get(METADATA_KEY) or {}).get("type")
    if kind == "char":
        return CharTokenizer._from_payload(payload, path)
    if kind == "marian":
        return MarianTokenizer._from_payload(payload, path)
    if kind == "subword" or "model" in payload:
        return SubwordTokenizer._from_payload(payload, path)
    raise ValueError(f"{path} is neither a transformerkit tokenizer file nor a `tokenizers` "
                     "json file")


def load_hf_tokenizer(folder):
    """Wrap a local Hugging Face tokenizer folder as a :class:`SubwordTokenizer`.

    Uses ``folder/tokenizer.json`` directly; only a folder without it (a "slow" tokenizer,
    e.g. just ``vocab.txt``) needs the optional ``transformers`` package to convert it. The
    special ids come from ``special_tokens_map.json`` / ``tokenizer_config.json`` when
    present, else from the usual spellings ([PAD], [CLS], [SEP], [UNK] ...). The padding
    id must be 0, as the models mask id 0.
    """
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Hugging Face tokenizer folder not found: {folder}")
    if (folder / "source.spm").is_file() and not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{folder} is a Marian tokenizer folder (source.spm, target.spm, "
                         "vocab.json): its ids (</s> 0, <unk> 1, <pad> last) are a Marian "
                         "model's, not those of a model trained here (<pad> 0); "
                         "transformerkit.data.load_marian_tokenizers reads it")
    names = _hf_special_token_names(folder)
    if (folder / "tokenizer.json").is_file():
        try:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:
            raise ValueError(f"{folder / 'tokenizer.json'} is corrupt: {e}") from e
    else:
        transformers = require("transformers", f"{folder} has no tokenizer.json: converting "
                                               "its slow tokenizer")
        hf = transformers.AutoTokenizer.from_pretrained(str(folder), use_fast=True)
        tokenizer = hf.backend_tokenizer
    # Our batching pads (with id 0) and models refuse over-long input themselves; a padding
    # or truncation setting stored in tokenizer.json (e.g. "pad to 128") would silently
    # change every encoding, and transformers' AutoTokenizer ignores it too.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    special_ids = _special_ids_from_vocab(tokenizer, folder, names)
    return SubwordTokenizer(tokenizer, kind="hf", special_ids=special_ids)


def _hf_special_token_names(folder):
    """``{"pad": "[PAD]", ...}`` from the folder's config files (missing files are fine)."""
    names = {}
    aliases = {"pad": ("pad_token",), "bos": ("bos_token", "cls_token"),
               "eos": ("eos_token", "sep_token"), "unk": ("unk_token",)}
    for filename in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / filename
        if not path.is_file():
            continue
        config = _read_json(path)
        for key, fields in aliases.items():
            for field in fields:
                value = config.get(field)
                value = value.get("content") if isinstance(value, dict) else value
                if isinstance(value, str) and key not in names:
                    names[key] = value
    return names
