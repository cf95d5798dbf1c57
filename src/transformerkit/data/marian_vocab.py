"""The vocabulary of a Marian / OPUS-MT model: ``source.spm`` + ``target.spm`` + ``vocab.json``.

A Hugging Face ``MarianMTModel`` folder tokenizes with two SentencePiece models and maps
their pieces to the model's ids with a json table (``transformers``' ``MarianTokenizer``):

- ``vocab.json``: piece -> id, one table for both sides (OPUS-MT); with
  ``"separate_vocabs": true`` in ``tokenizer_config.json`` (the Tatoeba-Challenge models)
  ``vocab.json`` is the source side's and ``target_vocab.json`` the target side's;
- Marian's layout of the ids: ``</s>`` 0, ``<unk>`` 1, the pieces, and ``<pad>`` last
  (``vocab_size - 1``, added by the converter). Marian has no BOS: the decoder starts with
  the pad id (``decoder_start_token_id``), which :attr:`MarianTokenizer.bos_id` therefore
  is, so ``encode(..., add_bos=True)`` gives a decoder input as ``transformers`` builds it.

Encoding (as ``MarianTokenizer``): a leading language code such as ``>>fra<<`` is one
piece; the rest is segmented by the side's SentencePiece model (the `sentencepiece`
package); a piece missing from the table is ``<unk>``; the source gets ``</s>`` appended
(``add_eos=True``). Decoding (as ``MarianTokenizer.decode(ids, skip_special_tokens=True)``):
ids up to the first ``</s>``, without ``<pad>`` and ``<unk>``, joined by the side's
SentencePiece model. Unlike ``MarianTokenizer``, the spelling of a special token inside
text (``"</s>"``) is plain text here, never a special id (the policy of every tokenizer of
this package).

Each side is one :class:`MarianTokenizer` (a model's source and target tokenizers), saved
in a run directory as one json file holding its table and its SentencePiece model.
"""

import base64
import json
import pathlib

from transformerkit.data.sentencepiece_tokenizer import load_processor
from transformerkit.data.tokenizer_base import (
    METADATA_KEY,
    _read_json,
    _TokenizerBase,
    _write_json,
)

SPIECE_UNDERLINE = "\u2581"
BOS_PIECE = "<s>"  # the decoder start of a renumbered vocabulary
FILES = {"source_spm": "source.spm", "target_spm": "target.spm", "vocab": "vocab.json",
         "target_vocab": "target_vocab.json", "config": "tokenizer_config.json"}
SIDES = ("source", "target")


class MarianTokenizer(_TokenizerBase):
    """One side of a Marian vocabulary: a SentencePiece model and the piece -> id table.

    Args:
        proto: the side's SentencePiece model (the bytes of ``source.spm`` / ``target.spm``).
        vocab: dict piece -> id, ids ``0 .. len(vocab) - 1``.
        side: "source" or "target" (recorded; what the file is for).
        special_tokens: the spellings of ``pad``, ``eos``, ``unk`` (Marian's by default).
        path: where it came from, for error messages.
    """

    kind = "marian"

    def __init__(self, proto, vocab, side="source", special_tokens=None, path=None):
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        where = path or "the Marian vocabulary"
        self._proto = bytes(proto)
        self._sp = load_processor(path, self._proto)
        self.side = side
        self._vocab = _checked_vocab(vocab, where)
        self._pieces = [None] * len(self._vocab)
        for piece, i in self._vocab.items():
            self._pieces[i] = piece
        self.special_tokens = {"pad": "<pad>", "eos": "</s>", "unk": "<unk>",
                               **(special_tokens or {})}
        for name, token in self.special_tokens.items():
            if token not in self._vocab:
                raise ValueError(f"{where} has no {name} token {token!r} in its vocabulary")
            setattr(self, f"{name}_id", self._vocab[token])
        if "bos" not in self.special_tokens:
            self.bos_id = self.pad_id  # no BOS in Marian: the decoder starts with the pad id
        self.training_stats = {}

    @property
    def decoder_start_id(self):
        """The first decoder input: Marian's ``decoder_start_token_id`` (the pad id), or
        ``<s>`` after :meth:`renumbered`."""
        return self.bos_id

    @property
    def model_ids(self):
        """True after :meth:`renumbered`: the ids are a model's of this package (``<pad>``
        0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3), not the checkpoint's."""
        return "bos" in self.special_tokens

    def renumbered(self, rows):
        """This side with the ids of an imported model (``MarianIds``): ``rows[i]`` is the
        Marian id that becomes id ``i``; ``rows[:4]`` are Marian's pad, decoder start, eos
        and unk. Id 1 becomes a piece of its own, ``<s>`` (the decoder start); every other
        piece keeps its segmentation. The result encodes and decodes exactly as this side,
        in the model's ids."""
        if self.model_ids:
            raise ValueError("this Marian vocabulary is already renumbered")
        rows = [int(r) for r in rows]
        expected = [self.pad_id, self.eos_id, self.unk_id]
        if len(rows) != self.vocab_size + 1 or [rows[0], rows[2], rows[3]] != expected:
            raise ValueError(f"rows ({len(rows)}) must hold pad, start, eos, unk, then the "
                             f"other ids of this vocabulary ({self.vocab_size} ids)")
        start = BOS_PIECE
        while start in self._vocab:  # a vocabulary that has "<s>" as a piece of text
            start = "<" + start
        vocab = {self._pieces[marian]: ours for ours, marian in enumerate(rows) if ours != 1}
        vocab[start] = 1
        return MarianTokenizer(self._proto, vocab, side=self.side,
                               special_tokens={**self.special_tokens, "bos": start})

    @property
    def vocab_size(self):
        return len(self._pieces)

    @property
    def processor(self):
        """The side's ``sentencepiece.SentencePieceProcessor``."""
        return self._sp

    @property
    def serialized_model(self):
        """The bytes of the side's SentencePiece model (``source.spm`` / ``target.spm``)."""
        return self._proto

    @property
    def vocab(self):
        """A copy of the piece -> id table."""
        return dict(self._vocab)

    # ------------------------------------------------------------------- encode/decode
    def tokenize(self, text):
        """Text -> pieces: a leading ``>>code<<``, then the SentencePiece segmentation."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}: {text!r:.60}")
        code, text = _split_code(text)
        return code + self._sp.encode(text, out_type=str)

    def encode(self, text, add_bos=False, add_eos=False):
        """Text -> ids; pieces missing from the table are ``unk_id``. A source for the
        model: ``add_eos=True``; a decoder input: ``add_bos=True`` (the pad id first)."""
        unk = self.unk_id
        ids = [self._vocab.get(piece, unk) for piece in self.tokenize(text)]
        return self._with_specials(ids, add_bos, add_eos)

    def encode_batch(self, texts, add_bos=False, add_eos=False):
        """List of texts -> list of id lists (SentencePiece segments them all in one call)."""
        texts = list(texts)
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"text must be a str, got {type(text).__name__}: {text!r:.60}")
        codes, rests = zip(*map(_split_code, texts), strict=True) if texts else ((), ())
        unk = self.unk_id
        return [self._with_specials([self._vocab.get(p, unk) for p in code + pieces],
                                    add_bos, add_eos)
                for code, pieces in zip(codes, self._sp.encode(list(rests), out_type=str),
                                        strict=True)]

    def id_to_token(self, i):
        i = int(i)
        if not 0 <= i < len(self._pieces):
            raise ValueError(f"id {i} is outside the vocabulary (size {self.vocab_size})")
        return self._pieces[i]

    def token_to_id(self, s):
        return self._vocab.get(s)

    def decode(self, ids):
        """Ids -> text: up to the first ``</s>``, without ``<pad>`` and ``<unk>``, joined by
        the side's SentencePiece model (``MarianTokenizer.decode(ids,
        skip_special_tokens=True)``)."""
        pieces = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.unk_id, self.bos_id):
                pieces.append(self.id_to_token(i))
        return self._sp.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip()

    # ------------------------------------------------------------------------ save/load
    def save(self, path):
        """One json file: the table, the special tokens and the SentencePiece model
        (base64), so a run directory holds all its vocabulary needs."""
        _write_json(path, {METADATA_KEY: {"type": "marian", "side": self.side,
                                          "special_tokens": self.special_tokens},
                           "vocab": self._vocab,
                           "sentencepiece": base64.b64encode(self._proto).decode("ascii")})

    @classmethod
    def load(cls, path):
        return cls._from_payload(_read_json(path), path)

    @classmethod
    def _from_payload(cls, payload, path):
        meta = payload.get(METADATA_KEY) or {}
        if meta.get("type") != "marian" or not isinstance(payload.get("vocab"), dict) or \
                not isinstance(payload.get("sentencepiece"), str):
            raise ValueError(f"{path} is not a Marian vocabulary file")
        try:
            proto = base64.b64decode(payload["sentencepiece"], validate=True)
        except ValueError as e:
            raise ValueError(f"tokenizer file {path} is corrupt: {e}") from e
        return cls(proto, payload["vocab"], side=meta.get("side", "source"),
                   special_tokens=meta.get("special_tokens"), path=path)


def _split_code(text):
    """``([">>fra<<"], rest)`` for a text that starts with a language code, else
    ``([], text)`` (``MarianTokenizer.remove_language_code``)."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return [text[:end + 2]], text[end + 2:]
    return [], text


def _checked_vocab(vocab, where):
    """``vocab`` as ``{str: int}`` with the ids ``0 .. len - 1`` once each, else ValueError."""
    if not isinstance(vocab, dict) or not vocab:
        raise ValueError(f"{where}: the vocabulary must be a non-empty piece -> id mapping")
    table = {}
    for piece, i in vocab.items():
        if not isinstance(piece, str) or isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"{where}: vocabulary entry {piece!r}: {i!r} is not piece -> id")
        table[piece] = i
    ids = sorted(table.values())
    if ids != list(range(len(ids))):
        missing = sorted(set(range(len(ids))) - set(ids))[:3]
        raise ValueError(f"{where}: the vocabulary ids must be 0 .. {len(ids) - 1}, each "
                         f"once (missing {missing or 'none'}, largest {ids[-1]})")
    return table


def load_marian_tokenizers(folder):
    """The ``(source, target)`` :class:`MarianTokenizer` of a Hugging Face Marian folder
    (``source.spm``, ``target.spm``, ``vocab.json``, optionally ``target_vocab.json`` and
    ``tokenizer_config.json`` with ``separate_vocabs``, ``pad_token``, ``eos_token``,
    ``unk_token``)."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Marian tokenizer folder not found: {folder}")
    missing = [FILES[k] for k in ("source_spm", "target_spm", "vocab")
               if not (folder / FILES[k]).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a Marian tokenizer folder: no "
                                f"{', '.join(missing)}")
    config_path = folder / FILES["config"]
    config = _read_json(config_path) if config_path.is_file() else {}
    specials = {}
    for name in ("pad", "eos", "unk"):
        value = config.get(f"{name}_token")
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            specials[name] = value
    tables = [FILES["vocab"]] * 2
    if config.get("separate_vocabs"):
        if not (folder / FILES["target_vocab"]).is_file():
            raise FileNotFoundError(f"{config_path} says separate_vocabs, but {folder} has no "
                                    f"{FILES['target_vocab']}")
        tables[1] = FILES["target_vocab"]
    sides = []
    for side, spm, table in zip(SIDES, ("source_spm", "target_spm"), tables, strict=True):
        vocab_path = folder / table
        try:
            vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{vocab_path} is not valid json: {e}") from e
        proto = (folder / FILES[spm]).read_bytes()
        load_processor(folder / FILES[spm])  # an error naming the .spm file, if any
        sides.append(MarianTokenizer(proto, vocab, side=side, special_tokens=specials,
                                     path=vocab_path))
    return tuple(sides)
