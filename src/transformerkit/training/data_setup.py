"""From the ``data:`` section of a config to tokenizers and ``model.fit``-ready datasets,
one preparation per task: translation pairs, a GPT's text, an encoder classifier's texts and
labels.

Translation corpora go through the token cache (:mod:`transformerkit.data.token_cache`):
read as streams (:mod:`transformerkit.training.corpus_specs`), tokenizers made by
:mod:`transformerkit.training.tokenizer_setup` (trained on a seeded sample and cached by
corpus and settings), ids encoded once into memory-mapped arrays that later runs and
``--resume`` reuse.
"""

import os
import time
from dataclasses import dataclass, field

import numpy as np

from transformerkit.data import corpora, sources, token_cache
from transformerkit.data.pipeline import (
    ClassificationBatches,
    LanguageModelBatches,
    TranslationBatches,
    encode_pairs,
    encode_texts,
    split_train_val,
)
from transformerkit.data.tokenizers import load_tokenizer
from transformerkit.files import file_sha256
from transformerkit.run_directory import RunDirectory
from transformerkit.training.corpus_specs import (  # noqa: F401 (corpus_specs: public here too)
    TrainCorpus,
    corpus_specs,
    limit_pairs,
    load_pairs,
)
from transformerkit.training.tokenizer_setup import (  # noqa: F401 (reused_tokenizer_files too)
    one_tokenizer,
    reused_tokenizer_files,
    run_tokenizers,
)


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
    if config.model.type == "gpt":
        return _prepare_language_model(config, run, reuse_tokenizers)
    if config.model.type == "encoder":
        return _prepare_classification(config, run, reuse_tokenizers)
    return _prepare_translation(config, run, reuse_tokenizers)


def _max_length(config):
    return config.data.max_length or config.model.max_length


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
    corpus = TrainCorpus(data, cache_root)
    source_tok, target_tok, tokenizer_files, matrices = run_tokenizers(config, run, reuse, corpus,
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
    val_src, val_tgt = limit_pairs(val_pairs, data.val_limit) if val_pairs else ([], [])
    val = None
    if val_src:  # validation sets are small: encoded in memory
        val_encoded = encode_pairs(val_src, val_tgt, source_tok, target_tok, max_length)
        val = TranslationBatches(val_encoded, shuffle=False, **_batching(data, seed))
        info.update(val_pairs=len(val_encoded.source), dropped_val_pairs=val_encoded.dropped)
    return PreparedData(train, val, source_tok, target_tok, val_src, val_tgt, info, matrices)


def _text_path(data):
    """``data.text`` as given if it exists, else relative to the data directory
    (``data.data_dir`` / ``$TRANSFORMERKIT_DATA``), so configs can say
    ``tinyshakespeare/input.txt``: a file of ``corpora.KNOWN_TEXTS`` is downloaded there
    (and checked) when missing."""
    path = data.text
    if os.path.isfile(path) or os.path.isabs(path):
        return path
    in_data_dir = os.path.join(corpora.resolve_data_dir(data.data_dir), path)
    if os.path.isfile(in_data_dir):
        return in_data_dir
    known = os.path.normpath(path).replace(os.sep, "/")
    if known in corpora.KNOWN_TEXTS:
        return str(corpora.known_text(known, data.data_dir))
    raise FileNotFoundError(f"data.text: no such file {path!r} (looked in the current "
                            f"directory and in the data directory {in_data_dir!r})")


def _prepare_language_model(config, run, reuse):
    data, seed = config.data, config.train.seed
    if data.dataset != "text" or not data.text:
        raise ValueError("model.type=gpt trains on data.dataset=text with data.text=PATH")
    text = corpora.load_text(_text_path(data))
    train_text, val_text = split_train_val(text, data.val_fraction)
    tokenizer, matrices = one_tokenizer(
        config, run, reuse,
        lambda: train_text.splitlines() if data.tokenizer != "char" else [train_text])
    block = data.block_size
    if block > config.model.max_length:
        raise ValueError(f"data.block_size={block} exceeds model.max_length="
                         f"{config.model.max_length}")
    train_ids = np.asarray(tokenizer.encode(train_text), dtype="int32")
    val_ids = np.asarray(tokenizer.encode(val_text), dtype="int32")
    batch = data.batch_size or 12
    steps = data.steps_per_epoch or max(1, len(train_ids) // (block * batch))
    train = LanguageModelBatches(train_ids, block, batch, steps_per_epoch=steps, seed=seed)
    val = LanguageModelBatches(val_ids, block, batch, steps_per_epoch=max(1, min(20, steps // 5)),
                               seed=seed + 1)
    info = {"train_tokens": int(len(train_ids)), "val_tokens": int(len(val_ids))}
    return PreparedData(train, val, tokenizer, tokenizer, [val_text[:200]], [], info, matrices)


_CLASSIFICATION_DATASETS = ("tsv", "files", "parallel")


def _prepare_classification(config, run, reuse):
    """Texts and class labels for an Encoder classifier: ``data.dataset`` tsv or files
    (``data.source_column`` the text, ``data.target_column`` the label) or parallel (a file
    of texts and a file of labels, line by line). The class ids are the sorted label names
    of the training data, written to ``RUN/labels.json`` (``--resume`` reads them back).
    The tokenizer is the pretrained folder's with ``model.pretrained``, else as a GPT's
    (:func:`one_tokenizer`). Texts are read into memory (a classifier's corpora are small
    next to a translation corpus) and cut to the length limit, as BERT does, never dropped.
    """
    data, model, seed = config.data, config.model, config.train.seed
    if data.dataset not in _CLASSIFICATION_DATASETS:
        raise ValueError("an encoder classifier reads data.dataset "
                         f"{', '.join(_CLASSIFICATION_DATASETS)} (a text and its label per "
                         f"line), not {data.dataset!r}")
    texts, names = limit_pairs(load_pairs(data, "train"), data.train_limit)
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
    if model.pretrained is not None:
        from transformerkit.converters import bert

        tokenizer_path, _ = run.tokenizer_paths(shared=True, suffix=None if reuse else ".json")
        if not reuse:
            run.remove_other_tokenizers([tokenizer_path])
            bert.convert_tokenizer(model.pretrained).save(tokenizer_path)
        tokenizer, matrices = load_tokenizer(tokenizer_path), {}
        positions = bert.load_config(model.pretrained).get("max_position_embeddings")
        max_length = min(max_length, positions or max_length)
    else:
        tokenizer, matrices = one_tokenizer(
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
        val_texts, val_names = limit_pairs(val_pairs, data.val_limit)
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
