"""The tokenizers of a run: built from vectors files, copied from ``data.tokenizer``'s
files, fetched from the tokenizer cache or trained on the corpus, saved in the run directory.

Where the tokenizers come from, per side: built from the tokens of a pretrained vectors file
(``model.embeddings``, :mod:`transformerkit.data.vectors`; the matrix laid out by id goes to
the model), copied from an earlier run or a tokenizer file (``data.tokenizer: PATH``, so
runs share one vocabulary), or trained on a seeded sample of the corpus (``data.tokenizer:
bpe``, ``sentencepiece``, ...) and cached by corpus and settings under
``CACHE_ROOT/tokenizers/``. A SentencePiece vocabulary is kept as a ``.model`` file
(``tokenizer.model``), the others as json (``tokenizer.json``).
"""

import contextlib
import logging
import os
import shutil

from transformerkit.data import sources, token_cache, vectors
from transformerkit.data.sentencepiece_tokenizer import (
    SENTENCEPIECE_KINDS,
    SentencePieceTokenizer,
    is_sentencepiece_file,
)
from transformerkit.data.tokenizers import (
    SUBWORD_KINDS,
    CharTokenizer,
    SubwordTokenizer,
    load_hf_tokenizer,
    load_tokenizer,
)
from transformerkit.files import atomic_path
from transformerkit.models.factory import check_embedding_matrix
from transformerkit.run_directory import RunDirectory

log = logging.getLogger("transformerkit")

TOKENIZER_CACHE = "tokenizers"  # CACHE_ROOT/tokenizers/<key>/: trained tokenizers
TRAINED_KINDS = (*SUBWORD_KINDS, *SENTENCEPIECE_KINDS, "char")  # data.tokenizer: train these
IMPORTED_KINDS = ("marian",)  # data.tokenizer of an imported run: its model's own vocabulary


def shared_vocab(config):
    """One vocabulary for source and target? An earlier run's or one tokenizer file's
    layout when ``data.tokenizer`` names one, ``model.embeddings.shared`` when vectors are
    named, else ``data.shared_vocab`` (always with ``tie_embeddings: all``)."""
    tie_all = config.model.tie_embeddings == "all"
    reused = reused_tokenizer_files(config.data.tokenizer)
    files = vectors.embedding_files(config.model.embeddings)
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
    .json or SentencePiece .model file, or a run directory's shared ``tokenizer.json`` /
    ``tokenizer.model``), ``[source, target]`` (a run
    directory with a vocabulary per side), or None (a kind to train, or a Hugging Face
    folder). A run directory is a folder with ``config.yaml``. Raises FileNotFoundError for
    a path that does not exist or a run directory without tokenizer files."""
    if value in TRAINED_KINDS:
        return None
    if value in IMPORTED_KINDS:
        raise ValueError(f"data.tokenizer: {value} is the vocabulary of an imported model "
                         "(transformerkit import), which comes with its weights and is never "
                         "trained: fine-tune the imported run with model.pretrained (see "
                         "docs/pretrained.md)")
    if os.path.isfile(value):
        return [value]
    run = RunDirectory(value)
    if not os.path.isdir(value):
        raise FileNotFoundError(
            f"data.tokenizer: {value!r} is neither a kind ({', '.join(TRAINED_KINDS)}) "
            "nor an existing path (an earlier run's directory, a tokenizer .json file, a "
            "SentencePiece .model file or a Hugging Face tokenizer folder)")
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


def make_tokenizer(data, texts):
    kind = data.tokenizer
    if kind in SUBWORD_KINDS:
        return SubwordTokenizer.train(texts, kind=kind, vocab_size=data.vocab_size,
                                      lowercase=data.lowercase)
    if kind in SENTENCEPIECE_KINDS:
        return SentencePieceTokenizer.train(texts, kind=kind, vocab_size=data.vocab_size,
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


def run_tokenizers(config, run, reuse, corpus, cache_root):
    """The tokenizer(s), saved in ``run``: loaded from it (``reuse``, i.e. ``--resume``),
    built from vectors files, copied from ``data.tokenizer``'s files, fetched from the cache
    or trained. -> ``(source, target, files in run, {side: embedding matrix}``)."""
    if reuse:
        paths = run.tokenizer_paths()
        paths = paths[:1] if paths[0] == paths[1] else list(paths)
        loaded = [load_tokenizer(path) for path in paths]
        return loaded[0], loaded[-1], paths, {}
    shared = shared_vocab(config)
    data = config.data
    files = vectors.embedding_files(config.model.embeddings)
    reused = reused_tokenizer_files(data.tokenizer)
    if files and reused:
        raise ValueError("model.embeddings builds the vocabulary from its vectors files; "
                         f"data.tokenizer {data.tokenizer!r} names another one: use one")
    if files and data.tokenizer in SENTENCEPIECE_KINDS and len(files) < 2 - shared:
        raise ValueError(f"model.embeddings builds one side's vocabulary from its vectors "
                         f"file, and a run keeps its vocabularies in one format: "
                         f"data.tokenizer: {data.tokenizer} cannot train the other; use bpe, "
                         "wordpiece or unigram, or vectors for both sides")
    source_path, target_path = run.tokenizer_paths(
        shared, suffix=_suffix(data.tokenizer, reused, files))
    paths = [source_path] if shared else [source_path, target_path]
    run.remove_other_tokenizers(paths)
    if reused:
        for origin, path in zip(reused, paths, strict=True):
            load_tokenizer(origin).save(path)  # checked on the way
    elif len(files) < len(paths):  # a side without vectors
        if data.tokenizer in TRAINED_KINDS:
            _cached_or_trained(data, config.train.seed, shared, corpus, cache_root,
                               paths)
        else:
            for path in paths:
                make_tokenizer(data, []).save(path)
    sides = ["shared"] if shared else ["source", "target"]
    read = {side: _vectors_tokenizer(files[side], data.lowercase, path)
            for side, path in zip(sides, paths, strict=True) if side in files}
    loaded = [load_tokenizer(path) for path in paths]
    matrices = {side: vectors.aligned_matrix(read[side], tokenizer)
                for side, tokenizer in zip(sides, loaded, strict=True) if side in read}
    if "shared" in matrices:
        matrices = {"source": matrices["shared"], "target": matrices["shared"]}
    check_widths(config, matrices)
    return loaded[0], loaded[-1], paths, matrices


def _suffix(value, reused, files):
    """The run's tokenizer file suffix: ``.model`` for SentencePiece models (trained, or
    copied from ``.model`` files), else ``.json`` (vectors files' vocabularies too)."""
    if files:
        return ".json"
    if value in SENTENCEPIECE_KINDS or (reused and is_sentencepiece_file(reused[0])):
        return ".model"
    return ".json"


def check_widths(config, matrices):
    """Refuse vectors whose width is not model.d_model before any corpus is encoded."""
    d_model = config.model.d_model
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
        tokenizer = make_tokenizer(data, text)
        tokenizer.save(path)
        with contextlib.suppress(OSError):  # a read-only cache: train again next time
            tokenizer.save(copy)


def one_tokenizer(config, run, reuse, texts):
    """The one vocabulary of a GPT or an Encoder, saved as ``run``'s ``tokenizer.json`` (an
    Encoder's SentencePiece model: ``tokenizer.model``): reloaded (``reuse``), built from
    ``model.embeddings.shared``'s vectors, copied from ``data.tokenizer`` (a file, a run, a
    Hugging Face folder) or trained on ``texts()``. A GPT refuses SentencePiece, which
    drops line breaks. -> ``(tokenizer, {"source": matrix} or {})``."""
    data, kind = config.data, config.model.type
    files = vectors.embedding_files(config.model.embeddings)
    if set(files) - {"shared"}:
        raise ValueError(f"model.type {kind} has one vocabulary: name its vectors file as "
                         "model.embeddings.shared")
    if reuse:
        return load_tokenizer(run.tokenizer_paths(shared=True)[0]), {}
    reused = reused_tokenizer_files(data.tokenizer)
    if files and reused:
        raise ValueError("model.embeddings builds the vocabulary from its vectors file; "
                         f"data.tokenizer {data.tokenizer!r} names another one: use one")
    suffix = _suffix(data.tokenizer, reused, files)
    if kind == "gpt" and suffix == ".model":
        raise ValueError(f"data.tokenizer: {data.tokenizer} is a SentencePiece model, which "
                         "turns line breaks into spaces (its normalization), and a GPT's text "
                         "needs them: use bpe or char for a GPT")
    path, _ = run.tokenizer_paths(shared=True, suffix=suffix)
    run.remove_other_tokenizers([path])
    if files:
        read = _vectors_tokenizer(files["shared"], data.lowercase, path)
        tokenizer = load_tokenizer(path)
        matrices = {"source": vectors.aligned_matrix(read, tokenizer)}
        check_widths(config, matrices)
        return tokenizer, matrices
    tokenizer = make_tokenizer(data, texts() if data.tokenizer in TRAINED_KINDS else [])
    tokenizer.save(path)
    return load_tokenizer(path), {}
