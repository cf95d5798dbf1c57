"""The corpora a config's ``data:`` section names, as :class:`CorpusSpec` lists and pairs.

``data.dataset`` multi30k (the data directory's ``multi30k/``), parallel (two aligned
files), tsv or files (any number of text/tsv/jsonl corpora) become
:class:`~transformerkit.data.sources.CorpusSpec` lists per split; ``ted_hrlr`` is read
through tensorflow-datasets. :class:`TrainCorpus` is the training corpus as the token cache
and the tokenizer cache see it: a stream and a key of its content. ``data`` is a
:class:`~transformerkit.config.DataOptions`.
"""

import os

from transformerkit.data import corpora, sources, token_cache
from transformerkit.data.sources import CorpusSpec

_ENTRY_KEYS = ("path", "source", "target", "format", "source_column", "target_column",
               "header", "source_key", "target_key")
_SUFFIX_FORMATS = {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}


def corpus_specs(data, split):
    """The :class:`CorpusSpec` list of ``split`` ("train", "val" or "test"; Multi30k also
    "test2016", which "test" means there) for the file-based datasets (multi30k, parallel,
    tsv, files); None for a "val" or "test" split the config names no files for. Raises
    ValueError naming the key for a missing or malformed entry."""
    kind, reading = data.dataset, _reading_options(data)
    if kind == "multi30k":
        folder = corpora.resolve_data_dir(data.data_dir) / "multi30k"
        corpora.check_languages(data.source_lang, data.target_lang, corpora.LANGS)
        split = "test2016" if split == "test" else split
        paths = [corpora.multi30k_file(split, lang, folder)
                 for lang in (data.source_lang, data.target_lang)]
        return [CorpusSpec("text", tuple(paths))]
    if kind == "parallel":
        src, tgt = getattr(data, f"{split}_source"), getattr(data, f"{split}_target")
        if src is None or tgt is None:
            return _missing(split, "data.dataset=parallel needs data.train_source and "
                                   "data.train_target")
        return [CorpusSpec("text", (src, tgt))]
    if kind == "tsv":
        path = getattr(data, f"{split}_tsv")
        if path is None:
            return _missing(split, "data.dataset=tsv needs data.train_tsv")
        return [CorpusSpec("tsv", (path,), **_only(reading, "tsv"))]
    if kind == "files":
        entries = getattr(data, f"{split}_files")
        if not entries:
            return _missing(split, "data.dataset=files needs data.train_files: a list of "
                                   "corpora (paths, or {path|source+target, format, ...})")
        return [_entry_spec(entry, reading, f"data.{split}_files[{i}]")
                for i, entry in enumerate(entries)]
    raise ValueError(f"data.dataset={kind!r} is not a translation dataset; expected multi30k, "
                     "parallel, tsv, files or ted_hrlr (use dataset=text with model.type=gpt)")


def _missing(split, message):
    if split in ("val", "test"):
        return None
    raise ValueError(message)


def _reading_options(data):
    keys = ("source_column", "target_column", "header", "source_key", "target_key")
    return {key: getattr(data, key) for key in keys}


def _only(reading, fmt):
    keys = {"tsv": ("source_column", "target_column", "header"),
            "jsonl": ("source_key", "target_key"), "text": ()}[fmt]
    return {key: reading[key] for key in keys}


def _entry_spec(entry, reading, where):
    """One ``train_files`` entry (a path or a mapping) -> CorpusSpec."""
    if isinstance(entry, str):
        entry = {"path": entry}
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a path or a mapping, got {entry!r}")
    unknown = set(entry) - set(_ENTRY_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {_ENTRY_KEYS}")
    if "path" in entry and ("source" in entry or "target" in entry):
        raise ValueError(f"{where}: give either path (tsv, jsonl) or source + target (two "
                         "text files), not both")
    fmt = entry.get("format")
    if fmt is None:
        if "source" in entry or "target" in entry:
            fmt = "text"
        else:
            name = str(entry.get("path", "")).removesuffix(".gz")
            fmt = _SUFFIX_FORMATS.get(os.path.splitext(name)[1])
            if fmt is None:
                raise ValueError(f"{where}: cannot tell the format of {entry.get('path')!r} "
                                 "from its name; add format: tsv, jsonl or text")
    if fmt == "text":
        if "source" not in entry or "target" not in entry:
            raise ValueError(f"{where}: format text needs source and target (two files)")
        paths = (entry["source"], entry["target"])
    else:
        if "path" not in entry:
            raise ValueError(f"{where}: format {fmt} needs path")
        paths = (entry["path"],)
    if fmt not in sources.FORMATS:
        raise ValueError(f"{where}: format must be one of {sources.FORMATS}, got {fmt!r}")
    options = {**_only(reading, fmt), **{k: v for k, v in entry.items()
                                         if k in _only(reading, fmt)}}
    try:
        return CorpusSpec(fmt, paths, **options)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err


def load_pairs(data, split):
    """(sources, targets) lists of ``split`` ("train", "val" or "test") for the configured
    dataset; None for a "val" or "test" split the config names no files for."""
    if data.dataset == "ted_hrlr":
        return corpora.load_ted_hrlr("validation" if split == "val" else split,
                                     f"{data.source_lang}_to_{data.target_lang}")
    specs = corpus_specs(data, split)
    return None if specs is None else sources.read_pairs(specs)


def limit_pairs(pairs, n):
    """The first ``n`` pairs of ``(sources, targets)`` (``n`` None: all)."""
    return pairs if n is None else (pairs[0][:n], pairs[1][:n])


class TrainCorpus:
    """The training corpus of a config: how to stream it and what identifies it."""

    def __init__(self, data, cache_root):
        self.limit = data.train_limit
        if data.dataset == "ted_hrlr":
            pair = f"{data.source_lang}_to_{data.target_lang}"
            self.specs, self._pairs = None, limit_pairs(corpora.load_ted_hrlr("train", pair),
                                                   self.limit)
            self.key = {"tfds": f"ted_hrlr_translate/{pair}", "limit": self.limit}
        else:
            self.specs = corpus_specs(data, "train")
            self.key = {"corpora": [{**spec.options(), "sha256": [
                token_cache.file_digest(p, cache_root) for p in spec.paths]}
                for spec in self.specs], "limit": self.limit}

    def read(self):
        """-> (iterator of (source, target), list the ReadReports are added to)."""
        reports = []
        if self.specs is None:
            report = sources.ReadReport(self.key["tfds"], {"lines": len(self._pairs[0]),
                                                           "pairs": len(self._pairs[0])})
            reports.append(report)
            return zip(*self._pairs, strict=True), reports
        return sources.iter_corpora(self.specs, reports, self.limit), reports
