"""Command line: ``transformerkit train | summary``.

Keras is imported only after ``--backend`` is read, because the backend is fixed at import.
"""

import argparse
import logging
import os
import sys


def _parser():
    parser = argparse.ArgumentParser(
        prog="transformerkit",
        description="Train and use Transformers (Attention Is All You Need) on Keras 3.")
    parser.add_argument("--backend", choices=("torch", "jax", "tensorflow"),
                        help="Keras backend (default: $KERAS_BACKEND, else torch)")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model from a YAML config")
    train.add_argument("config", help="YAML file with model/data/train sections")
    train.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="SECTION.KEY=VALUE", help="override a config key (repeatable)")
    train.add_argument("--out", help="run directory (default: runs/<config name>)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its latest checkpoint")
    train.add_argument("--data-dir", help="data directory (default: $TRANSFORMERKIT_DATA)")

    summary = sub.add_parser("summary", help="parameter counts per component")
    summary.add_argument("target", help="a config YAML or a run directory")
    summary.add_argument("--set", dest="overrides", action="append", default=[],
                         metavar="SECTION.KEY=VALUE")
    summary.add_argument("--vocab-size", type=int, default=None,
                         help="vocabulary size for a config (default: data.vocab_size)")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from transformerkit.config import ConfigError

    try:
        return {"train": _train, "summary": _summary}[args.command](args)
    except (ConfigError, ValueError, TypeError, FileNotFoundError, FileExistsError, OSError,
            FloatingPointError) as err:
        print(f"transformerkit {args.command}: error: {err}", file=sys.stderr)
        return 2


def _train(args):
    from transformerkit.config import load_config
    from transformerkit.training.trainer import train

    run_dir = args.out or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    overrides = list(args.overrides)
    if args.data_dir:
        overrides.append(f"data.data_dir={args.data_dir}")
    if args.resume:
        saved = os.path.join(run_dir, "config.yaml")
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
    samples = os.path.join(run_dir, "samples.txt")
    if os.path.exists(samples):
        with open(samples, encoding="utf-8") as f:
            print("\n" + f.read())


def _summary(args):
    from transformerkit.config import load_config
    from transformerkit.models.factory import build_model
    from transformerkit.training.summary import format_summary, parameter_summary

    if os.path.isdir(args.target):
        from transformerkit.saving import load_model

        model = load_model(os.path.join(args.target, "model.keras"), compile=False)
    else:
        config = load_config(args.target, args.overrides)
        vocab = args.vocab_size or config["data"]["vocab_size"]
        model = build_model(config["model"], vocab, vocab)
    print(f"{type(model).__name__}")
    print(format_summary(parameter_summary(model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
