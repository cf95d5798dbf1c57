"""From the ``data:`` section of a config to tokenizers and ``model.fit``-ready datasets."""

import os
from dataclasses import dataclass, field

import numpy as np

from transformerkit.data import corpora
from transformerkit.data.pipeline import (
    LanguageModelBatches,
    TranslationBatches,
    encode_pairs,
    split_train_val,
)
from transformerkit.data.tokenizers import (
    SUBWORD_KINDS,
    CharTokenizer,
    SubwordTokenizer,
    load_hf_tokenizer,
    load_tokenizer,
)
from transformerkit.run_directory import RunDirectory


@dataclass
class PreparedData:
    """Everything the trainer needs from the data side."""

    train: object  # keras.utils.PyDataset
    val: object  # keras.utils.PyDataset or None
    source_tokenizer: object
    target_tokenizer: object
    val_sources: list = field(default_factory=list)  # raw text, for BLEU and samples
    val_targets: list = field(default_factory=list)
    info: dict = field(default_factory=dict)


def prepare_data(config, run_dir, reuse_tokenizers=False):
    """Load the corpus, train (or reload) tokenizers into ``run_dir``, build the datasets."""
    run = RunDirectory(run_dir)
    if config["model"]["type"] == "gpt":
        return _prepare_language_model(config, run, reuse_tokenizers)
    return _prepare_translation(config, run, reuse_tokenizers)


def _shared_vocab(config):
    return config["data"]["shared_vocab"] or config["model"]["tie_embeddings"] == "all"


def _max_length(config):
    return config["data"]["max_length"] or config["model"]["max_length"]


def load_pairs(data, split):
    """(sources, targets) of ``split`` ("train" or "val") for the configured dataset; None
    for a "val" split the config names no files for."""
    kind = data["dataset"]
    if kind == "multi30k":
        return corpora.load_multi30k(split, data["source_lang"], data["target_lang"],
                                     data_dir=data["data_dir"])
    if kind == "parallel":
        src, tgt = data[f"{split}_source"], data[f"{split}_target"]
        if src is None or tgt is None:
            if split == "val":
                return None
            raise ValueError("data.dataset=parallel needs data.train_source and "
                             "data.train_target")
        return corpora.read_parallel(src, tgt)
    if kind == "tsv":
        path = data[f"{split}_tsv"]
        if path is None:
            if split == "val":
                return None
            raise ValueError("data.dataset=tsv needs data.train_tsv")
        return corpora.read_tsv(path)
    if kind == "ted_hrlr":
        return corpora.load_ted_hrlr("validation" if split == "val" else split,
                                     f"{data['source_lang']}_to_{data['target_lang']}")
    raise ValueError(f"data.dataset={kind!r} is not a translation dataset; expected multi30k, "
                     "parallel, tsv or ted_hrlr (use dataset=text with model.type=gpt)")


def _limit(pairs, n):
    return pairs if n is None else (pairs[0][:n], pairs[1][:n])


def _make_tokenizer(data, texts):
    kind = data["tokenizer"]
    if kind in SUBWORD_KINDS:
        return SubwordTokenizer.train(texts, kind=kind, vocab_size=data["vocab_size"],
                                      lowercase=data["lowercase"])
    if kind == "char":
        return CharTokenizer.train(texts)
    if os.path.isdir(kind):
        return load_hf_tokenizer(kind)
    raise ValueError(f"data.tokenizer must be bpe, wordpiece, unigram, char or a tokenizer "
                     f"folder; got {kind!r}")


def _tokenizers(config, run, reuse, source_texts, target_texts):
    shared = _shared_vocab(config)
    source_path, target_path = run.tokenizer_paths(shared)
    if reuse:
        source = load_tokenizer(source_path)
        return source, (source if shared else load_tokenizer(target_path))
    data = config["data"]
    if shared:
        source = _make_tokenizer(data, list(source_texts) + list(target_texts))
        source.save(source_path)
        return source, source
    source = _make_tokenizer(data, source_texts)
    target = _make_tokenizer(data, target_texts)
    source.save(source_path)
    target.save(target_path)
    return source, target


def _batching(data, seed):
    pad = data["pad_to_multiple"]
    if pad is None:  # compiled backends recompile per shape: fewer shapes there
        import keras

        pad = 1 if keras.backend.backend() == "torch" else 8
    common = dict(seed=seed, bucket=data["bucket"], pad_to_multiple=pad)
    if data["batch_size"] is not None:
        return dict(batch_size=data["batch_size"], **common)
    return dict(tokens_per_batch=data["tokens_per_batch"], **common)


def _prepare_translation(config, run, reuse):
    data, seed = config["data"], config["train"]["seed"]
    train_src, train_tgt = _limit(load_pairs(data, "train"), data["train_limit"])
    val_pairs = load_pairs(data, "val")
    val_src, val_tgt = _limit(val_pairs, data["val_limit"]) if val_pairs else ([], [])
    source_tok, target_tok = _tokenizers(config, run, reuse, train_src, train_tgt)
    max_length = _max_length(config)
    train_encoded = encode_pairs(train_src, train_tgt, source_tok, target_tok, max_length)
    if not train_encoded.source:
        raise ValueError(f"no training pair fits max_length={max_length}")
    train = TranslationBatches(train_encoded, shuffle=True, **_batching(data, seed))
    val, info = None, {"train_pairs": len(train_encoded.source),
                       "dropped_train_pairs": train_encoded.dropped}
    if val_src:
        val_encoded = encode_pairs(val_src, val_tgt, source_tok, target_tok, max_length)
        val = TranslationBatches(val_encoded, shuffle=False, **_batching(data, seed))
        info.update(val_pairs=len(val_encoded.source), dropped_val_pairs=val_encoded.dropped)
    return PreparedData(train, val, source_tok, target_tok, val_src, val_tgt, info)


def _text_path(data):
    """``data.text`` as given if it exists, else relative to the data directory
    (``data.data_dir`` / ``$TRANSFORMERKIT_DATA``), so configs can say
    ``tinyshakespeare/input.txt``."""
    path = data["text"]
    if os.path.isfile(path) or os.path.isabs(path):
        return path
    in_data_dir = os.path.join(corpora.resolve_data_dir(data["data_dir"]), path)
    if os.path.isfile(in_data_dir):
        return in_data_dir
    raise FileNotFoundError(f"data.text: no such file {path!r} (looked in the current "
                            f"directory and in the data directory {in_data_dir!r})")


def _prepare_language_model(config, run, reuse):
    data, seed = config["data"], config["train"]["seed"]
    if data["dataset"] != "text" or not data["text"]:
        raise ValueError("model.type=gpt trains on data.dataset=text with data.text=PATH")
    text = corpora.load_text(_text_path(data))
    train_text, val_text = split_train_val(text, data["val_fraction"])
    path, _ = run.tokenizer_paths(shared=True)
    if reuse:
        tokenizer = load_tokenizer(path)
    else:
        tokenizer = _make_tokenizer(data, train_text.splitlines() if data["tokenizer"] !=
                                    "char" else [train_text])
        tokenizer.save(path)
    block = data["block_size"]
    if block > config["model"]["max_length"]:
        raise ValueError(f"data.block_size={block} exceeds model.max_length="
                         f"{config['model']['max_length']}")
    train_ids = np.asarray(tokenizer.encode(train_text), dtype="int32")
    val_ids = np.asarray(tokenizer.encode(val_text), dtype="int32")
    batch = data["batch_size"] or 12
    steps = data["steps_per_epoch"] or max(1, len(train_ids) // (block * batch))
    train = LanguageModelBatches(train_ids, block, batch, steps_per_epoch=steps, seed=seed)
    val = LanguageModelBatches(val_ids, block, batch, steps_per_epoch=max(1, min(20, steps // 5)),
                               seed=seed + 1)
    info = {"train_tokens": int(len(train_ids)), "val_tokens": int(len(val_ids))}
    return PreparedData(train, val, tokenizer, tokenizer, [val_text[:200]], [], info)

