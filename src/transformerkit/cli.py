"""Command line: ``transformerkit train | summary | config | translate | generate | evaluate |
attention | plot`` and ``transformerkit --version``.

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


def _add_use_commands(command):
    """The subcommands that use a trained run directory (``command(name, help)`` adds one)."""
    def run_parser(name, help_text):
        p = command(name, help_text)
        p.add_argument("run_dir", help="run directory written by `transformerkit train`")
        p.add_argument("--checkpoint", default="model",
                       help="model (final, default), best (lowest val loss) or a .keras path")
        return p

    def search_options(p, beam):
        p.add_argument("--beam", type=int, default=beam, help=f"beam size; 1 = greedy ({beam})")
        p.add_argument("--alpha", type=float, default=0.6,
                       help="length penalty of beam search, GNMT ((5+len)/6)^alpha (0.6)")
        p.add_argument("--max-new-tokens", type=int, default=None,
                       help="longest output in tokens (default: the model's max_length)")
        p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (64)")

    translate = run_parser("translate", "translate sentences with a trained model")
    translate.add_argument("texts", nargs="*", default=[], metavar="TEXT",
                           help="sentences to translate; none: read stdin, one per line, "
                                "printing each translation as soon as it is ready")
    search_options(translate, 4)
    translate.add_argument("--n-best", type=int, default=1,
                           help="print the N best translations as INDEX<TAB>SCORE<TAB>TEXT")

    generate = run_parser("generate", "continue a prompt with a trained GPT")
    generate.add_argument("--prompt", required=True, help="text to continue")
    generate.add_argument("--max-new-tokens", type=int, default=200)
    generate.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (1.0)")
    generate.add_argument("--top-k", type=int, default=None)
    generate.add_argument("--top-p", type=float, default=None)
    generate.add_argument("--seed", type=int, default=None,
                          help="the same seed gives the same text")

    evaluate = run_parser("evaluate", "BLEU and chrF (sacrebleu) on a split or on files; "
                                      "stored in the run's metrics.json under evaluate.NAME")
    where = evaluate.add_mutually_exclusive_group()
    where.add_argument("--split", choices=("val", "test2016"), default=None,
                       help="split of the run's dataset (default: test2016 for Multi30k, "
                            "else val)")
    where.add_argument("--source", help="file of source sentences, one per line")
    evaluate.add_argument("--reference", help="file of reference translations (with --source)")
    evaluate.add_argument("--max-sentences", type=int, default=None)
    evaluate.add_argument("--data-dir", help="data directory (default: the run's config, "
                                             "else $TRANSFORMERKIT_DATA)")
    evaluate.add_argument("--output", help="also write the translations to this file")
    search_options(evaluate, 4)

    attention = run_parser("attention", "attention heatmaps, one per head of a layer")
    attention.add_argument("source", help="the source sentence (GPT: the text)")
    attention.add_argument("--target", help="the target sentence (default: the model's "
                                            "greedy translation)")
    attention.add_argument("--out", required=True, help="PNG file to write")
    attention.add_argument("--kind", choices=("cross", "decoder_self", "encoder"),
                           default="cross", help="which attention (Transformer; default cross)")
    attention.add_argument("--layer", type=int, default=-1,
                           help="layer index, negative from the end (default -1: the last)")

    plot = command("plot", "training curves from a run's history.csv")
    plot.add_argument("run_dir", help="run directory written by `transformerkit train`")
    plot.add_argument("--out", help="PNG file (default RUN_DIR/history.png)")


# commands that run a model over many batches: they keep freed memory for reuse
# (transformerkit.allocator; a process-wide setting the library never makes on import)
_HEAVY_COMMANDS = ("train", "translate", "generate", "evaluate")


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
                    "plot": _plot}
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
    _print_results(run_dir, metrics)
    return 0


def _print_results(run_dir, metrics):
    print(f"\nrun directory: {run_dir}")
    for key in ("stopped_by", "steps", "train_seconds", "loss", "val_loss",
                "val_masked_accuracy", "val_bleu", "val_chrf"):
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


def _translate(args):
    run = _load(args)
    if args.n_best > max(1, args.beam):
        args.beam = args.n_best
    options = dict(beam_size=args.beam, alpha=args.alpha, n_best=args.n_best,
                   max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    texts = [_valid_text(t, f"argument {i + 1}") for i, t in enumerate(args.texts)]
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    chunks = [texts] if texts else _stdin_chunks(stdin, args.batch_size)
    offset = 0
    for chunk in chunks:
        _translate_chunk(run, chunk, offset, options)
        offset += len(chunk)
    return 0


def _translate_chunk(run, texts, offset, options):
    """Translate ``texts`` and print them in order as soon as each is ready; empty lines
    stay empty lines."""
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
            for i, result in zip(indices, results, strict=True):
                ready[real[i]] = result
            flush()
    flush()


def _generate(args):
    run = _load(args)
    _print(run.generate(_valid_text(args.prompt, "--prompt"), max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed))
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
        sources, references = corpora.load_multi30k(split, data["source_lang"],
                                                    data["target_lang"], data["data_dir"])
    elif split == "val":
        from transformerkit.training.data_setup import load_pairs

        pairs = load_pairs(data, "val")
        if pairs is None:
            raise ValueError("the run's config names no validation data; use --source and "
                             "--reference")
        sources, references = pairs
    else:
        raise ValueError(f"--split {split} exists for Multi30k only; use --source and "
                         "--reference for this run")
    return split, sources, references


def _evaluate(args):
    from rich.progress import Progress

    from transformerkit.evaluation import corpus_scores
    from transformerkit.files import atomic_write_text

    run = _load(args)
    if run.kind != "transformer":
        raise ValueError(f"evaluate needs a translation run; {args.run_dir} holds a {run.kind}")
    name, sources, references = _evaluation_data(args, run)
    if args.max_sentences:
        sources, references = sources[: args.max_sentences], references[: args.max_sentences]
    hypotheses = [None] * len(sources)
    with Progress(transient=True, console=_stderr_console()) as progress:
        task = progress.add_task(f"translating {name}", total=len(sources))
        for indices, results in run.translate_batches(
                sources, beam_size=args.beam, alpha=args.alpha,
                max_new_tokens=args.max_new_tokens, batch_size=args.batch_size):
            for i, text in zip(indices, results, strict=True):
                hypotheses[i] = text
            progress.advance(task, len(indices))
    scores = corpus_scores(hypotheses, references)
    if args.output:
        atomic_write_text(args.output, "\n".join(hypotheses) + "\n")
    _print(f"{name}: {len(sources)} sentences, beam {args.beam}, alpha {args.alpha}")
    _print(f"BLEU = {scores['bleu']:.2f}   {scores['bleu_signature']}")
    _print(f"chrF = {scores['chrf']:.2f}   {scores['chrf_signature']}")
    run_dir = RunDirectory(args.run_dir)
    metrics = run_dir.read_metrics() if os.path.exists(run_dir.metrics) else {}
    metrics.setdefault("evaluate", {})[name] = dict(
        scores, sentences=len(sources), beam_size=args.beam, alpha=args.alpha,
        checkpoint=args.checkpoint)
    run_dir.write_metrics(metrics)
    _print(f"stored in {run_dir.metrics}")
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


def _plot(args):
    from transformerkit.plotting import plot_history

    run_dir = RunDirectory(args.run_dir)
    out = plot_history(run_dir.history, args.out or run_dir.history_plot, title=args.run_dir)
    _print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
