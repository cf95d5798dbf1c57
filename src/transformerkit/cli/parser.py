"""The ``transformerkit`` argument parser: every command, its options and their help.

Each command takes its options and positional arguments in any order
(``translate RUN --beam 4 TEXT`` and ``translate RUN TEXT --beam 4``: :class:`_Command`).
Nothing here imports Keras: the backend is chosen from ``--backend`` after parsing.
"""

import argparse
import re

BACKENDS = ("torch", "jax", "tensorflow")


_BACKEND_HELP = "Keras backend (default: $KERAS_BACKEND, else torch)"


class _Command(argparse.ArgumentParser):
    """A subcommand's parser: options may come before, between or after its positional
    arguments (``parse_intermixed_args``: the options first, then the positionals from what
    is left); ``--`` ends the options as usual. Unknown arguments are this command's error."""

    _parsing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._parsing:  # the two passes of parse_known_intermixed_args
            return super().parse_known_args(args, namespace)
        self._parsing = True
        try:
            namespace, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False
        if extras:
            message = f"unrecognized arguments: {' '.join(extras)}"
            overrides = [a for a in extras if _OVERRIDE.match(a)]
            if overrides and any(a.dest == "overrides" for a in self._actions):
                message += ("; each override takes its own --set: "
                            + " ".join(f"--set {a}" for a in overrides))
            self.error(message)
        return namespace, extras


_OVERRIDE = re.compile(r"[A-Za-z_]\w*\.[A-Za-z_]\w*=")  # section.key=value


class _Version(argparse.Action):
    """``--version``: the version looked up only when asked (:func:`package_version`)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the version and exit"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {package_version()}")
        parser.exit()


def package_version():
    """The version of the installed distribution that provides the ``transformerkit``
    package, whatever the distribution's name; else ``transformerkit.__version__`` (a
    source checkout on ``sys.path``)."""
    from importlib import metadata

    import transformerkit

    for name in dict.fromkeys(metadata.packages_distributions().get("transformerkit", ())):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return transformerkit.__version__


def build_parser():
    parser = argparse.ArgumentParser(
        prog="transformerkit",
        description="Train and use Transformers (Attention Is All You Need) on Keras 3.",
        epilog="Options and positional arguments of a command go in any order. Every config "
               "key with its type, default and meaning: transformerkit config.")
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--backend", choices=BACKENDS, help=_BACKEND_HELP)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Command)
    # `--backend` may also follow the command (it then wins over one before the command)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", choices=BACKENDS, default=argparse.SUPPRESS,
                        help=_BACKEND_HELP)

    def command(name, help_text, **kwargs):
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common],
                              **kwargs)

    train = command("train", "train a model from a YAML config",
                    epilog="Every config key with its type, default and meaning: "
                           "`transformerkit config`; the resolved config of a file with "
                           "overrides: `transformerkit config CONFIG --set SECTION.KEY=VALUE`.")
    train.add_argument("config", help="YAML file with model/data/train sections")
    _add_overrides(train)
    train.add_argument("--out", help="run directory (default: runs/<config name>)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its latest checkpoint")
    train.add_argument("--data-dir", help="data directory (default: $TRANSFORMERKIT_DATA)")

    summary = command("summary", "parameter counts per component")
    summary.add_argument("target", help="a config YAML or a run directory")
    _add_overrides(summary)
    summary.add_argument("--vocab-size", type=int, default=None,
                         help="vocabulary size for a config (default: data.vocab_size)")
    summary.add_argument("--plot", metavar="FILE",
                         help="also draw the model: .dot (needs pydot), .png/.svg/.pdf (and "
                              "Graphviz's dot)")

    config = command("config", "print a resolved config as YAML, every key with its type, "
                               "default and meaning")
    config.add_argument("config", nargs="?", default=None,
                        help="a config YAML or a run directory (default: the defaults)")
    _add_overrides(config)
    _add_use_commands(command)

    imported = command("import", "a Hugging Face checkpoint (GPT-2; Marian/OPUS-MT; BERT, "
                                 "DistilBERT) as a run directory that every command takes")
    imported.add_argument("source", metavar="SOURCE",
                          help="a checkpoint folder (save_pretrained, huggingface-cli download "
                               "--local-dir, a snapshot folder of the Hugging Face cache) or a "
                               "hub name such as gpt2 or Helsinki-NLP/opus-mt-de-en (from the "
                               "cache when HF_HUB_OFFLINE=1, else downloaded)")
    imported.add_argument("--out", required=True, help="the run directory to write")
    imported.add_argument("--force", action="store_true", help="replace an existing --out")
    return parser


def _add_overrides(parser):
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE",
                        help="override a config key (repeatable; keys: transformerkit config)")


def _number_or_none(kind):
    """argparse type: a ``kind`` number, or ``none`` for None."""
    def parse(text):
        if text.strip().lower() in ("none", "null"):
            return None
        try:
            return kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what} or none, got {text!r}") from None
    return parse


def _add_use_commands(command):
    """The subcommands that use a trained run directory (``command(name, help)`` adds one)."""
    from transformerkit.decoding.options import (
        GenerationOptions,
        RuntimeOptions,
        SearchOptions,
    )

    def run_parser(name, help_text):
        p = command(name, help_text)
        p.add_argument("run_dir", help="run directory written by `transformerkit train`")
        options_flags(p, RuntimeOptions, ("checkpoint",))
        return p

    def engine_options(p):
        """``--engine``, ``--precision``, ``--threads``: the other runtime options."""
        options_flags(p, RuntimeOptions, ("engine", "precision", "threads"))

    def options_flags(p, options_class, names=None):
        """One flag per field of ``options_class`` (``decoding/options.py``), with its type,
        allowed values and help from the declaration; ``names``: only those. A flag not
        given leaves no attribute (``argparse.SUPPRESS``): the command starts from the
        run's own options (a translation run's ``search:`` section), else the declared
        defaults (``cli/common.py: options_of``)."""
        from transformerkit.decoding.options import fields_of, flag_name, optional, value_type

        for f in fields_of(options_class):
            if names is not None and f.name not in names:
                continue
            kind, default = value_type(f), f.default
            if default is None or kind is bool:  # as YAML and the docs write them
                default = "none" if default is None else str(default).lower()
            where = "the run's search section, else " if options_class is SearchOptions else ""
            text = f"{f.metadata['help']} (default: {where}{default})"
            if kind is bool:
                p.add_argument(flag_name(f), dest=f.name, default=argparse.SUPPRESS,
                               help=text, action=argparse.BooleanOptionalAction)
                continue
            parse = _number_or_none(kind) if optional(f) and kind is not str else kind
            p.add_argument(flag_name(f), dest=f.name, type=parse, default=argparse.SUPPRESS,
                           choices=f.metadata["choices"], help=text,
                           metavar=None if f.metadata["choices"] else f.name.upper())

    translate = run_parser("translate", "translate sentences with a trained model")
    translate.add_argument("texts", nargs="*", default=[], metavar="TEXT",
                           help="sentences to translate; none: read stdin, one per line, "
                                "printing each translation as soon as it is ready")
    options_flags(translate, SearchOptions)
    engine_options(translate)
    translate.epilog = ("--n-best N prints the N best translations of each text as "
                        "INDEX<TAB>SCORE<TAB>TEXT lines.")
    translate.add_argument("--scores", action="store_true",
                           help="print LOGPROB<TAB>TEXT: the model's log-probability of each "
                                "translation (its tokens and the end token)")

    generate = run_parser("generate", "continue a prompt with a trained GPT")
    generate.add_argument("--prompt", required=True, help="text to continue")
    options_flags(generate, GenerationOptions)
    engine_options(generate)

    classify = run_parser("classify", "the class of each text with an encoder classifier run")
    classify.add_argument("texts", nargs="*", default=[], metavar="TEXT",
                          help="texts to classify; none: read stdin, one per line")
    classify.add_argument("--probabilities", action="store_true",
                          help="print LABEL<TAB>PROBABILITY<TAB>... for every class, most "
                               "likely first")
    classify.add_argument("--batch-size", type=int, default=64, help="texts per batch (64)")

    embed = run_parser("embed", "sentence embeddings of stdin lines (an encoder run, or a "
                                "translation run's encoder)")
    embed.add_argument("--pooling", choices=("mean", "cls"), default="mean",
                       help="mean over the real tokens (default) or cls: the first token's "
                            "state ([BOS]/[CLS]; encoder runs)")
    embed.add_argument("--normalize", action="store_true", help="scale each vector to unit "
                                                                 "length")
    embed.add_argument("--out", help="write a float32 .npy array (lines, d_model) instead of "
                                     "printing one line of numbers per input line")
    embed.add_argument("--batch-size", type=int, default=64, help="texts per batch (64)")

    evaluate = run_parser("evaluate", "BLEU and chrF (sacrebleu) on a split or on files (an "
                                      "encoder classifier: accuracy and confusion counts); "
                                      "stored in the run's metrics.json under evaluate.NAME")
    where = evaluate.add_mutually_exclusive_group()
    where.add_argument("--split", choices=("val", "test", "test2016"), default=None,
                       help="split of the run's dataset: val, test (data.test_*; TED's test; "
                            "Multi30k's test2016) (default: test2016 for Multi30k, else val)")
    where.add_argument("--source", help="file of source sentences (a classifier's texts), "
                                        "one per line")
    evaluate.add_argument("--reference", help="file of reference translations (a classifier's "
                                              "labels), line by line with --source")
    evaluate.add_argument("--max-sentences", type=int, default=None)
    evaluate.add_argument("--data-dir", help="data directory (default: $TRANSFORMERKIT_DATA, "
                                             "else the one the run recorded, else the "
                                             "cache)")
    evaluate.add_argument("--output", help="also write the translations to this file")
    options_flags(evaluate, SearchOptions, ("beam_size", "alpha", "penalty", "max_new_tokens",
                                           "min_new_tokens", "no_repeat_ngram_size",
                                           "batch_size", "stopping",
                                           "forced_eos", "renormalize", "max_len_a",
                                           "max_len_b"))
    engine_options(evaluate)

    attention = run_parser("attention", "attention heatmaps, one per head of a layer")
    attention.add_argument("source", help="the source sentence (GPT: the text)")
    attention.add_argument("--target", help="the target sentence (default: the model's "
                                            "greedy translation)")
    attention.add_argument("--out", required=True, help="PNG file to write")
    attention.add_argument("--kind", choices=("cross", "decoder_self", "encoder"),
                           default="cross", help="which attention (Transformer; default cross)")
    attention.add_argument("--layer", type=int, default=-1,
                           help="layer index, negative from the end (default -1: the last)")

    export = run_parser("export", "write the run's model in another format (CTranslate2, "
                                  "Hugging Face)")
    export.add_argument("--format", choices=("ctranslate2", "huggingface"),
                        default="ctranslate2",
                        help="ctranslate2 (default), or huggingface: a folder "
                             "GPT2LMHeadModel.from_pretrained loads (GPT runs with GPT-2's "
                             "options) or MarianMTModel.from_pretrained loads (translation "
                             "runs with Marian's options and SentencePiece vocabularies)")
    export.add_argument("--quantization", default=None,
                        choices=("int8", "int8_float32", "int8_float16", "int8_bfloat16",
                                 "int16", "float16", "bfloat16", "float32"),
                        help="weight type of the export (default: float32 as trained)")
    export.add_argument("--out", help="output folder (default RUN_DIR/ctranslate2 or "
                                      "RUN_DIR/ctranslate2-QUANTIZATION; RUN_DIR/huggingface)")
    export.add_argument("--force", action="store_true", help="replace an existing folder")

    plot = command("plot", "training curves from a run's history.csv, or with --lr the "
                           "learning-rate schedule of a config or run")
    plot.add_argument("target", metavar="RUN_DIR|CONFIG",
                      help="run directory written by `transformerkit train` (with --lr: also a "
                           "config YAML)")
    plot.add_argument("--lr", action="store_true",
                      help="plot the learning rate of every optimizer step instead")
    plot.add_argument("--steps", type=int, default=None,
                      help="--lr: the run's length in optimizer steps (default: the steps a "
                           "run took, else train.max_steps)")
    _add_overrides(plot)
    plot.add_argument("--out", help="PNG file (default RUN_DIR/history.png; --lr: "
                                    "RUN_DIR/learning_rate.png, or CONFIG_NAME-lr.png)")

    average = command("average", "average the weights of a run's last checkpoints (the "
                                 "paper: the last 5 for base models, 20 for big ones)")
    average.add_argument("run_dir", help="run directory written by `transformerkit train`")
    average.add_argument("--last", type=int, required=True, metavar="N",
                         help="how many of the newest checkpoints to average")
    average.add_argument("--out", help=".keras file (default RUN_DIR/averaged.keras; load it "
                                       "with --checkpoint averaged)")

    serve = command("serve", "serve runs over HTTP: a JSON API (/translate, /generate, "
                             "/attention, /models, /health, /openapi.json) and a page at /")
    serve.add_argument("run_dirs", nargs="+", metavar="RUN",
                       help="run directories; a request names its model by the folder name "
                            "(default: the first that serves the route)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (8000)")
    options_flags(serve, RuntimeOptions)  # --engine, --precision, --threads, --checkpoint
    serve.add_argument("--cors-origin", dest="cors_origins", action="append", default=[],
                       metavar="ORIGIN",
                       help="let pages from ORIGIN (https://host[:port], or * for any) call "
                            "the API from a browser (repeatable; default: only the server's "
                            "own page)")
    serve.add_argument("--api-key", dest="api_keys", action="append", default=[],
                       metavar="KEY",
                       help="a key a request must send as Authorization: Bearer KEY "
                            "(repeatable; at least 16 printable characters). A key here shows "
                            "in the process list: prefer $TRANSFORMERKIT_API_KEYS, a file with "
                            "one key per line or a comma-separated list. Needed unless --host "
                            "is loopback or --no-auth is given")
    serve.add_argument("--no-auth", action="store_true",
                       help="serve without API keys on a host other than loopback: anyone who "
                            "reaches it may use the models")
    serve.add_argument("--workers", type=int, default=1, metavar="N",
                       help="worker processes, each with its own copy of the models and "
                            "its share of the CPU threads (1)")
    serve.add_argument("--shutdown-timeout", type=float, default=25.0, metavar="SECONDS",
                       help="after SIGTERM, how long to finish the requests already taken "
                            "before exiting anyway (25)")
    _add_serving_limits(serve)


def _add_serving_limits(parser):
    """``--max-texts``, ``--timeout`` ...: one option per field of ``serving.limits.Limits``."""
    import dataclasses

    from transformerkit.serving.limits import Limits

    for item in dataclasses.fields(Limits):
        parser.add_argument("--" + item.name.replace("_", "-"), type=type(item.default),
                            default=item.default,
                            help=f"{item.metadata['help']} ({item.default})")
