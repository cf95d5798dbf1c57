"""From the ``data:`` section of a config to tokenizers and ``model.fit``-ready datasets.

Translation corpora go through the token cache (:mod:`transformerkit.data.token_cache`):
read as streams (:mod:`transformerkit.data.sources`), tokenizers trained on a seeded sample
(and cached by corpus and settings), ids encoded once into memory-mapped arrays that later
runs and ``--resume`` reuse.

Where the tokenizers come from, per side: built from the tokens of a pretrained vectors file
(``model.embeddings``, :mod:`transformerkit.data.vectors`; the matrix laid out by id goes to
the model), copied from an earlier run or a tokenizer file (``data.tokenizer: PATH``, so
runs share one vocabulary), or trained on the corpus (``data.tokenizer: bpe``, ...).
"""

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field

import numpy as np

from transformerkit.data import corpora, sources, token_cache, vectors
from transformerkit.data.pipeline import (
    ClassificationBatches,
    LanguageModelBatches,
    TranslationBatches,
    encode_pairs,
    encode_texts,
    split_train_val,
)
from transformerkit.data.sources import CorpusSpec
from transformerkit.data.tokenizers import (
    SUBWORD_KINDS,
    CharTokenizer,
    SubwordTokenizer,
    load_hf_tokenizer,
    load_tokenizer,
)
from transformerkit.files import atomic_path, file_sha256
from transformerkit.models.factory import check_embedding_matrix
from transformerkit.run_directory import RunDirectory

log = logging.getLogger("transformerkit")


@dataclass
class PreparedData:
    """Everything the trainer needs from the data side."""

    train: object  # keras.utils.PyDataset
    val: object  # keras.utils.PyDataset or None
    source_tokenizer: object
    target_tokenizer: object
    val_sources: list = field(default_factory=list)  # raw text, for BLEU and samples
    val_targets: list = field(default_factory=list)  # (a classifier's: label names)
    info: dict = field(default_factory=dict)
    embeddings: dict = field(default_factory=dict)  # {"source"|"target": (vocab, d_model)}
    labels: list = field(default_factory=list)  # a classifier's class names, by class id


def prepare_data(config, run_dir, reuse_tokenizers=False):
    """Load the corpus, train (or reload) tokenizers into ``run_dir``, build the datasets."""
    run = RunDirectory(run_dir)
    if config.model["type"] == "gpt":
        return _prepare_language_model(config, run, reuse_tokenizers)
    if config.model["type"] == "encoder":
        return _prepare_classification(config, run, reuse_tokenizers)
    return _prepare_translation(config, run, reuse_tokenizers)


def _shared_vocab(config):
    """One vocabulary for source and target? An earlier run's or one tokenizer file's
    layout when ``data.tokenizer`` names one, ``model.embeddings.shared`` when vectors are
    named, else ``data.shared_vocab`` (always with ``tie_embeddings: all``)."""
    tie_all = config.model["tie_embeddings"] == "all"
    reused = reused_tokenizer_files(config.data.tokenizer)
    files = vectors.embedding_files(config.model["embeddings"])
    shared = (len(reused) == 1 if reused else "shared" in files if files
              else config.data.shared_vocab or tie_all)
    if tie_all and not shared:
        raise ValueError(
            "model.tie_embeddings: all needs one vocabulary, but " +
            (f"data.tokenizer {config.data.tokenizer!r} has separate source and target "
             "tokenizers" if reused else "model.embeddings names source/target vectors; "
             "name one vectors file as model.embeddings.shared"))
    return shared


def reused_tokenizer_files(value):
    """The tokenizer files ``data.tokenizer`` names for reuse: ``[file]`` (a tokenizer
    .json, or a run directory's shared ``tokenizer.json``), ``[source, target]`` (a run
    directory with a vocabulary per side), or None (a kind to train, or a Hugging Face
    folder). A run directory is a folder with ``config.yaml``. Raises FileNotFoundError for
    a path that does not exist or a run directory without tokenizer files."""
    if value in (*SUBWORD_KINDS, "char"):
        return None
    if os.path.isfile(value):
        return [value]
    run = RunDirectory(value)
    if not os.path.isdir(value):
        raise FileNotFoundError(
            f"data.tokenizer: {value!r} is neither a kind ({', '.join(SUBWORD_KINDS)}, char) "
            "nor an existing path (an earlier run's directory, a tokenizer .json file or a "
            "Hugging Face tokenizer folder)")
    if not os.path.isfile(run.config):
        return None  # a Hugging Face tokenizer folder
    shared, _ = run.tokenizer_paths(shared=True)
    source, target = run.tokenizer_paths(shared=False)
    if os.path.isfile(shared):
        return [shared]
    if os.path.isfile(source) and os.path.isfile(target):
        return [source, target]
    raise FileNotFoundError(f"data.tokenizer: the run directory {value} has no tokenizer "
                            f"files ({os.path.basename(shared)}, or {os.path.basename(source)} "
                            f"and {os.path.basename(target)}); was its training interrupted "
                            "before they were written?")


def _max_length(config):
    return config.data.max_length or config.model["max_length"]


TOKENIZER_CACHE = "tokenizers"  # CACHE_ROOT/tokenizers/<key>/: trained tokenizers
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


def _limit(pairs, n):
    return pairs if n is None else (pairs[0][:n], pairs[1][:n])


def _make_tokenizer(data, texts):
    kind = data.tokenizer
    if kind in SUBWORD_KINDS:
        return SubwordTokenizer.train(texts, kind=kind, vocab_size=data.vocab_size,
                                      lowercase=data.lowercase)
    if kind == "char":
        return CharTokenizer.train(texts)
    reused = reused_tokenizer_files(kind)
    if reused is None:
        return load_hf_tokenizer(kind)
    if len(reused) != 1:
        raise ValueError(f"data.tokenizer: {kind} has separate source and target tokenizers; "
                         "a GPT or an encoder needs one (name one of its files)")
    return load_tokenizer(reused[0])


class _TrainCorpus:
    """The training corpus of a config: how to stream it and what identifies it."""

    def __init__(self, data, cache_root):
        self.limit = data.train_limit
        if data.dataset == "ted_hrlr":
            pair = f"{data.source_lang}_to_{data.target_lang}"
            self.specs, self._pairs = None, _limit(corpora.load_ted_hrlr("train", pair),
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


def _tokenizers(config, run, reuse, corpus, cache_root):
    """The tokenizer(s), saved in ``run``: loaded from it (``reuse``, i.e. ``--resume``),
    built from vectors files, copied from ``data.tokenizer``'s files, fetched from the cache
    or trained. -> ``(source, target, files in run, {side: embedding matrix}``)."""
    if reuse:
        paths = run.tokenizer_paths()
        paths = paths[:1] if paths[0] == paths[1] else list(paths)
        loaded = [load_tokenizer(path) for path in paths]
        return loaded[0], loaded[-1], paths, {}
    shared = _shared_vocab(config)
    source_path, target_path = run.tokenizer_paths(shared)
    paths = [source_path] if shared else [source_path, target_path]
    data = config.data
    files = vectors.embedding_files(config.model["embeddings"])
    reused = reused_tokenizer_files(data.tokenizer)
    if files and reused:
        raise ValueError("model.embeddings builds the vocabulary from its vectors files; "
                         f"data.tokenizer {data.tokenizer!r} names another one: use one")
    if reused:
        for origin, path in zip(reused, paths, strict=True):
            load_tokenizer(origin).save(path)  # checked on the way
    elif len(files) < len(paths):  # a side without vectors
        if data.tokenizer in (*SUBWORD_KINDS, "char"):
            _cached_or_trained(data, config.train.seed, shared, corpus, cache_root,
                               paths)
        else:
            for path in paths:
                _make_tokenizer(data, []).save(path)
    sides = ["shared"] if shared else ["source", "target"]
    read = {side: _vectors_tokenizer(files[side], data.lowercase, path)
            for side, path in zip(sides, paths, strict=True) if side in files}
    loaded = [load_tokenizer(path) for path in paths]
    matrices = {side: vectors.aligned_matrix(read[side], tokenizer)
                for side, tokenizer in zip(sides, loaded, strict=True) if side in read}
    if "shared" in matrices:
        matrices = {"source": matrices["shared"], "target": matrices["shared"]}
    _check_widths(config, matrices)
    return loaded[0], loaded[-1], paths, matrices


def _check_widths(config, matrices):
    """Refuse vectors whose width is not model.d_model before any corpus is encoded."""
    d_model = config.model["d_model"]
    for side, matrix in matrices.items():
        check_embedding_matrix(side, matrix, len(matrix), d_model or matrix.shape[1])


def _vectors_tokenizer(entry, lowercase, path):
    """Read one ``model.embeddings`` entry's vectors, save the tokenizer over their tokens
    at ``path``; -> the :class:`~transformerkit.data.vectors.Vectors`."""
    read = vectors.read_vectors(entry["file"], entry["limit"])
    tokenizer, kind = vectors.vocabulary_tokenizer(read, entry["tokens"], lowercase)
    SubwordTokenizer(tokenizer, kind=kind, lowercase=lowercase).save(path)
    log.info("vocabulary of %d %s from %s (width %d)", tokenizer.get_vocab_size(), kind,
             entry["file"], read.dim)
    return read


def _cached_or_trained(data, seed, shared, corpus, cache_root, paths):
    """Copy the tokenizer(s) trained on this corpus with these settings from the cache into
    ``paths``, or train them on a seeded random sample of ``data.tokenizer_sample`` pairs."""
    parts = {"corpus": corpus.key, "kind": data.tokenizer, "vocab_size": data.vocab_size,
             "lowercase": data.lowercase, "shared": shared,
             "sample": data.tokenizer_sample, "seed": seed}
    folder = os.path.join(cache_root, TOKENIZER_CACHE, token_cache.key_of(parts))
    cached = [os.path.join(folder, os.path.basename(p)) for p in paths]
    if all(os.path.isfile(p) for p in cached):
        try:
            for path in cached:
                load_tokenizer(path)
            for path, target in zip(cached, paths, strict=True):
                with atomic_path(target) as tmp:
                    shutil.copyfile(path, tmp)
            return
        except ValueError as err:
            log.warning("cached tokenizer in %s is unusable (%s); training it again", folder,
                        err)
    pairs, reports = corpus.read()
    sample = sources.reservoir_sample(pairs, data.tokenizer_sample, seed)
    for report in reports:
        report.check_usable()
    source_texts, target_texts = [s for s, _ in sample], [t for _, t in sample]
    texts = [source_texts + target_texts] if shared else [source_texts, target_texts]
    for text, path, copy in zip(texts, paths, cached, strict=True):
        tokenizer = _make_tokenizer(data, text)
        tokenizer.save(path)
        with contextlib.suppress(OSError):  # a read-only cache: train again next time
            tokenizer.save(copy)


def _cache_root(data):
    return os.path.expanduser(data.cache_dir or token_cache.default_cache_root())


def _batching(data, seed):
    pad = data.pad_to_multiple
    if pad is None:  # compiled backends recompile per shape: fewer shapes there
        import keras

        pad = 1 if keras.backend.backend() == "torch" else 8
    common = dict(seed=seed, bucket=data.bucket, pad_to_multiple=pad)
    if data.batch_size is not None:
        return dict(batch_size=data.batch_size, **common)
    return dict(tokens_per_batch=data.tokens_per_batch, **common)


def _prepare_translation(config, run, reuse):
    """Tokenizers and batches of a translation corpus, through the token cache: the
    training pairs are streamed (never held as Python lists), encoded once into
    memory-mapped arrays and batched from those."""
    data, seed = config.data, config.train.seed
    cache_root = _cache_root(data)
    os.makedirs(cache_root, exist_ok=True)
    started = time.monotonic()
    corpus = _TrainCorpus(data, cache_root)
    source_tok, target_tok, tokenizer_files, matrices = _tokenizers(config, run, reuse, corpus,
                                                                     cache_root)
    tokenizers_ready = time.monotonic()
    max_length = _max_length(config)
    parts = {"corpus": corpus.key, "max_length": max_length,
             "tokenizers": [file_sha256(p) for p in tokenizer_files]}
    train_encoded = token_cache.open_or_build(cache_root, parts, corpus.read, source_tok,
                                              target_tok, max_length)
    encoded = time.monotonic()
    reports = [sources.ReadReport(r["corpus"], {k: v for k, v in r.items() if k != "corpus"})
               for r in train_encoded.manifest["read"]]
    for report in reports:
        report.log()
        report.check_usable()
    if not len(train_encoded):
        raise ValueError(f"no training pair fits max_length={max_length} "
                         f"({train_encoded.dropped} longer pairs dropped)")
    train = TranslationBatches(train_encoded, shuffle=True, **_batching(data, seed))
    info = {"train_pairs": len(train_encoded), "dropped_train_pairs": train_encoded.dropped,
            "malformed_train_lines": sum(r.malformed for r in reports),
            "train_corpora": [r.as_dict() for r in reports],
            "token_cache": f"{train_encoded.path} ({train_encoded.status})",
            "tokenizer_seconds": round(tokenizers_ready - started, 2),
            "token_cache_seconds": round(encoded - tokenizers_ready, 2)}
    val_pairs = load_pairs(data, "val")
    val_src, val_tgt = _limit(val_pairs, data.val_limit) if val_pairs else ([], [])
    val = None
    if val_src:  # validation sets are small: encoded in memory
        val_encoded = encode_pairs(val_src, val_tgt, source_tok, target_tok, max_length)
        val = TranslationBatches(val_encoded, shuffle=False, **_batching(data, seed))
        info.update(val_pairs=len(val_encoded.source), dropped_val_pairs=val_encoded.dropped)
    return PreparedData(train, val, source_tok, target_tok, val_src, val_tgt, info, matrices)


def _text_path(data):
    """``data.text`` as given if it exists, else relative to the data directory
    (``data.data_dir`` / ``$TRANSFORMERKIT_DATA``), so configs can say
    ``tinyshakespeare/input.txt``."""
    path = data.text
    if os.path.isfile(path) or os.path.isabs(path):
        return path
    in_data_dir = os.path.join(corpora.resolve_data_dir(data.data_dir), path)
    if os.path.isfile(in_data_dir):
        return in_data_dir
    raise FileNotFoundError(f"data.text: no such file {path!r} (looked in the current "
                            f"directory and in the data directory {in_data_dir!r})")


def _prepare_language_model(config, run, reuse):
    data, seed = config.data, config.train.seed
    if data.dataset != "text" or not data.text:
        raise ValueError("model.type=gpt trains on data.dataset=text with data.text=PATH")
    text = corpora.load_text(_text_path(data))
    train_text, val_text = split_train_val(text, data.val_fraction)
    tokenizer, matrices = _one_tokenizer(
        config, run, reuse,
        lambda: train_text.splitlines() if data.tokenizer != "char" else [train_text])
    block = data.block_size
    if block > config.model["max_length"]:
        raise ValueError(f"data.block_size={block} exceeds model.max_length="
                         f"{config.model['max_length']}")
    train_ids = np.asarray(tokenizer.encode(train_text), dtype="int32")
    val_ids = np.asarray(tokenizer.encode(val_text), dtype="int32")
    batch = data.batch_size or 12
    steps = data.steps_per_epoch or max(1, len(train_ids) // (block * batch))
    train = LanguageModelBatches(train_ids, block, batch, steps_per_epoch=steps, seed=seed)
    val = LanguageModelBatches(val_ids, block, batch, steps_per_epoch=max(1, min(20, steps // 5)),
                               seed=seed + 1)
    info = {"train_tokens": int(len(train_ids)), "val_tokens": int(len(val_ids))}
    return PreparedData(train, val, tokenizer, tokenizer, [val_text[:200]], [], info, matrices)



def _one_tokenizer(config, run, reuse, texts):
    """The one vocabulary of a GPT or an Encoder, saved as ``run``'s ``tokenizer.json``:
    reloaded (``reuse``), built from ``model.embeddings.shared``'s vectors, copied from
    ``data.tokenizer`` (a file, a run, a Hugging Face folder) or trained on ``texts()``.
    -> ``(tokenizer, {"source": matrix} or {})``."""
    data, kind = config.data, config.model["type"]
    path, _ = run.tokenizer_paths(shared=True)
    files = vectors.embedding_files(config.model["embeddings"])
    if set(files) - {"shared"}:
        raise ValueError(f"model.type {kind} has one vocabulary: name its vectors file as "
                         "model.embeddings.shared")
    if reuse:
        return load_tokenizer(path), {}
    if files:
        if reused_tokenizer_files(data.tokenizer):
            raise ValueError("model.embeddings builds the vocabulary from its vectors file; "
                             f"data.tokenizer {data.tokenizer!r} names another one: use one")
        read = _vectors_tokenizer(files["shared"], data.lowercase, path)
        tokenizer = load_tokenizer(path)
        matrices = {"source": vectors.aligned_matrix(read, tokenizer)}
        _check_widths(config, matrices)
        return tokenizer, matrices
    tokenizer = _make_tokenizer(data, texts() if data.tokenizer in (*SUBWORD_KINDS, "char")
                                else [])
    tokenizer.save(path)
    return load_tokenizer(path), {}


_CLASSIFICATION_DATASETS = ("tsv", "files", "parallel")


def _prepare_classification(config, run, reuse):
    """Texts and class labels for an Encoder classifier: ``data.dataset`` tsv or files
    (``data.source_column`` the text, ``data.target_column`` the label) or parallel (a file
    of texts and a file of labels, line by line). The class ids are the sorted label names
    of the training data, written to ``RUN/labels.json`` (``--resume`` reads them back).
    The tokenizer is the pretrained folder's with ``model.pretrained``, else as a GPT's
    (:func:`_one_tokenizer`). Texts are read into memory (a classifier's corpora are small
    next to a translation corpus) and cut to the length limit, as BERT does, never dropped.
    """
    data, model, seed = config.data, config.model, config.train.seed
    if data.dataset not in _CLASSIFICATION_DATASETS:
        raise ValueError("an encoder classifier reads data.dataset "
                         f"{', '.join(_CLASSIFICATION_DATASETS)} (a text and its label per "
                         f"line), not {data.dataset!r}")
    texts, names = _limit(load_pairs(data, "train"), data.train_limit)
    names = [name.strip() for name in names]
    if reuse:
        labels = run.read_labels()
    else:
        labels = sorted(set(names))
        if len(labels) < 2:
            raise ValueError(f"the training data has {len(labels)} distinct label(s) "
                             f"({labels}); a classifier needs at least 2 (is "
                             "data.target_column the label column?)")
        run.write_labels(labels)
    max_length = _max_length(config)
    if model["pretrained"] is not None:
        from transformerkit.models.pretrained import load_hf_config

        tokenizer_path, _ = run.tokenizer_paths(shared=True)
        if not reuse:
            load_hf_tokenizer(model["pretrained"]).save(tokenizer_path)
        tokenizer, matrices = load_tokenizer(tokenizer_path), {}
        positions = load_hf_config(model["pretrained"]).get("max_position_embeddings")
        max_length = min(max_length, positions or max_length)
    else:
        tokenizer, matrices = _one_tokenizer(
            config, run, reuse,
            lambda: sources.reservoir_sample(texts, data.tokenizer_sample, seed))
    train_encoded = encode_texts(texts, tokenizer, max_length,
                                 _label_ids(names, labels, "training"))
    train = ClassificationBatches(train_encoded, shuffle=True, **_batching(data, seed))
    info = {"train_texts": len(train_encoded), "classes": len(labels),
            "truncated_train_texts": train_encoded.truncated}
    val_pairs = load_pairs(data, "val")
    val_texts, val_names, val = [], [], None
    if val_pairs:
        val_texts, val_names = _limit(val_pairs, data.val_limit)
        val_names = [name.strip() for name in val_names]
        val_encoded = encode_texts(val_texts, tokenizer, max_length,
                                   _label_ids(val_names, labels, "validation"))
        val = ClassificationBatches(val_encoded, shuffle=False, **_batching(data, seed))
        info.update(val_texts=len(val_encoded))
    return PreparedData(train, val, tokenizer, tokenizer, list(val_texts), val_names, info,
                        matrices, labels)


def _label_ids(names, labels, split):
    """Class ids of label ``names``; a label the training data lacks is a ValueError."""
    index = {label: i for i, label in enumerate(labels)}
    unknown = sorted(set(names) - set(index))
    if unknown:
        raise ValueError(f"the {split} data has label(s) {unknown[:5]} that the training data "
                         f"does not (its classes: {labels[:20]})")
    return np.array([index[name] for name in names], dtype="int32")
