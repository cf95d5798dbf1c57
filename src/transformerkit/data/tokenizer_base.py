"""What every tokenizer of :mod:`transformerkit.data` shares: the reserved ids, the batch
and lookup helpers, the training statistics and the json file helpers.

A module of its own so that the tokenizers built on other libraries
(:mod:`~transformerkit.data.sentencepiece_tokenizer`, :mod:`~transformerkit.data.marian_vocab`)
and :mod:`~transformerkit.data.tokenizers`, which loads any of them, import it without an
import cycle.
"""

import itertools
import json
import logging
import pathlib

import numpy as np

from transformerkit.files import atomic_write_text
from transformerkit.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

METADATA_KEY = "transformerkit"  # our top-level key inside a saved json

logger = logging.getLogger("transformerkit.data.tokenizers")


def _nonempty_lines(texts, stats):
    """Yield the texts that are not empty or whitespace-only; count both in ``stats``."""
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of strings, not one string "
                        f"(got {texts[:40]!r}...); wrap it in a list")
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"texts must contain str, got {type(text).__name__}: {text!r:.60}")
        if text.strip():
            stats["lines"] += 1
            yield text
        else:
            stats["skipped_empty"] += 1


def _log_training_stats(name, stats):
    if stats["skipped_empty"]:
        logger.info("%s: skipped %d empty lines while training", name, stats["skipped_empty"])
    if not stats["lines"]:
        raise ValueError(f"{name}.train got no non-empty text "
                         f"({stats['skipped_empty']} empty lines skipped)")


def _write_json(path, payload):
    """Write ``payload`` as one line of json (UTF-8) to ``path``, atomically."""
    atomic_write_text(path, json.dumps(payload, ensure_ascii=False))


def _read_json(path):
    """Read a json object from ``path``; FileNotFoundError / ValueError name the path."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"tokenizer file {path} is not valid json: {e}") from e
    if not isinstance(payload, dict):
        raise ValueError(f"tokenizer file {path} does not hold a json object")
    return payload


def _strip_at_eos(ids, eos_id, drop):
    """Ids up to (not including) the first ``eos_id``, without the ids in ``drop``."""
    out = []
    for i in ids:
        i = int(i)
        if i == eos_id:
            break
        if i not in drop:
            out.append(i)
    return out


def _flatten(sequences):
    """List of id lists -> (int32 concatenation, int64 lengths)."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    ids = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int32,
                      count=int(lengths.sum()))
    return ids, lengths


class _TokenizerBase:
    """What every tokenizer shares: the reserved ids and the batch/lookup helpers."""

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def _with_specials(self, ids, add_bos, add_eos):
        """``[bos] + ids + [eos]`` as asked; PAD/BOS/EOS ids found in text become UNK."""
        reserved = {self.pad_id, self.bos_id, self.eos_id}
        if not reserved.isdisjoint(ids):
            ids = [self.unk_id if i in reserved else i for i in ids]
        return [self.bos_id] * bool(add_bos) + list(ids) + [self.eos_id] * bool(add_eos)

    def decode_batch(self, batch):
        """Decode a ``(batch, length)`` array or a list of id lists -> list of str."""
        return [self.decode(ids) for ids in batch]

    def encode_batch_flat(self, texts, add_bos=False, add_eos=False):
        """Texts -> ``(ids, lengths)``: the encodings of :meth:`encode_batch` concatenated
        into one int32 array ``(sum(lengths),)`` and their lengths, int64 ``(len(texts),)``
        (the form the token cache stores)."""
        encoded = self.encode_batch(texts, add_bos=add_bos, add_eos=add_eos)
        return _flatten(encoded)

    def __repr__(self):
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"
