"""Streaming readers of parallel corpora: plain-text file pairs, TSV and JSON lines.

A corpus is described by a :class:`CorpusSpec`; :func:`iter_pairs` streams its
``(source, target)`` pairs one at a time (bounded memory, any file size). Files whose name
ends in ``.gz`` are read through gzip. Only ``\\n`` ends a line; fields are stripped.

Formats:

- ``text``: two files, line ``i`` of the source file translates line ``i`` of the target
  file. Files with different line counts are an error (the corpus is misaligned).
- ``tsv``: one file, tab-separated columns, no quoting. ``source_column`` and
  ``target_column`` are 0-based indices, or names from a header line (``header=True``:
  the first line names the columns and is not a pair). Swapping them reverses the direction.
- ``jsonl``: one JSON object per line; ``source_key`` / ``target_key`` name the fields.

Bad lines never stop a run and are never dropped silently: each is counted in a
:class:`ReadReport` by kind (``invalid_utf8``, ``too_few_columns``, ``bad_json``,
``missing_field``, ``empty_side``; blank lines are counted as ``blank``), and
:meth:`ReadReport.check_usable` raises a ValueError naming the file when nothing usable is
left. :func:`reservoir_sample` draws the bounded, seeded random sample a tokenizer trains on.
"""

import collections
import dataclasses
import gzip
import itertools
import json
import logging
import math
import os
import random

FORMATS = ("text", "tsv", "jsonl")
MALFORMED_KINDS = ("invalid_utf8", "too_few_columns", "bad_json", "missing_field",
                   "empty_side")
_BOM = b"\xef\xbb\xbf"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """One parallel corpus on disk.

    Args:
        format: "text", "tsv" or "jsonl".
        paths: ``(source_file, target_file)`` for text, ``(file,)`` for tsv and jsonl.
        source_column, target_column: tsv: 0-based index (int) or header name (str).
        header: tsv: the first line names the columns.
        source_key, target_key: jsonl: the fields holding the two sides.
    """

    format: str
    paths: tuple
    source_column: int | str = 0
    target_column: int | str = 1
    header: bool = False
    source_key: str = "source"
    target_key: str = "target"

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"corpus format must be one of {FORMATS}, got {self.format!r}")
        need = 2 if self.format == "text" else 1
        if len(self.paths) != need or not all(isinstance(p, (str, os.PathLike))
                                              for p in self.paths):
            raise ValueError(f"a {self.format} corpus needs {need} file path(s), got "
                             f"{self.paths!r}")
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))
        if self.format == "tsv":
            for name in ("source_column", "target_column"):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, (int, str)) or (
                        isinstance(value, int) and value < 0):
                    raise ValueError(f"{name} must be a 0-based column index or a header "
                                     f"name, got {value!r}")
                if isinstance(value, str) and not self.header:
                    raise ValueError(f"{name}={value!r} names a column: set header: true "
                                     f"(the first line of {self.paths[0]} names the columns)")
            if self.source_column == self.target_column:
                raise ValueError(f"source_column and target_column are both "
                                 f"{self.source_column!r}")
        if self.format == "jsonl" and self.source_key == self.target_key:
            raise ValueError(f"source_key and target_key are both {self.source_key!r}")

    @property
    def name(self):
        return " / ".join(self.paths)

    def options(self):
        """The settings that change which pairs are read (for cache keys), as a dict."""
        fields = {"text": (), "tsv": ("source_column", "target_column", "header"),
                  "jsonl": ("source_key", "target_key")}[self.format]
        return {"format": self.format, **{f: getattr(self, f) for f in fields}}


class ReadReport:
    """Counts of one corpus' lines: ``lines``, ``pairs`` (usable), ``blank`` and each
    malformed kind of :data:`MALFORMED_KINDS`."""

    def __init__(self, name, counts=None):
        self.name = name
        self.counts = collections.Counter(counts or {})

    @property
    def malformed(self):
        return sum(self.counts[k] for k in MALFORMED_KINDS)

    def as_dict(self):
        return {"corpus": self.name, "lines": self.counts["lines"],
                "pairs": self.counts["pairs"], "blank": self.counts["blank"],
                **{k: self.counts[k] for k in MALFORMED_KINDS if self.counts[k]}}

    def log(self):
        """A WARNING naming each kind of bad line found, if any."""
        if self.malformed:
            kinds = ", ".join(f"{self.counts[k]} {k}" for k in MALFORMED_KINDS if self.counts[k])
            logger.warning("%s: skipped %d of %d lines (%s); %d pairs kept", self.name,
                           self.malformed, self.counts["lines"], kinds, self.counts["pairs"])

    def check_usable(self):
        """Raise ValueError when the corpus gave no usable pair."""
        if not self.counts["pairs"]:
            kinds = ", ".join(f"{self.counts[k]} {k}" for k in (*MALFORMED_KINDS, "blank")
                              if self.counts[k]) or "the file is empty"
            raise ValueError(f"{self.name}: no usable pair in {self.counts['lines']} lines "
                             f"({kinds}); check the format and columns/keys of this corpus")


def open_binary(path):
    """A binary file object for ``path``, gunzipped when the name ends in ``.gz``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"corpus file not found: {path}")
    return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")


def _decoded_lines(path, report):
    """Yield each line of ``path`` as str without its end of line, or None where it is not
    valid UTF-8 (counted). Counts ``lines``."""
    with open_binary(path) as f:
        try:
            for number, raw in enumerate(f):
                if number == 0 and raw.startswith(_BOM):
                    raw = raw[3:]
                report.counts["lines"] += 1
                try:
                    line = raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError:
                    report.counts["invalid_utf8"] += 1
                    line = None
                yield line
        except (EOFError, gzip.BadGzipFile) as err:
            raise ValueError(f"{path} is not a complete gzip file ({err}); re-download or "
                             "re-compress it") from err


def _kept(report, source, target):
    if not source or not target:
        report.counts["empty_side"] += 1
        return False
    report.counts["pairs"] += 1
    return True


def _text_pairs(spec, report):
    source_path, target_path = spec.paths
    sentinel = object()
    lines = itertools.zip_longest(_decoded_lines(source_path, report),
                                  _decoded_lines(target_path, ReadReport("")),
                                  fillvalue=sentinel)
    count = 0
    for count, (source, target) in enumerate(lines, start=1):
        if source is sentinel or target is sentinel:
            raise ValueError(f"parallel files have different line counts: {source_path} and "
                             f"{target_path} differ from line {count} on")
        if source is None or target is None:
            if source is not None:  # the target side was the invalid one
                report.counts["invalid_utf8"] += 1
            continue
        source, target = source.strip(), target.strip()
        if _kept(report, source, target):
            yield source, target


def _column_indices(spec, header_line):
    names = [name.strip() for name in header_line.split("\t")]
    indices = []
    for column in (spec.source_column, spec.target_column):
        if isinstance(column, str):
            if column not in names:
                raise ValueError(f"{spec.paths[0]}: no column named {column!r} in the header "
                                 f"line; its columns are {names}")
            column = names.index(column)
        indices.append(column)
    return indices


def _tsv_pairs(spec, report):
    lines = _decoded_lines(spec.paths[0], report)
    source_column, target_column = spec.source_column, spec.target_column
    if spec.header:
        header_line = next(lines, None)
        if header_line is None:
            raise ValueError(f"{spec.paths[0]}: header: true but the file is empty or its "
                             "first line is not UTF-8")
        report.counts["lines"] -= 1  # the header is not a data line
        source_column, target_column = _column_indices(spec, header_line)
    needed = max(source_column, target_column) + 1
    for line in lines:
        if line is None:
            continue
        if not line.strip():
            report.counts["blank"] += 1
            continue
        fields = line.split("\t")
        if len(fields) < needed:
            report.counts["too_few_columns"] += 1
            continue
        source, target = fields[source_column].strip(), fields[target_column].strip()
        if _kept(report, source, target):
            yield source, target


def _jsonl_pairs(spec, report):
    for line in _decoded_lines(spec.paths[0], report):
        if line is None:
            continue
        if not line.strip():
            report.counts["blank"] += 1
            continue
        try:
            record = json.loads(line)
        except ValueError:
            report.counts["bad_json"] += 1
            continue
        if not isinstance(record, dict) or not all(
                isinstance(record.get(k), str) for k in (spec.source_key, spec.target_key)):
            report.counts["missing_field"] += 1
            continue
        source, target = record[spec.source_key].strip(), record[spec.target_key].strip()
        if _kept(report, source, target):
            yield source, target


_READERS = {"text": _text_pairs, "tsv": _tsv_pairs, "jsonl": _jsonl_pairs}


def iter_pairs(spec, report=None):
    """Stream the usable ``(source, target)`` pairs of ``spec``, counting into ``report``."""
    report = ReadReport(spec.name) if report is None else report
    return _READERS[spec.format](spec, report)


def iter_corpora(specs, reports, limit=None):
    """Stream the pairs of several corpora one after the other (at most ``limit`` in all);
    ``reports`` is a list that gets one :class:`ReadReport` per corpus read."""
    def pairs():
        for spec in specs:
            report = ReadReport(spec.name)
            reports.append(report)
            yield from iter_pairs(spec, report)
    return pairs() if limit is None else itertools.islice(pairs(), limit)


def read_pairs(specs, limit=None):
    """All pairs of ``specs`` as two lists (for small corpora: validation, evaluation);
    bad lines are logged, and a corpus without a usable pair raises ValueError."""
    reports = []
    pairs = list(iter_corpora(specs, reports, limit))
    for report in reports:
        report.log()
        if limit is None:
            report.check_usable()
    return [s for s, _ in pairs], [t for _, t in pairs]


def reservoir_sample(items, k, seed):
    """A uniform random sample of ``k`` items of a stream of unknown length (all of them
    when there are fewer), drawn from ``seed`` in one pass with ``O(k)`` memory.

    Li's "Algorithm L" (ACM TOMS 20(4), 1994): after the first ``k`` items it jumps over a
    geometrically distributed number of items, so random draws cost ``O(k log(n / k))``.
    """
    if int(k) < 1:
        raise ValueError(f"sample size must be positive, got {k}")
    rng, it = random.Random(seed), iter(items)
    reservoir = list(itertools.islice(it, k))
    if len(reservoir) < k:
        return reservoir
    weight = math.exp(math.log(_open_unit(rng)) / k)  # in (0, 1)
    while True:
        skip = math.floor(math.log(_open_unit(rng)) / math.log(1.0 - weight))
        item = next(itertools.islice(it, skip, None), it)  # `it` itself: the stream ended
        if item is it:
            return reservoir
        reservoir[rng.randrange(k)] = item
        weight *= math.exp(math.log(_open_unit(rng)) / k)


def _open_unit(rng):
    """A uniform draw from the open interval (0, 1)."""
    while True:
        u = rng.random()
        if u > 0.0:
            return u
