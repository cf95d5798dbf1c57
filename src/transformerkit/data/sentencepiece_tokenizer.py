"""SentencePiece tokenizers trained with the `sentencepiece` package (the reference
implementation of Kudo & Richardson's tokenizer), saved as a standard ``.model`` file.

A run trained with ``data.tokenizer: sentencepiece`` (the unigram language model, as the
OPUS-MT models use) or ``sentencepiece-bpe`` keeps its vocabulary as ``tokenizer.model``
(or ``source_tokenizer.model`` and ``target_tokenizer.model``): the file that
``sentencepiece.SentencePieceProcessor``, fairseq, Marian and CTranslate2's tokenizers read,
holding its pieces, their scores and its normalization rules. Its ids are SentencePiece's own,
and the reserved ones sit where the models expect them (``pad_id=0``, ``bos_id=1``,
``eos_id=2``, ``unk_id=3``: the trainer's options of those names), so a SentencePiece user
gets the same ids from that file as this package does.

What SentencePiece itself decides (not reimplemented here):

- normalization: ``nmt_nfkc`` (NFKC plus SentencePiece's whitespace rules: leading,
  trailing and repeated spaces are dropped), ``nmt_nfkc_cf`` with ``data.lowercase``
  (case folding). So ``decode(encode(text))`` is the normalized text;
- characters outside the learned ones (``character_coverage`` 0.9995 of the training text)
  become ``<unk>`` (id 3), which decodes as SentencePiece's `` ⁇ ``;
- the spellings ``<s>``, ``</s>``, ``<pad>``, ``<unk>`` inside text are plain text, never
  special ids (the policy of :mod:`transformerkit.data.tokenizers` too).

Training runs in memory (``sentence_iterator`` in, ``model_writer`` out): no temporary files.
The trainer's other options are SentencePiece's defaults.
"""

import io
import logging
import os
import pathlib

import sentencepiece

from transformerkit.data.tokenizer_base import (
    _log_training_stats,
    _nonempty_lines,
    _strip_at_eos,
    _TokenizerBase,
)
from transformerkit.files import atomic_path
from transformerkit.special_tokens import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID

SENTENCEPIECE_KINDS = {"sentencepiece": "unigram", "sentencepiece-bpe": "bpe"}
"""``data.tokenizer`` values that train a SentencePiece model -> its ``model_type``."""

TRAINING_THREADS = 16
"""SentencePiece's own default. The model depends on the number of training threads (the
work is split by thread), so it is fixed, not the machine's core count: the same sample
gives the same model everywhere (as ``spm_train`` does given the same options)."""

MODEL_SUFFIXES = (".model", ".spm")  # how SentencePiece model files are named (Marian: .spm)

logger = logging.getLogger(__name__)


def is_sentencepiece_file(path):
    """Whether ``path`` is named as a SentencePiece model file (``.model``, ``.spm``)."""
    return os.fspath(path).endswith(MODEL_SUFFIXES)


def load_processor(path=None, proto=None):
    """A ``SentencePieceProcessor`` from a model file (or its serialized bytes); a
    FileNotFoundError / ValueError that names the file instead of a C++ message."""
    if proto is None:
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model file not found: {path}")
        proto = path.read_bytes()
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError) as e:
        raise ValueError(f"{path or 'the data'} is not a SentencePiece model: {e}") from e
    return processor


class SentencePieceTokenizer(_TokenizerBase):
    """A SentencePiece model with the reserved ids at 0..3, encoded and decoded by the
    `sentencepiece` package.

    Args:
        proto: the serialized model (the bytes of a ``.model`` file).
        path: where it came from, for error messages.

    Example:
    >>> tok = SentencePieceTokenizer.train(["Ein Hund läuft.", "Zwei Hunde laufen."] * 20,
    ...                                    vocab_size=40)
    >>> tok.decode(tok.encode("Ein Hund läuft.", add_bos=True, add_eos=True))
    'Ein Hund läuft.'
    """

    def __init__(self, proto, path=None):
        self._proto = bytes(proto)
        self._sp = load_processor(path, self._proto)
        where = path or "the SentencePiece model"
        got = {name: getattr(self._sp, f"{name}_id")() for name in ("pad", "bos", "eos", "unk")}
        want = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}
        if got != want:
            raise ValueError(
                f"{where} has pad/bos/eos/unk ids {tuple(got.values())} (-1: none); the models "
                f"need {tuple(want.values())}: train it with pad_id=0, bos_id=1, eos_id=2, "
                "unk_id=3 (data.tokenizer: sentencepiece does)")
        self._settings = None
        self.training_stats = {}

    @property
    def kind(self):
        """``"sentencepiece"`` (unigram) or ``"sentencepiece-bpe"``, as the model says."""
        return self._read_settings()[0]

    @property
    def lowercase(self):
        """Whether the model's normalization case-folds (``nmt_nfkc_cf``)."""
        return self._read_settings()[1]

    def _read_settings(self):
        """``(kind, lowercase)`` from the model's trainer and normalizer specs, parsed with
        `protobuf` (SentencePiece's own ``sentencepiece_model_pb2``) on first use only, so
        encoding and decoding never need it."""
        if self._settings is None:
            from sentencepiece import sentencepiece_model_pb2

            model = sentencepiece_model_pb2.ModelProto()
            model.ParseFromString(self._proto)
            kind = "sentencepiece-bpe" if model.trainer_spec.model_type == \
                sentencepiece_model_pb2.TrainerSpec.BPE else "sentencepiece"
            self._settings = kind, model.normalizer_spec.name.endswith("_cf")
        return self._settings

    # ----------------------------------------------------------------------------- train
    @classmethod
    def train(cls, texts, kind="sentencepiece", vocab_size=8000, lowercase=False):
        """Train on ``texts`` (an iterable of str) with ``SentencePieceTrainer``, in memory.

        Empty and whitespace-only lines are skipped (counted in ``training_stats``).

        Args:
            texts: iterable of str.
            kind: a key of :data:`SENTENCEPIECE_KINDS` (``"sentencepiece"``: unigram,
                ``"sentencepiece-bpe"``).
            vocab_size: int, the number of ids, reserved ones included. Unigram treats it
                as an upper bound (a small corpus may give fewer pieces); BPE merges until
                it is reached.
            lowercase: case-fold after NFKC (``nmt_nfkc_cf``), stored in the model.
        """
        if kind not in SENTENCEPIECE_KINDS:
            raise ValueError(f"kind must be one of {tuple(SENTENCEPIECE_KINDS)}, got {kind!r}")
        stats = {"lines": 0, "skipped_empty": 0}
        model = io.BytesIO()
        model_type = SENTENCEPIECE_KINDS[kind]
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=_nonempty_lines(texts, stats), model_writer=model,
                model_type=model_type, vocab_size=int(vocab_size),
                hard_vocab_limit=model_type == "bpe",
                normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
                pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
                pad_piece=PAD, bos_piece=BOS, eos_piece=EOS, unk_piece=UNK,
                input_sentence_size=0,  # the sample is already drawn: use all of it
                num_threads=TRAINING_THREADS, minloglevel=2)
        except RuntimeError as e:
            _log_training_stats(f"SentencePieceTokenizer({kind})", stats)  # no text: say so
            raise ValueError(f"SentencePiece could not train a {model_type} model of "
                             f"vocab_size {vocab_size}: {_reason(e)}") from e
        _log_training_stats(f"SentencePieceTokenizer({kind})", stats)
        result = cls(model.getvalue())
        result.training_stats = stats
        return result

    # ---------------------------------------------------------------------- properties
    @property
    def vocab_size(self):
        """Number of ids (reserved tokens included); valid ids are ``0 .. vocab_size-1``."""
        return self._sp.get_piece_size()

    @property
    def processor(self):
        """The wrapped ``sentencepiece.SentencePieceProcessor``."""
        return self._sp

    @property
    def serialized_model(self):
        """The bytes of the ``.model`` file."""
        return self._proto

    # ------------------------------------------------------------------- encode/decode
    def encode(self, text, add_bos=False, add_eos=False):
        """Text -> list of int ids (``[bos] + pieces + [eos]`` as asked)."""
        _check_text(text)
        return self._with_specials(self._sp.encode(text), add_bos, add_eos)

    def encode_batch(self, texts, add_bos=False, add_eos=False):
        """List of texts -> list of id lists (SentencePiece encodes them in C++)."""
        texts = list(texts)
        for text in texts:
            _check_text(text)
        return [self._with_specials(ids, add_bos, add_eos) for ids in self._sp.encode(texts)]

    def tokenize(self, text):
        """Text -> list of pieces (``▁`` marks a preceding space)."""
        _check_text(text)
        return self._sp.encode(text, out_type=str)

    def id_to_token(self, i):
        i = int(i)
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"id {i} is outside the vocabulary (size {self.vocab_size})")
        return self._sp.id_to_piece(i)

    def token_to_id(self, s):
        """The id of piece ``s``, or None if the vocabulary has no such piece."""
        i = self._sp.piece_to_id(s)
        return None if i == self.unk_id and s != UNK else i

    def decode(self, ids):
        """Ids -> text. Stops at the first EOS; drops PAD and BOS; ``<unk>`` shows `` ⁇ ``."""
        kept = _strip_at_eos(ids, self.eos_id, {self.pad_id, self.bos_id})
        self._check_ids(kept)
        return self._sp.decode(kept)

    def decode_batch(self, batch):
        kept = [_strip_at_eos(ids, self.eos_id, {self.pad_id, self.bos_id}) for ids in batch]
        for ids in kept:
            self._check_ids(ids)
        return self._sp.decode(kept) if kept else []

    def _check_ids(self, ids):
        size = self.vocab_size
        bad = [i for i in ids if not 0 <= i < size]
        if bad:
            raise ValueError(f"id {bad[0]} is outside the vocabulary (size {size})")

    # ------------------------------------------------------------------------ save/load
    def save(self, path):
        """Write the ``.model`` file (atomically), as ``SentencePieceTrainer`` writes it."""
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(self._proto)

    @classmethod
    def load(cls, path):
        """Load a SentencePiece ``.model`` file whose reserved ids are 0..3."""
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        return cls(path.read_bytes(), path=path)


def _check_text(text):
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}: {text!r:.60}")


def _reason(error):
    """The sentence of a SentencePiece error, without its C++ source location."""
    message = str(error)
    return message.split("] ", 1)[-1] if "] " in message else message

