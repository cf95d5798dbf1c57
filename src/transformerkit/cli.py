"""Command line: ``transformerkit train | summary | config | translate | generate | evaluate |
attention | export | plot | serve`` and ``transformerkit --version``.

Each command takes its options and positional arguments in any order
(``translate RUN --beam 4 TEXT`` and ``translate RUN TEXT --beam 4``: :class:`_Command`).
Keras is imported only after ``--backend`` is read, because the backend is fixed at import.
"""

import argparse
import logging
import os
import sys

from transformerkit.run_directory import RunDirectory

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
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


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


def _parser():
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


def _search_settings(args):
    """``--stopping``, ``--max-len-a/b`` (both engines: transformerkit.export.runtime says
    how CTranslate2 applies them)."""
    return dict(stopping=args.stopping, max_len_a=args.max_len_a, max_len_b=args.max_len_b)


def _add_use_commands(command):
    """The subcommands that use a trained run directory (``command(name, help)`` adds one)."""
    def run_parser(name, help_text):
        p = command(name, help_text)
        p.add_argument("run_dir", help="run directory written by `transformerkit train`")
        p.add_argument("--checkpoint", default="model",
                       help="model (final, default), best (best validation score), averaged "
                            "(transformerkit average), a file in RUN/checkpoints or a .keras "
                            "path")
        return p

    def engine_options(p):
        p.add_argument("--engine", choices=("keras", "ctranslate2"), default="keras",
                       help="keras (default) or ctranslate2: the run's CTranslate2 export "
                            "(RUN/ctranslate2, written on first use)")
        p.add_argument("--threads", type=int, default=0,
                       help="CTranslate2 threads (intra_threads; 0: its default)")

    def search_options(p, beam):
        p.add_argument("--beam", type=int, default=beam, help=f"beam size; 1 = greedy ({beam})")
        p.add_argument("--alpha", type=float, default=0.6,
                       help="length penalty of beam search, GNMT ((5+len)/6)^alpha (0.6)")
        p.add_argument("--max-new-tokens", type=int, default=None,
                       help="longest output in tokens (default: the model's max_length)")
        p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (64)")
        from transformerkit.config import DEFAULT_MAX_LEN_A, DEFAULT_MAX_LEN_B, DEFAULT_STOPPING

        p.add_argument("--stopping", choices=("early", "exact"), default=DEFAULT_STOPPING,
                       help="when a sentence's beam search ends: early = once BEAM hypotheses "
                            "have ended (CTranslate2's rule), exact = when no live beam can "
                            f"win, keras engine only ({DEFAULT_STOPPING})")
        p.add_argument("--max-len-a", type=_number_or_none(float), default=DEFAULT_MAX_LEN_A,
                       help="each output has at most A * source tokens + B tokens "
                            f"({DEFAULT_MAX_LEN_A}; none: no cap)")
        p.add_argument("--max-len-b", type=_number_or_none(int), default=DEFAULT_MAX_LEN_B,
                       help=f"B of --max-len-a ({DEFAULT_MAX_LEN_B}; none: no cap)")

    translate = run_parser("translate", "translate sentences with a trained model")
    translate.add_argument("texts", nargs="*", default=[], metavar="TEXT",
                           help="sentences to translate; none: read stdin, one per line, "
                                "printing each translation as soon as it is ready")
    search_options(translate, 4)
    engine_options(translate)
    translate.add_argument("--n-best", type=int, default=1,
                           help="print the N best translations as INDEX<TAB>SCORE<TAB>TEXT")
    translate.add_argument("--scores", action="store_true",
                           help="print LOGPROB<TAB>TEXT: the model's log-probability of each "
                                "translation (its tokens and the end token)")

    generate = run_parser("generate", "continue a prompt with a trained GPT")
    generate.add_argument("--prompt", required=True, help="text to continue")
    generate.add_argument("--max-new-tokens", type=int, default=200)
    generate.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (1.0)")
    generate.add_argument("--top-k", type=int, default=None)
    generate.add_argument("--top-p", type=float, default=None)
    generate.add_argument("--seed", type=int, default=None,
                          help="the same seed gives the same text")
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
    evaluate.add_argument("--data-dir", help="data directory (default: the run's config, "
                                             "else $TRANSFORMERKIT_DATA)")
    evaluate.add_argument("--output", help="also write the translations to this file")
    search_options(evaluate, 4)
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

    export = run_parser("export", "write the run's model in another format (CTranslate2)")
    export.add_argument("--format", choices=("ctranslate2",), default="ctranslate2",
                        help="the format (ctranslate2)")
    export.add_argument("--quantization", default=None,
                        choices=("int8", "int8_float32", "int8_float16", "int8_bfloat16",
                                 "int16", "float16", "bfloat16", "float32"),
                        help="weight type of the export (default: float32 as trained)")
    export.add_argument("--out", help="output folder (default RUN_DIR/ctranslate2 or "
                                      "RUN_DIR/ctranslate2-QUANTIZATION)")
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
                            "(default: the first)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (8000)")
    serve.add_argument("--engine", choices=("keras", "ctranslate2"), default="keras",
                       help="keras (default) or ctranslate2 (the runs' CTranslate2 exports)")
    serve.add_argument("--checkpoint", default="model", help="which weights of each run, as "
                                                             "for translate (model)")
    _add_serving_limits(serve)


def _add_serving_limits(parser):
    """``--max-texts``, ``--timeout`` ...: one option per field of ``serving.limits.Limits``."""
    import dataclasses

    from transformerkit.serving.limits import Limits

    for item in dataclasses.fields(Limits):
        parser.add_argument("--" + item.name.replace("_", "-"), type=type(item.default),
                            default=item.default,
                            help=f"{item.metadata['help']} ({item.default})")


# commands that run a model over many batches: they keep freed memory for reuse
# (transformerkit.allocator; a process-wide setting the library never makes on import)
_HEAVY_COMMANDS = ("train", "translate", "generate", "evaluate", "classify", "embed")


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from transformerkit.config import ConfigError

    try:
        commands = {"train": _train, "summary": _summary, "config": _config,
                    "translate": _translate,
                    "generate": _generate, "evaluate": _evaluate, "attention": _attention,
                    "classify": _classify, "embed": _embed,
                    "export": _export,
                    "plot": _plot, "average": _average, "serve": _serve}
        if args.command in _HEAVY_COMMANDS:
            from transformerkit.allocator import keep_freed_memory

            keep_freed_memory()
        return commands[args.command](args)
    except (ConfigError, ValueError, TypeError, FileNotFoundError, FileExistsError, OSError,
            FloatingPointError) as err:
        print(f"transformerkit {args.command}: error: {err}", file=sys.stderr)
        return 2


def _train(args):
    """``train CONFIG``: resolve the config, then :func:`transformerkit.training.trainer.train`
    (whose docstring shows the way to the gradient step)."""
    from transformerkit.config import load_config
    from transformerkit.training.trainer import train

    run_dir = args.out or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    overrides = list(args.overrides)
    if args.data_dir:
        overrides.append(f"data.data_dir={args.data_dir}")
    if args.resume:
        saved = RunDirectory(run_dir).config
        if not os.path.exists(saved):
            raise FileNotFoundError(f"--resume: {saved} not found")
        config = load_config(saved, overrides)
    else:
        config = load_config(args.config, overrides)
    metrics = train(config, run_dir, resume=args.resume)
    if metrics is not None:  # None: a process other than rank 0 of a multi-process run
        _print_results(run_dir, metrics)
    return 0


def _print_results(run_dir, metrics):
    print(f"\nrun directory: {run_dir}")
    for key in ("stopped_by", "steps", "train_seconds", "loss", "val_loss",
                "val_masked_accuracy", "val_accuracy", "val_bleu", "val_chrf"):
        if key in metrics:
            print(f"  {key}: {metrics[key]}")
    samples = RunDirectory(run_dir).samples
    if os.path.exists(samples):
        with open(samples, encoding="utf-8") as f:
            print("\n" + f.read())


def _summary(args):
    from transformerkit.config import load_config
    from transformerkit.models.factory import build_model
    from transformerkit.training.summary import format_summary, parameter_summary

    if os.path.isdir(args.target):
        from transformerkit.saving import load_model

        model = load_model(RunDirectory(args.target).model, compile=False)
    else:
        config = load_config(args.target, args.overrides)
        vocab = args.vocab_size or config["data"]["vocab_size"]
        model = build_model(config["model"], vocab, vocab)
    print(f"{type(model).__name__}")
    print(format_summary(parameter_summary(model)))
    if args.plot:
        from transformerkit.training.diagram import write_diagram

        write_diagram(model, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _config(args):
    """``config [CONFIG|RUN_DIR] [--set ...]``: :func:`transformerkit.config.describe` of the
    resolved config (a run directory's ``config.yaml``)."""
    from transformerkit.config import describe, load_config

    path = args.config
    if path is not None and os.path.isdir(path):
        path = RunDirectory(path).config
    config = load_config(path, args.overrides)
    source = path or "the defaults"
    if args.overrides:
        source += " with " + " ".join(f"--set {item}" for item in args.overrides)
    print(describe(config, source), end="")
    return 0


# -- using a trained run ------------------------------------------------------------------------
def _load(args):
    from transformerkit.api import load

    return load(args.run_dir, checkpoint=args.checkpoint)


def _print(text=""):
    print(text, flush=True)


def _valid_text(text, where):
    """``text`` (bytes, or str from the command line) as valid Unicode: invalid UTF-8 bytes
    (which Python turns into lone surrogates in ``sys.argv``) become U+FFFD, with a warning
    naming ``where``."""
    try:
        if isinstance(text, bytes):
            return text.decode("utf-8")
        text.encode("utf-8")
        return text
    except (UnicodeDecodeError, UnicodeEncodeError):
        pass
    if not isinstance(text, bytes):
        try:
            text = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "surrogatepass")
    print(f"transformerkit: warning: {where} is not valid UTF-8; invalid bytes replaced by "
          "U+FFFD", file=sys.stderr)
    return text.decode("utf-8", "replace")


def _stdin_chunks(stream, max_lines):
    """Lines of ``stream`` (a binary stream) in chunks: as many as are already available
    (at most ``max_lines``), so a pipe is translated in full batches and a terminal line by
    line. Lines that are not valid UTF-8 are decoded with U+FFFD and a warning."""
    import select

    chunk, number = [], 0
    while True:
        line = stream.readline()
        if not line:
            break
        number += 1
        chunk.append(_valid_text(line, f"stdin line {number}").rstrip("\r\n"))
        try:
            more = len(chunk) < max_lines and bool(select.select([stream], [], [], 0)[0])
        except (OSError, ValueError):  # not selectable (e.g. a StringIO in tests)
            more = len(chunk) < max_lines
        if not more:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _engine(args, run):
    """``--engine``/``--threads``: "keras", or the run's CTranslate2 engine."""
    if args.engine == "keras":
        return "keras"
    from transformerkit.export.runtime import CTranslate2Engine

    return CTranslate2Engine(run, threads=args.threads)


def _translate(args):
    run = _load(args)
    if args.n_best > max(1, args.beam):
        args.beam = args.n_best
    options = dict(beam_size=args.beam, alpha=args.alpha, n_best=args.n_best,
                   max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                   engine=_engine(args, run), **_search_settings(args))
    texts = [_valid_text(t, f"argument {i + 1}") for i, t in enumerate(args.texts)]
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    chunks = [texts] if texts else _stdin_chunks(stdin, args.batch_size)
    if args.scores and args.n_best > 1:
        raise ValueError("--scores prints one translation per line; --n-best already prints "
                         "each hypothesis with its score")
    offset = 0
    for chunk in chunks:
        _translate_chunk(run, chunk, offset, options, args.scores)
        offset += len(chunk)
    return 0


def _translate_chunk(run, texts, offset, options, scores=False):
    """Translate ``texts`` and print them in order as soon as each is ready; empty lines
    stay empty lines; ``scores``: each line is LOGPROB<TAB>TEXT (``Run.score``)."""
    real = [i for i, t in enumerate(texts) if t.strip()]
    ready, next_out = {}, 0

    def flush():
        nonlocal next_out
        while next_out < len(texts) and (next_out in ready or not texts[next_out].strip()):
            result = ready.pop(next_out, "")
            if options["n_best"] > 1:
                for text, score in result:
                    _print(f"{offset + next_out}\t{score:.4f}\t{text}")
            else:
                _print(result)
            next_out += 1

    flush()
    if real:
        for indices, results in run.translate_batches([texts[i] for i in real], **options):
            if scores:
                logp = run.score([texts[real[i]] for i in indices], results)
                results = [f"{s:.4f}\t{r}" for s, r in zip(logp, results, strict=True)]
            for i, result in zip(indices, results, strict=True):
                ready[real[i]] = result
            flush()
    flush()


def _generate(args):
    run = _load(args)
    _print(run.generate(_valid_text(args.prompt, "--prompt"), max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, engine=_engine(args, run)))
    return 0


def _evaluation_data(args, run):
    """``(name, sources, references)`` from ``--source/--reference`` or a split."""
    from transformerkit.data import corpora

    if args.source or args.reference:
        if not (args.source and args.reference):
            raise ValueError("--source and --reference go together")
        sources, references = corpora.read_parallel(args.source, args.reference)
        return os.path.splitext(os.path.basename(args.source))[0], sources, references
    data = dict(run.config["data"])
    if args.data_dir:
        data["data_dir"] = args.data_dir
    split = args.split or ("test2016" if data["dataset"] == "multi30k" else "val")
    if data["dataset"] == "multi30k":
        split = "test2016" if split == "test" else split
        sources, references = corpora.load_multi30k(split, data["source_lang"],
                                                    data["target_lang"], data["data_dir"])
    elif split == "test2016":
        raise ValueError("--split test2016 is Multi30k's; this run's test split is --split "
                         "test")
    else:
        from transformerkit.training.data_setup import load_pairs

        pairs = load_pairs(data, split)
        if pairs is None:
            keys = {"val": "val_source/val_target, val_tsv or val_files",
                    "test": "test_source/test_target, test_tsv or test_files"}[split]
            raise ValueError(f"the run's config names no {split} data (data.{keys}); use "
                             "--source and --reference")
        sources, references = pairs
    return split, sources, references


def _evaluate(args):
    from rich.progress import Progress

    from transformerkit.evaluation import corpus_scores
    from transformerkit.files import atomic_write_text

    run = _load(args)
    if run.kind == "encoder":
        return _evaluate_classifier(args, run)
    if run.kind != "transformer":
        raise ValueError(f"evaluate needs a translation or an encoder classifier run; "
                         f"{args.run_dir} holds a {run.kind}")
    name, sources, references = _evaluation_data(args, run)
    if args.max_sentences:
        sources, references = sources[: args.max_sentences], references[: args.max_sentences]
    hypotheses = [None] * len(sources)
    engine = _engine(args, run)
    with Progress(transient=True, console=_stderr_console()) as progress:
        task = progress.add_task(f"translating {name}", total=len(sources))
        for indices, results in run.translate_batches(
                sources, beam_size=args.beam, alpha=args.alpha,
                max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                engine=engine, **_search_settings(args)):
            for i, text in zip(indices, results, strict=True):
                hypotheses[i] = text
            progress.advance(task, len(indices))
    scores = corpus_scores(hypotheses, references)
    if args.output:
        atomic_write_text(args.output, "\n".join(hypotheses) + "\n")
    _print(f"{name}: {len(sources)} sentences, beam {args.beam}, alpha {args.alpha}, "
           f"engine {args.engine}")
    _print(f"BLEU = {scores['bleu']:.2f}   {scores['bleu_signature']}")
    _print(f"chrF = {scores['chrf']:.2f}   {scores['chrf_signature']}")
    run_dir = RunDirectory(args.run_dir)
    metrics = run_dir.read_metrics() if os.path.exists(run_dir.metrics) else {}
    metrics.setdefault("evaluate", {})[name] = dict(
        scores, sentences=len(sources), beam_size=args.beam, alpha=args.alpha,
        checkpoint=args.checkpoint, engine=args.engine)
    run_dir.write_metrics(metrics)
    _print(f"stored in {run_dir.metrics}")
    return 0


def _evaluate_classifier(args, run):
    """``evaluate`` of an encoder run: accuracy, the confusion counts and per-class scores
    of a split (``--split``, default val) or of ``--source TEXTS --reference LABELS``."""
    from transformerkit.evaluation import classification_scores, format_confusion

    name, texts, gold = _evaluation_data(args, run)
    if args.max_sentences:
        texts, gold = texts[: args.max_sentences], gold[: args.max_sentences]
    gold = [label.strip() for label in gold]
    unknown = sorted(set(gold) - set(run.labels))
    if unknown:
        raise ValueError(f"the labels {unknown[:5]} are not among the run's classes "
                         f"{run.labels[:20]}")
    predicted = run.classify(texts, batch_size=args.batch_size)
    scores = classification_scores(predicted, gold, run.labels)
    if args.output:
        from transformerkit.files import atomic_write_text

        atomic_write_text(args.output, "\n".join(predicted) + "\n")
    _print(f"{name}: {scores['examples']} texts, {len(run.labels)} classes")
    _print(f"accuracy = {scores['accuracy']:.4f}")
    _print(format_confusion(scores))
    for label, values in scores["per_class"].items():
        _print(f"{label}: precision {values['precision']:.4f} recall {values['recall']:.4f} "
               f"f1 {values['f1']:.4f} support {values['support']}")
    run_dir = RunDirectory(args.run_dir)
    metrics = run_dir.read_metrics() if os.path.exists(run_dir.metrics) else {}
    metrics.setdefault("evaluate", {})[name] = dict(scores, checkpoint=args.checkpoint)
    run_dir.write_metrics(metrics)
    _print(f"stored in {run_dir.metrics}")
    return 0


def _input_texts(args):
    """The command line's TEXT arguments, else stdin's lines in chunks (as translate)."""
    texts = [_valid_text(t, f"argument {i + 1}") for i, t in enumerate(args.texts)]
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    return [texts] if texts else _stdin_chunks(stdin, args.batch_size)


def _classify(args):
    """``classify RUN [TEXT ...]``: one line per text, LABEL (``--probabilities``: every
    class with its probability, most likely first); an empty input line gives an empty
    output line."""
    run = _load(args)
    for chunk in _input_texts(args):
        real = [i for i, t in enumerate(chunk) if t.strip()]
        results = run.classify([chunk[i] for i in real], probabilities=args.probabilities,
                               batch_size=args.batch_size) if real else []
        lines = [""] * len(chunk)
        for i, result in zip(real, results, strict=True):
            if args.probabilities:
                ranked = sorted(result.items(), key=lambda item: -item[1])
                lines[i] = "\t".join(f"{label}\t{p:.4f}" for label, p in ranked)
            else:
                lines[i] = result
        for line in lines:
            _print(line)
    return 0


def _embed(args):
    """``embed RUN``: the embedding of each stdin line, printed as one line of numbers or
    written with ``--out`` as a ``(lines, d_model)`` float32 .npy array. An empty line is
    an error naming it (it has no embedding)."""
    import numpy as np

    from transformerkit.files import atomic_path

    run = _load(args)
    args.texts = []
    parts, offset = [], 0
    for chunk in _input_texts(args):
        empty = next((i for i, t in enumerate(chunk) if not t.strip()), None)
        if empty is not None:
            raise ValueError(f"stdin line {offset + empty + 1} is empty: nothing to embed")
        offset += len(chunk)
        vectors = run.embed(chunk, pooling=args.pooling, normalize=args.normalize,
                            batch_size=args.batch_size)
        if args.out:
            parts.append(vectors)
            continue
        for row in vectors:
            _print(" ".join(f"{x:.6g}" for x in row))
    if args.out:
        if not parts:
            raise ValueError("stdin had no lines to embed")
        array = np.concatenate(parts).astype("float32")
        with atomic_path(args.out) as tmp, open(tmp, "wb") as f:
            np.save(f, array)
        print(f"wrote {args.out}: {array.shape[0]} x {array.shape[1]} float32",
              file=sys.stderr)
    return 0


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _attention(args):
    from transformerkit.plotting import plot_attention

    run = _load(args)
    target = args.target
    if run.kind == "transformer" and target is None:
        target = run.translate(args.source, beam_size=1,
                               max_new_tokens=run.model.max_length - 1)
        _print(f"target (greedy translation): {target}")
    weights = run.attention(args.source, target)
    if run.kind == "gpt":
        kind, queries, keys = "self", weights["tokens"], weights["tokens"]
    else:
        kind = args.kind
        queries = {"cross": weights["target_output_tokens"],
                   "decoder_self": weights["target_output_tokens"],
                   "encoder": weights["source_tokens"]}[kind]
        keys = {"cross": weights["source_tokens"], "decoder_self": weights["target_input_tokens"],
                "encoder": weights["source_tokens"]}[kind]
    layers = weights[kind].shape[0]
    if not -layers <= args.layer < layers:
        raise ValueError(f"--layer {args.layer} does not exist: the model has {layers} layers")
    layer = args.layer % layers
    out = plot_attention(weights[kind][layer], queries, keys, args.out,
                         title=f"{kind} attention, layer {layer}")
    _print(f"wrote {out}")
    return 0


def _export(args):
    """``export RUN --format ctranslate2``: :func:`transformerkit.export.ctranslate2.export_run`."""
    from transformerkit.export.ctranslate2 import export_run

    out = export_run(_load(args), args.out, quantization=args.quantization, force=args.force)
    _print(f"wrote {out}")
    return 0


def _plot(args):
    if args.lr:
        return _plot_learning_rate(args)
    from transformerkit.plotting import plot_history

    run_dir = RunDirectory(args.target)
    out = plot_history(run_dir.history, args.out or run_dir.history_plot, title=args.target)
    _print(f"wrote {out}")
    return 0


def _plot_learning_rate(args):
    """``plot CONFIG|RUN --lr``: the schedule over the run's steps (``--steps``, else the
    steps a trained run took, else ``train.max_steps``)."""
    from transformerkit.config import load_config
    from transformerkit.plotting import plot_learning_rate
    from transformerkit.training.trainer import learning_rates

    is_run = os.path.isdir(args.target)
    run = RunDirectory(args.target) if is_run else None
    config = load_config(run.config if is_run else args.target, args.overrides)
    steps = args.steps
    if steps is None and is_run and os.path.isfile(run.metrics):
        steps = run.read_metrics().get("steps")
    steps = steps or config["train"]["max_steps"]
    if not steps:
        raise ValueError("--lr needs the run's length: give --steps N (the config sets no "
                         "train.max_steps)")
    rates = learning_rates(config, int(steps))
    default = (os.path.join(args.target, "learning_rate.png") if is_run else
               f"{os.path.splitext(os.path.basename(args.target))[0]}-lr.png")
    out = plot_learning_rate(list(rates), args.out or default,
                             title=f"{args.target}: learning rate ({config['train']['optimizer']})")
    peak = int(rates.argmax())
    _print(f"wrote {out} ({len(rates)} steps, peak {rates[peak]:.3g} at step {peak + 1})")
    return 0


def _average(args):
    from transformerkit.training.averaging import average_checkpoints

    out, paths = average_checkpoints(args.run_dir, args.last, args.out)
    _print(f"wrote {out}: the mean of {', '.join(os.path.basename(p) for p in paths)}")
    return 0


def _serve(args):
    import dataclasses

    from transformerkit.serving.limits import Limits
    from transformerkit.serving.server import serve

    limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        print(f"transformerkit serve: error: {err}: install the server's packages with "
              "pip install \"keras-transformerkit[serve]\"", file=sys.stderr)
        return 2
    serve(args.run_dirs, host=args.host, port=args.port, engine=args.engine,
          checkpoint=args.checkpoint, limits=limits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
