"""The ``data:`` and ``train:`` sections of a run config, each key declared once (the
``search:`` section is :class:`~transformerkit.decoding.options.SearchOptions`).

:class:`DataOptions` and :class:`TrainOptions` are frozen dataclasses, declared as the
models' options are (:func:`transformerkit.declared.option`): each field has its default,
its type (the annotation: ``int | None`` may be null, ``int | str`` takes either), its
allowed range or choices and one line of meaning. Everything else is derived from them:
the config schema (:func:`transformerkit.config.schema`), the checks a value gets when a
config is read (:func:`check_value`: type, null, range, choices, by
:func:`transformerkit.declared.check`, worded as YAML writes values), ``transformerkit
config`` and the ``--set data.KEY=VALUE`` overrides. What involves several keys
(``average_last`` needs as many ``checkpoints_to_keep``, ...) is checked in code by
:mod:`transformerkit.config.loading`.

A ``train:`` key that means what a field of the decoding options means
(:mod:`transformerkit.decoding.options`, whose :class:`SearchOptions` is the ``search:``
section itself) names that field in ``decoding=`` and, where its default differs, says why
in ``differs=``;
``tests/config/test_config.py`` checks the pairs against the decoding options, so no default is
written twice silently.

They live in the ``config`` package (level 2 of ``tests/test_layout.py``), not in
``training/`` (level 3): ``config`` parses YAML into them and must not import upward, while
the trainer, the data setup, the monitors, the reports and the CLI (levels 3 and 5) import
them downward. Plain Python, no Keras: the CLI reads these to print the config.
"""

import copy
import dataclasses
from dataclasses import dataclass, fields

from transformerkit.declared import check, option
from transformerkit.declared import nullable as nullable  # tests/config/test_config.py reads it

STOPPING_METRICS = ("val_loss", "val_bleu", "val_accuracy")
TRAIN_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")  # Keras dtype policies
TRAIN_PRECISIONS = ("auto", *TRAIN_POLICIES)  # train.precision: auto is resolved per machine
OPTIMIZERS = ("paper", "adamw_cosine")
COOLDOWN_SHAPES = ("linear", "1-sqrt")
DISTRIBUTIONS = ("none", "data_parallel", "model_parallel")
DATASETS = ("multi30k", "parallel", "tsv", "files", "text", "ted_hrlr")
DATA_DIR_DATASETS = ("multi30k", "text")  # the datasets that read the data directory
SAMPLE_UNITS = ("epoch", "step")


class ConfigError(ValueError):
    """A configuration problem; the message names the key or file."""


YAML_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false",
              list: "a list", dict: "a mapping"}
"""How a config error names each type: as YAML writes it."""


def config_error(name, problem):
    """The :class:`ConfigError` of a :class:`~transformerkit.declared.Problem` with key
    ``name`` (``"train.epochs"``), in YAML's words (null, true/false)."""
    return ConfigError(problem.message(name, YAML_NAMES, null="nothing (null)"))


def check_value(name, f, value):
    """``value`` of field ``f`` (``name``: ``"train.epochs"``) checked against its
    declaration and normalised (an integer where a number is expected becomes a float);
    a :class:`ConfigError` naming the key otherwise."""
    value, problem = check(f, value)
    if problem:
        raise config_error(name, problem)
    return value


class _Section:
    """Checks every field on construction (a :class:`ConfigError` naming ``section.key``);
    :meth:`to_dict` and :meth:`replace`."""

    SECTION = ""  # the YAML section's name

    def __post_init__(self):
        for f in fields(self):
            value = check_value(f"{self.SECTION}.{f.name}", f, getattr(self, f.name))
            object.__setattr__(self, f.name, value)

    @classmethod
    def keys(cls):
        """The section's keys, in declaration order (``transformerkit config``'s order)."""
        return [f.name for f in fields(cls)]

    def to_dict(self):
        """``{key: value}`` of every key, as ``config.yaml`` holds the section (a copy: its
        lists are not this object's)."""
        return copy.deepcopy({f.name: getattr(self, f.name) for f in fields(self)})

    def replace(self, **changes):
        """A copy with ``changes`` (checked again; the checks across keys are
        :meth:`RunConfig.replace`'s)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class DataOptions(_Section):
    """``data:``: the corpus, the tokenizers and the batches."""

    SECTION = "data"

    dataset: str = option("multi30k", choices=DATASETS,
                          help="the corpus: multi30k (downloaded), parallel (two files), tsv, "
                               "files (train_files: text/tsv/jsonl, several), text (GPT), "
                               "ted_hrlr (tensorflow-datasets)")
    data_dir: str | None = option(None, help="data directory (null: $TRANSFORMERKIT_DATA, else "
                                             "~/.cache/transformerkit); `train --data-dir` sets "
                                             "it; a run records the one it read")
    source_lang: str = option("de", help="source language (multi30k, ted_hrlr)")
    target_lang: str = option("en", help="target language (multi30k, ted_hrlr)")
    train_source: str | None = option(None, help="dataset parallel: training source "
                                                 "sentences, one per line")
    train_target: str | None = option(None, help="dataset parallel: training target "
                                                 "sentences, line by line with train_source")
    val_source: str | None = option(None, help="dataset parallel: validation source sentences "
                                               "(null: no validation)")
    val_target: str | None = option(None, help="dataset parallel: validation target sentences")
    train_tsv: str | None = option(None, help="dataset tsv: training pairs, SOURCE<TAB>TARGET "
                                              "per line")
    val_tsv: str | None = option(None, help="dataset tsv: validation pairs (null: no "
                                            "validation)")
    test_source: str | None = option(None, help="dataset parallel: test source sentences "
                                                "(`evaluate --split test`)")
    test_target: str | None = option(None, help="dataset parallel: test target sentences")
    test_tsv: str | None = option(None, help="dataset tsv: test pairs (`evaluate --split "
                                             "test`)")
    train_files: list | None = option(None, help="dataset files: training corpora, each a path "
                                                 "(.tsv or .jsonl, optionally .gz) or a mapping "
                                                 "{path | source + target, format, and any of "
                                                 "the reading keys below}")
    val_files: list | None = option(None, help="dataset files: validation corpora, as "
                                               "train_files (null: no validation)")
    test_files: list | None = option(None, help="dataset files: test corpora for `evaluate "
                                                "--split test`")
    source_column: int | str = option(0, help="tsv: the source column, 0-based index or "
                                              "header name")
    target_column: int | str = option(1, help="tsv: the target column, 0-based index or "
                                              "header name")
    header: bool = option(False, help="tsv: the first line names the columns (not a pair)")
    source_key: str = option("source", help="jsonl: the field holding the source sentence")
    target_key: str = option("target", help="jsonl: the field holding the target sentence")
    tokenizer_sample: int = option(1_000_000, minimum=1,
                                   help="train the tokenizer(s) on a random sample of this "
                                        "many training pairs")
    cache_dir: str | None = option(None, help="where encoded corpora are cached and "
                                              "memory-mapped (null: token-cache in "
                                              "$TRANSFORMERKIT_CACHE, else in "
                                              "$XDG_CACHE_HOME/transformerkit or "
                                              "~/.cache/transformerkit)")
    text: str | None = option(None, help="dataset text: the text file a GPT trains on (also "
                                         "looked up in the data directory)")
    tokenizer: str = option("bpe", help="bpe, wordpiece or unigram (trained on the training "
                                        "text), sentencepiece (unigram) or sentencepiece-bpe "
                                        "(trained by SentencePiece, kept as a .model file), "
                                        "char, or a path: an earlier run's directory (reuses "
                                        "its vocabulary), a tokenizer .json or SentencePiece "
                                        ".model file or a Hugging Face tokenizer folder; "
                                        "marian: an imported Marian model's own vocabulary "
                                        "(written by transformerkit import, never trained)")
    vocab_size: int = option(8000, minimum=1,
                             help="vocabulary size of a trained subword tokenizer (sentencepiece"
                                  " unigram: at most this many)")
    lowercase: bool = option(False, help="lowercase the text before subword tokenization")
    shared_vocab: bool = option(True, help="one tokenizer for source and target (always with "
                                           "model.tie_embeddings: all)")
    max_length: int | None = option(None, minimum=1,
                                    help="drop pairs longer than this many tokens on either "
                                         "side (null: model.max_length)")
    tokens_per_batch: int = option(4096, minimum=1,
                                   help="token budget of a batch (rows x longest row, "
                                        "padded), unless batch_size")
    batch_size: int | None = option(None, minimum=1,
                                    help="rows per batch instead of tokens_per_batch (GPT: "
                                         "sequences per batch, null: 12)")
    bucket: bool = option(True, help="batch pairs of similar length together "
                                     "(tokens_per_batch needs it)")
    pad_to_multiple: int | None = option(None, minimum=1,
                                         help="pad batch widths to a multiple of this (null: "
                                              "1 on torch, 8 on jax and tensorflow: fewer "
                                              "shapes to compile)")
    train_limit: int | None = option(None, minimum=1, help="use only the first N training "
                                                           "pairs (null: all)")
    val_limit: int | None = option(None, minimum=1, help="use only the first N validation "
                                                         "pairs (null: all)")
    block_size: int = option(64, minimum=1, help="GPT: tokens per training sequence (at most "
                                                 "model.max_length)")
    val_fraction: float = option(0.1, above=0.0, below=1.0,
                                 help="GPT: the fraction at the end of data.text held out for "
                                      "validation")
    steps_per_epoch: int | None = option(None, minimum=1,
                                         help="GPT: batches per epoch (null: one pass over "
                                              "the training text)")


@dataclass(frozen=True, kw_only=True)
class TrainOptions(_Section):
    """``train:``: optimizer, stopping, precision, devices, evaluation and monitors."""

    SECTION = "train"

    epochs: int = option(10, minimum=1,
                         help="passes over the training data (raised if max_steps needs more)")
    max_steps: int | None = option(None, minimum=1, help="stop after this many optimizer steps "
                                                         "(null: no limit)")
    time_budget: str | None = option(None, help="stop after this much training time: 90s, "
                                                "10m, 1.5h (null: no limit)")
    seed: int = option(0, help="random seed: weights, dropout, batch order")
    warmup_steps: int = option(4000, minimum=1,
                               help="learning-rate warmup steps (paper schedule, or "
                                    "adamw_cosine's linear warmup)")
    lr_scale: float = option(1.0, above=0.0,
                             help="factor on the paper's schedule d_model^-0.5 * "
                                  "min(step^-0.5, step * warmup_steps^-1.5)")
    learning_rate: float | None = option(None, above=0.0,
                                         help="paper: a constant rate instead of the "
                                              "schedule; adamw_cosine: the peak (null: 1e-3)")
    label_smoothing: float = option(0.1, minimum=0.0, below=1.0,
                                    help="label smoothing of the cross-entropy loss")
    optimizer: str = option("paper", choices=OPTIMIZERS,
                            help="paper: Adam(0.9, 0.98, 1e-9) on the warmup schedule; "
                                 "adamw_cosine: nanoGPT's AdamW, warmup, cosine decay")
    cooldown: float | None = option(None, minimum=0.0, maximum=1.0,
                                    help="share of the run's last updates over which the "
                                         "learning rate falls to zero, fitted to the end of "
                                         "train.time_budget (from the measured update rate) "
                                         "or max_steps (null: 0.2 for the paper optimizer "
                                         "with a time budget or max_steps, else 0; 0: off)")
    cooldown_shape: str = option("linear", choices=COOLDOWN_SHAPES,
                                 help="the cooldown's factor on the schedule: linear (1 - p) "
                                      "or 1-sqrt (1 - sqrt(p)), p its progress 0 -> 1")
    min_learning_rate: float | None = option(None, above=0.0,
                                             help="adamw_cosine: where the cosine decay ends, "
                                                  "at the run's last step (null: "
                                                  "learning_rate / 10)")
    weight_decay: float = option(0.1, minimum=0.0,
                                 help="adamw_cosine: AdamW weight decay, on the matrices only")
    beta_2: float | None = option(None, above=0.0, below=1.0,
                                  help="Adam's beta_2 (null: 0.98 with paper, 0.99 with "
                                       "adamw_cosine)")
    clip_norm: float | None = option(None, above=0.0,
                                     help="clip the global gradient norm to this (null: no "
                                          "clipping; adamw_cosine: 1.0)")
    jit_compile: bool | str = option("auto", help="Keras' jit_compile: auto, true (XLA on jax "
                                                  "and tensorflow, torch.compile on torch) or "
                                                  "false")
    mixed_precision: bool = option(False, help="true: an older spelling of precision: "
                                               "mixed_bfloat16")
    precision: str = option("auto", choices=TRAIN_PRECISIONS,
                            help="auto: mixed_bfloat16 on a GPU with bfloat16 and on a "
                                 "PyTorch CPU with AMX-BF16/AVX512-BF16 (d_model >= 128), "
                                 "else float32 (metrics.json: precision); mixed_bfloat16: "
                                 "bfloat16 math, float32 weights; mixed_float16: float16 "
                                 "math with loss scaling")
    distribution: str = option("none", choices=DISTRIBUTIONS,
                               help="several devices (JAX backend): data_parallel or "
                                    "model_parallel (training/distribution.py)")
    devices: int | None = option(None, minimum=1, help="number of devices to distribute over "
                                                       "(null: all)")
    process_timeout: str = option("30m", help="several processes (torchrun, JAX): how long a "
                                              "process waits for the others before it stops "
                                              "with an error: 90s, 10m")
    model_parallel_size: int | None = option(None, minimum=1,
                                             help="model_parallel: devices along the model "
                                                  "axis (null: all)")
    samples: int = option(5, minimum=0, help="translations (GPT: generated texts) written to "
                                             "samples.txt at the end")
    eval_max_sentences: int | None = option(None, minimum=1,
                                            help="validation sentences translated for the "
                                                 "final BLEU and chrF (null: all)")
    decode_max_length: int | None = option(
        None, minimum=1, decoding="SearchOptions.max_new_tokens",
        help="longest translation, in tokens, in evaluation and samples (null: the model's "
             "max_length)")
    checkpoints_to_keep: int = option(2, minimum=1,
                                      help="checkpoints kept in RUN/checkpoints, epoch ends "
                                           "and checkpoint_every ones (best.keras besides)")
    checkpoint_every: int | None = option(None, minimum=1,
                                          help="also checkpoint every N optimizer steps inside "
                                               "an epoch; --resume continues there (null: "
                                               "epoch ends)")
    average_last: int | None = option(None, minimum=1,
                                      help="at the end, average the last N checkpoints into "
                                           "RUN/averaged.keras and evaluate it too (paper: 5)")
    patience: int | None = option(None, minimum=1,
                                  help="early stopping: stop after N evaluations of "
                                       "early_stopping_metric without improvement (null: "
                                       "never)")
    early_stopping_metric: str = option("val_loss", choices=STOPPING_METRICS,
                                        help="what patience and best.keras watch: val_loss "
                                             "(lower), val_bleu (higher, needs bleu_every) or "
                                             "val_accuracy (higher; an encoder classifier)")
    accumulate_steps: int = option(1, minimum=1,
                                   help="batches per optimizer update: gradients of k batches "
                                        "weighted by their tokens, one update (steps count "
                                        "updates)")
    verbose: int | str = option("auto", help="progress of model.fit: auto, 0 (silent), 1 "
                                             "(progress bar) or 2 (one line per epoch)")
    sample_every: int | None = option(None, minimum=1,
                                      help="print sample translations (GPT: texts) every N "
                                           "sample_units while training (null: never)")
    sample_unit: str = option("epoch", choices=SAMPLE_UNITS, help="the unit of sample_every")
    sample_prompts: list | None = option(None, help="GPT: prompts the samples continue, during "
                                                    "training and in samples.txt (null: the "
                                                    "start of the validation text)")
    sample_max_tokens: int | None = option(
        None, minimum=1, decoding="GenerationOptions.max_new_tokens",
        differs="null defers to decode_max_length, then to generate's own default",
        help="GPT: tokens generated per sample (null: decode_max_length, else generate's "
             "default)")
    sample_temperature: float = option(
        0.8, minimum=0.0, decoding="GenerationOptions.temperature",
        differs="cooler than generate's default, so that samples taken while training show "
                "the model's likelier text",
        help="GPT: sampling temperature of the samples (0: greedy; cooler than generate's "
             "default, to show the likelier text)")
    sample_top_k: int | None = option(
        50, minimum=1, decoding="GenerationOptions.top_k",
        differs="nanoGPT's sample.py cuts its samples to the 50 likeliest tokens; generate "
                "draws from all unless asked",
        help="GPT: sample among the k most likely tokens (null: all; nanoGPT's 50, where "
             "generate draws from all)")
    sample_top_p: float | None = option(None, above=0.0, maximum=1.0,
                                        decoding="GenerationOptions.top_p",
                                        help="GPT: sample within top-p probability mass (null: "
                                             "off)")
    bleu_every: int | None = option(None, minimum=1,
                                    help="validation BLEU and chrF every N epochs, in "
                                         "history.csv as val_bleu, val_chrf (null: never)")
    bleu_max_sentences: int = option(200, minimum=1,
                                     help="validation sentences that bleu_every translates")
    eval_beam_size: int = option(
        1, minimum=1, decoding="SearchOptions.beam_size",
        differs="greedy search keeps the evaluation during and after training fast; "
                "translate's default is the paper's beam search",
        help="beam size of the validation translations (1: greedy, fast; translate's "
             "default is the paper's beam)")

    @property
    def precision_policy(self):
        """``precision``, or ``mixed_bfloat16`` under the older spelling
        ``mixed_precision: true``: a Keras dtype policy, or ``auto``
        (``training/precision.py: resolve_precision`` decides)."""
        return "mixed_bfloat16" if self.mixed_precision else self.precision


SECTION_OPTIONS = {"data": DataOptions, "train": TrainOptions}
