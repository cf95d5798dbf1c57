"""An on-disk cache of a corpus' token ids, memory-mapped by every run that uses it.

A corpus is encoded once, in parallel batches, into one folder per cache key::

    CACHE_ROOT/<key>/
      manifest.json      what was encoded (the key's parts), pair counts, read report,
                         and each array file's dtype, length, size and sha256
      source.ids         all source ids, concatenated (uint16 when the vocabulary fits)
      source.offsets     int64 (pairs + 1,): pair i is ids[offsets[i]:offsets[i + 1]]
      target.ids, target.offsets

(the layout of fairseq's ``.bin``/``.idx`` pairs; ``docs/data.md`` compares it with Arrow).
The key is the sha256 of the corpus files' content digests and reading options, the
tokenizer files' digests and the length filter, so a changed file, tokenizer or
``max_length`` gives another folder. A folder is built under a temporary name and renamed
into place when complete; opening one checks the manifest, every file's size and sha256
(about 1.7 GB/s) and the offsets, and a cache that fails a check is rebuilt with a warning,
never trained on. File digests are remembered by the file's path and identity in
``CACHE_ROOT/digests`` (:func:`transformerkit.files.remembered_sha256`), so an unchanged
corpus is not hashed again.
"""

import hashlib
import json
import logging
import os
import shutil
import tempfile

import numpy as np

from transformerkit.files import (
    atomic_write_text,
    file_sha256,
    remembered_sha256,
    user_cache_directory,
)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DIGESTS = "digests"  # the folder of the corpus files' remembered digests
TOKEN_CACHE = "token-cache"  # the folder in the user's cache
ARRAYS = ("source.ids", "source.offsets", "target.ids", "target.offsets")
CHUNK_PAIRS = 20_000  # pairs per encode_batch call: bounded memory, parallel encoding

logger = logging.getLogger(__name__)


class CacheCorrupt(ValueError):
    """A cache folder that must not be trained on (the message says why)."""


def default_cache_root():
    """``token-cache`` in the user's cache folder
    (:func:`transformerkit.files.user_cache_directory`: ``$TRANSFORMERKIT_CACHE``, else
    ``$XDG_CACHE_HOME/transformerkit``, else ``~/.cache/transformerkit``): shared by all
    runs of the user, so a second run on the same corpus starts at once."""
    return user_cache_directory(TOKEN_CACHE)


def key_of(parts):
    """The cache key of a JSON-able description: 24 hex digits of its sha256."""
    text = json.dumps(parts, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def file_digest(path, root):
    """sha256 of the file at ``path``, read once per version of the file: remembered in
    ``root/digests`` by the file's identity (:func:`transformerkit.files.remembered_sha256`:
    its device, inode, size and modification and change times)."""
    return remembered_sha256(path, os.path.join(root, DIGESTS))


class RaggedIds:
    """Variable-length id sequences stored flat: ``ids`` (total,) and ``offsets`` (n + 1,).

    ``len(r)`` is the number of sequences, ``r[i]`` the ``i``-th (a view, no copy) and
    ``r.lengths`` their lengths, int64 ``(n,)``. Works on memory-mapped arrays as on any.
    """

    def __init__(self, ids, offsets):
        self.ids, self.offsets = ids, offsets
        self.lengths = np.diff(offsets)

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        return self.ids[self.offsets[i]:self.offsets[i + 1]]


class CachedPairs:
    """Encoded parallel corpus read from a cache folder, the interface of
    :class:`~transformerkit.data.pipeline.EncodedPairs` (``source``, ``target``,
    ``dropped``, ``len``) without a Python object per sequence.

    Attributes:
        source, target: :class:`RaggedIds` (source: pieces + EOS, target: BOS + pieces +
            EOS). dropped: pairs over the length filter. manifest: the folder's manifest.
        path: the folder. status: "built", "reused" or "rebuilt" (after a corrupt one).
    """

    def __init__(self, path, manifest, status):
        self.path, self.manifest, self.status = path, manifest, status
        arrays = {name: _map(path, name, manifest["files"][name]) for name in ARRAYS}
        self.source = RaggedIds(arrays["source.ids"], arrays["source.offsets"])
        self.target = RaggedIds(arrays["target.ids"], arrays["target.offsets"])
        self.dropped = manifest["dropped_long"]

    def __len__(self):
        return len(self.source)


def _map(folder, name, entry):
    if entry["length"] == 0:
        return np.zeros(0, dtype=entry["dtype"])
    return np.memmap(os.path.join(folder, name), dtype=entry["dtype"], mode="r",
                     shape=(entry["length"],))


def open_or_build(root, parts, read_pairs, source_tokenizer, target_tokenizer, max_length):
    """The :class:`CachedPairs` of key ``parts`` under ``root``, encoding it first if absent
    or unusable.

    Args:
        root: cache root folder (created if needed).
        parts: JSON-able description of everything the ids depend on (see :func:`key_of`).
        read_pairs: callable -> ``(iterator of (source, target) str pairs, reports)``;
            ``reports`` (a list of ``ReadReport``) is filled while the iterator runs.
        source_tokenizer, target_tokenizer: with ``encode_batch_flat``.
        max_length: pairs longer than this (special tokens included) on either side are
            dropped and counted.
    """
    os.makedirs(root, exist_ok=True)
    folder = os.path.join(root, key_of(parts))
    status = "built"
    if os.path.isdir(folder):
        try:
            return CachedPairs(folder, verify(folder, parts), "reused")
        except CacheCorrupt as err:
            logger.warning("token cache %s is unusable (%s); rebuilding it", folder, err)
            _remove(folder)
            status = "rebuilt"
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=root)
    try:
        manifest = _encode_into(tmp, parts, read_pairs, source_tokenizer, target_tokenizer,
                                max_length)
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished the same key first: use theirs
            if not os.path.isdir(folder):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("token cache %s: %d pairs encoded", folder, manifest["pairs"])
    return CachedPairs(folder, verify(folder, parts), status)


def _remove(folder):
    """Move a bad folder out of the way (a rename is atomic), then delete it."""
    doomed = tempfile.mkdtemp(prefix=".tmp-stale-", dir=os.path.dirname(folder))
    os.replace(folder, os.path.join(doomed, "x"))
    shutil.rmtree(doomed, ignore_errors=True)


def _id_dtype(tokenizer):
    return "uint16" if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else "int32"


class _ArrayWriter:
    """Appends ids to ``<side>.ids`` with a running sha256; keeps the lengths for offsets."""

    def __init__(self, folder, side, dtype):
        self.folder, self.side, self.dtype = folder, side, dtype
        self.file = open(os.path.join(folder, f"{side}.ids"), "wb")
        self.digest, self.length, self.lengths = hashlib.sha256(), 0, []

    def append(self, ids, lengths):
        data = ids.astype(self.dtype).tobytes()
        self.file.write(data)
        self.digest.update(data)
        self.length += len(ids)
        self.lengths.append(lengths)

    def close(self):
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        offsets_path = os.path.join(self.folder, f"{self.side}.offsets")
        with open(offsets_path, "wb") as f:
            f.write(offsets.tobytes())
            os.fsync(f.fileno())
        return {f"{self.side}.ids": _entry(self.dtype, self.length, self.digest.hexdigest()),
                f"{self.side}.offsets": _entry("int64", len(offsets),
                                               hashlib.sha256(offsets.tobytes()).hexdigest())}


def _entry(dtype, length, sha256):
    return {"dtype": dtype, "length": int(length),
            "bytes": int(length) * np.dtype(dtype).itemsize, "sha256": sha256}


def _encode_into(folder, parts, read_pairs, source_tokenizer, target_tokenizer, max_length):
    pairs, reports = read_pairs()
    writers = {"source": _ArrayWriter(folder, "source", _id_dtype(source_tokenizer)),
               "target": _ArrayWriter(folder, "target", _id_dtype(target_tokenizer))}
    kept = dropped = 0
    chunk = []
    for pair in _then(pairs, None):
        if pair is not None:
            chunk.append(pair)
        if len(chunk) == CHUNK_PAIRS or (pair is None and chunk):
            sources, targets = zip(*chunk, strict=True)
            chunk = []
            src, src_len = source_tokenizer.encode_batch_flat(sources, add_eos=True)
            tgt, tgt_len = target_tokenizer.encode_batch_flat(targets, add_bos=True,
                                                              add_eos=True)
            keep = (src_len <= max_length) & (tgt_len <= max_length)  # (chunk,)
            writers["source"].append(src[np.repeat(keep, src_len)], src_len[keep])
            writers["target"].append(tgt[np.repeat(keep, tgt_len)], tgt_len[keep])
            kept, dropped = kept + int(keep.sum()), dropped + int((~keep).sum())
    files = {}
    for writer in writers.values():
        files.update(writer.close())
    manifest = {"version": FORMAT_VERSION, "parts": parts, "pairs": kept,
                "dropped_long": dropped, "read": [r.as_dict() for r in reports],
                "files": files}
    atomic_write_text(os.path.join(folder, MANIFEST), json.dumps(manifest, indent=1))
    return manifest


def _then(iterator, last):
    yield from iterator
    yield last


def verify(folder, parts):
    """The manifest of ``folder`` after checking it describes ``parts`` and that each array
    file has its recorded size and sha256 and the offsets are consistent; CacheCorrupt
    naming the first problem otherwise."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise CacheCorrupt("no manifest.json: an interrupted or foreign folder") from None
    except (OSError, ValueError) as err:
        raise CacheCorrupt(f"manifest.json is unreadable: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("version") != FORMAT_VERSION:
        raise CacheCorrupt(f"manifest version is not {FORMAT_VERSION}")
    if manifest.get("parts") != json.loads(json.dumps(parts)):
        raise CacheCorrupt("manifest describes other inputs than its key")
    files = manifest.get("files") or {}
    for name in ARRAYS:
        entry, path = files.get(name), os.path.join(folder, name)
        if not isinstance(entry, dict):
            raise CacheCorrupt(f"manifest lists no {name}")
        if not os.path.isfile(path):
            raise CacheCorrupt(f"{name} is missing")
        size = os.path.getsize(path)
        if size != entry["bytes"]:
            raise CacheCorrupt(f"{name} has {size} bytes, the manifest says {entry['bytes']}"
                               " (truncated?)")
        if file_sha256(path) != entry["sha256"]:
            raise CacheCorrupt(f"{name} does not match its sha256 (corrupted)")
    for side in ("source", "target"):
        offsets = _map(folder, f"{side}.offsets", files[f"{side}.offsets"])
        ids = files[f"{side}.ids"]["length"]
        if (len(offsets) != manifest["pairs"] + 1 or offsets[0] != 0 or offsets[-1] != ids
                or (np.diff(offsets) < 1).any()):
            raise CacheCorrupt(f"{side}.offsets do not describe {manifest['pairs']} "
                               f"sequences of {side}.ids")
    return manifest
