"""Marian's ids and vocabularies and this package's, both ways: the vocabulary side of
:mod:`transformerkit.converters.marian`.

This package reserves ids 0..3 for ``<pad> <s> </s> <unk>`` in every vocabulary
(:mod:`transformerkit.special_tokens`; id 0 is padding in every mask, loss and decoder).
Marian puts ``</s>`` at 0, ``<unk>`` at 1 and ``<pad>`` last, and starts the decoder from
``decoder_start_token_id`` (its pad id) instead of a begin token. The import therefore
reorders the rows of each vocabulary (:class:`MarianIds`): ours 0 = Marian's pad, ours 1
(``<s>``, the decoder's first input) = a copy of Marian's ``decoder_start_token_id`` row,
ours 2 = its ``eos_token_id``, ours 3 = its ``<unk>`` (from ``vocab.json``, else id 1), then
every other Marian id in its order: one more row than Marian's vocabulary, and the decoder
starts where Marian starts without any option. Masks find padding as everywhere, greedy,
beam and sampling start from ``<s>`` and stop at ``</s>``, and the CTranslate2 export needs
nothing new. Decoding never picks ``<pad>`` or ``<s>`` (OPUS-MT configs forbid the pad with
``bad_words_ids`` too). The tokenizer of an imported model is each side's
:class:`~transformerkit.data.marian_vocab.MarianTokenizer` renumbered with these rows
(:func:`transformerkit.converters.marian.convert_tokenizer`).

The export writes Marian's own layout (:meth:`MarianIds.layout`, :func:`export_ids`):
``</s>`` 0, ``<unk>`` 1, the run's ids 4.. in order, ``<pad>`` last, which is also
``decoder_start_token_id`` and takes the run's ``<s>`` row; the run's ``<pad>`` row, which no
output depends on, is left out, so each vocabulary has one id fewer than the run's. This is
the layout of every OPUS-MT folder, so an imported OPUS-MT model exports back to its own ids,
and an export imports back to the run's ids. :func:`export_tokenizer` writes ``source.spm``,
``target.spm`` (each side's SentencePiece model), ``vocab.json`` (one table for both sides)
or, for separate vocabularies, ``vocab.json`` + ``target_vocab.json`` with
``separate_vocabs`` in ``tokenizer_config.json``; runs trained here with ``data.tokenizer:
sentencepiece`` (or ``sentencepiece-bpe``) export the same way (other tokenizers are
refused: :func:`~transformerkit.converters.marian_checks.check_tokenizer`).
"""

import dataclasses
import pathlib

import numpy as np

from transformerkit.converters.hf_io import json_bytes, read_json
from transformerkit.converters.marian_checks import config_error, load_config

UNK_FALLBACK = 1  # Marian vocabularies: </s> 0, <unk> 1, ..., <pad> last


@dataclasses.dataclass(frozen=True)
class MarianIds:
    """How this package's ids relate to a Marian checkpoint's, one map per side.

    ``source_rows[i]`` / ``target_rows[i]``: the Marian id whose embedding row becomes id
    ``i`` here (0: pad, 1: the decoder start, 2: eos, 3: unk, then the other ids in order).
    """

    source_rows: np.ndarray
    target_rows: np.ndarray

    @classmethod
    def from_config(cls, config, unk_id=UNK_FALLBACK, folder="config"):
        """The maps of a checked config; ``unk_id``: Marian's ``<unk>`` id."""
        shared = config.get("share_encoder_decoder_embeddings", True)
        target_vocab = config["vocab_size"] if shared else (
            config.get("decoder_vocab_size") or config["vocab_size"])
        pad, eos = config["pad_token_id"], config["eos_token_id"]
        start = config.get("decoder_start_token_id", pad)
        start = pad if start is None else start
        sides = []
        for vocab in (config["vocab_size"], target_vocab):  # one layout: shared matrices
            specials = {"pad_token_id": pad, "decoder_start_token_id": start,
                        "eos_token_id": eos, "<unk> id": unk_id}
            for key, value in specials.items():
                if not isinstance(value, int) or not 0 <= value < vocab:
                    raise config_error(folder, key, value, f"not an id of the {vocab} ids")
            if len({pad, eos, unk_id}) < 3:
                raise config_error(folder, "pad_token_id", pad, f"pad ({pad}), eos ({eos}) "
                                   f"and <unk> ({unk_id}) must be three different ids")
            sides.append(_side_rows(vocab, pad, start, eos, unk_id))
        return cls(*sides)

    @classmethod
    def layout(cls, source_size, target_size):
        """The maps of Marian's own layout for vocabularies of ``source_size`` /
        ``target_size`` ids here (``<pad> <s> </s> <unk>`` at 0..3): one id fewer each,
        ``</s>`` 0, ``<unk>`` 1, our ids 4.. in order, and ``<pad>`` last, which is also
        the decoder start (an OPUS-MT folder's layout: its import gives back these ids)."""
        return cls(*(_side_rows(size - 1, size - 2, size - 2, 0, 1)
                     for size in (source_size, target_size)))

    @classmethod
    def from_folder(cls, folder, config=None):
        """The maps of a Marian folder (``<unk>`` from its ``vocab.json`` when present)."""
        config = load_config(folder) if config is None else config
        return cls.from_config(config, unk_id(folder), folder)

    def rows_for_marian(self, side="target"):
        """For each Marian id, the id here whose embedding row (and logit) it takes: the
        inverse of the import, except that a decoder start that is the pad (Marian's
        rule) takes ours 1 (``<s>``, the row the decoder starts from, which fine-tuning
        trains), not 0 (``<pad>``, a row no output depends on)."""
        rows = self.source_rows if side == "source" else self.target_rows
        ours = self.to_ours(np.arange(rows.max() + 1), side)
        if rows[1] == rows[0]:
            ours[rows[0]] = 1
        return ours

    def to_ours(self, marian_ids, side="source"):
        """Marian ids (any shape) -> ours; Marian's pad becomes our pad (0), so a decoder
        input must start with our ``<s>`` (1) where Marian's starts with its pad."""
        rows = self.source_rows if side == "source" else self.target_rows
        inverse = np.empty(rows.max() + 1, dtype="int64")
        inverse[rows[::-1]] = np.arange(len(rows))[::-1]  # the first of duplicates wins
        return inverse[np.asarray(marian_ids, dtype="int64")]

    def to_marian(self, ids, side="target"):
        """Our ids (any shape) -> Marian's (our ``<s>`` becomes the decoder start id)."""
        rows = self.source_rows if side == "source" else self.target_rows
        return rows[np.asarray(ids, dtype="int64")]


def _side_rows(vocab, pad, start, eos, unk):
    """One side's map: pad, start, eos, unk, then every other Marian id in order."""
    others = [i for i in range(vocab) if i not in (pad, eos, unk)]
    return np.array([pad, start, eos, unk, *others], dtype="int64")


def unk_id(folder):
    """Marian's ``<unk>`` id: ``vocab.json``'s, else :data:`UNK_FALLBACK`."""
    path = pathlib.Path(folder) / "vocab.json"
    if not path.is_file():
        return UNK_FALLBACK
    vocab = read_json(path)
    return vocab.get("<unk>", UNK_FALLBACK) if isinstance(vocab, dict) else UNK_FALLBACK


# -- back to Marian's ids ---------------------------------------------------------------------
def export_ids(model):
    """The :class:`MarianIds` of ``model``'s export (Marian's layout, one id fewer)."""
    return MarianIds.layout(model.source_vocab_size, model.target_vocab_size)


def vocabulary_table(tokenizer, side, ids):
    """``{piece: Marian id}`` of one side (``vocab.json``): each of the run's ids but ``<s>``
    (which becomes the pad's id: ``<pad>``'s piece keeps it)."""
    to_marian = ids.to_marian(np.arange(tokenizer.vocab_size), side)
    return {tokenizer.id_to_token(i): int(to_marian[i])
            for i in range(tokenizer.vocab_size) if i != 1}


def export_tokenizer(source_tokenizer, target_tokenizer, ids, max_length):
    """``{file name: bytes}`` of the ``MarianTokenizer`` files."""
    tables = [vocabulary_table(source_tokenizer, "source", ids),
              vocabulary_table(target_tokenizer, "target", ids)]
    separate = tables[0] != tables[1]
    config = {"tokenizer_class": "MarianTokenizer", "separate_vocabs": separate,
              "source_lang": None, "target_lang": None, "model_max_length": int(max_length),
              "sp_model_kwargs": {},
              **{f"{name}_token": source_tokenizer.id_to_token(i)
                 for name, i in (("pad", 0), ("eos", 2), ("unk", 3))}}
    files = {"source.spm": source_tokenizer.serialized_model,
             "target.spm": target_tokenizer.serialized_model,
             "vocab.json": json_bytes(tables[0]), "tokenizer_config.json": json_bytes(config)}
    if separate:
        files["target_vocab.json"] = json_bytes(tables[1])
    return files


__all__ = ["MarianIds", "export_ids", "export_tokenizer", "unk_id", "vocabulary_table"]
