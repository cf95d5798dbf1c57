"""The commands around training: ``train``, ``summary``, ``config``, ``plot``, ``average``."""

import os

from transformerkit.cli.common import echo
from transformerkit.run_directory import RunDirectory


def train_command(args):
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


def summary_command(args):
    from transformerkit.config import load_config
    from transformerkit.models.factory import build_model
    from transformerkit.training.summary import format_summary, parameter_summary

    if args.plot:  # a wrong suffix fails before any work
        from transformerkit.training.diagram import check_format

        check_format(args.plot)
    if os.path.isdir(args.target):
        from transformerkit.saving import load_model

        model = load_model(RunDirectory(args.target).model, compile=False)
    else:
        config = load_config(args.target, args.overrides)
        vocab = args.vocab_size or config.data.vocab_size
        model = build_model(config.model, vocab, vocab)
    print(f"{type(model).__name__}")
    print(format_summary(parameter_summary(model)))
    if args.plot:
        from transformerkit.training.diagram import write_diagram

        write_diagram(model, args.plot)
        print(f"wrote {args.plot}")
    return 0


def config_command(args):
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


def plot_command(args):
    if args.lr:
        return _plot_learning_rate(args)
    from transformerkit.plotting import plot_history

    run_dir = RunDirectory(args.target)
    out = plot_history(run_dir.history, args.out or run_dir.history_plot, title=args.target)
    echo(f"wrote {out}")
    return 0


def _plot_learning_rate(args):
    """``plot CONFIG|RUN --lr``: the schedule over the run's steps (``--steps``, else the
    steps a trained run took, else ``train.max_steps``), with the cooldown window a trained
    run recorded."""
    from transformerkit.config import load_config
    from transformerkit.plotting import plot_learning_rate
    from transformerkit.training.schedules import cooldown_fraction
    from transformerkit.training.trainer import learning_rates

    is_run = os.path.isdir(args.target)
    run = RunDirectory(args.target) if is_run else None
    config = load_config(run.config if is_run else args.target, args.overrides)
    steps, window = args.steps, None
    if is_run and os.path.isfile(run.metrics):
        metrics = run.read_metrics()
        steps = steps or metrics.get("steps")
        if "cooldown_end" in metrics:  # the cooldown window the run followed
            window = metrics
    steps = steps or config.train.max_steps
    assumed = ""
    if not steps and config.train.optimizer == "paper":
        # the warmup schedule does not depend on the run's length (a time budget leaves it
        # open): show its warmup and three times as much decay, a cooldown at their end
        steps = 4 * config.train.warmup_steps
        fraction = cooldown_fraction(config.train)
        assumed = (f"; the config sets no length (train.max_steps), so {steps} steps = 4 x "
                   "train.warmup_steps are shown: "
                   + (f"a time budget ends the run where its measured update rate says, "
                      f"with the last {fraction:.0%} cooled down to zero"
                      if fraction else "the paper schedule does not depend on the run's length")
                   + " (--steps N for another)")
    if not steps:
        raise ValueError("--lr needs the run's length: adamw_cosine decays until the run's "
                         "last step, which the config does not fix (no train.max_steps; a "
                         "time budget or the epochs' batches decide it); give --steps N, "
                         "e.g. epochs x updates per epoch")
    rates = learning_rates(config, int(steps), window)
    default = (os.path.join(args.target, "learning_rate.png") if is_run else
               f"{os.path.splitext(os.path.basename(args.target))[0]}-lr.png")
    out = plot_learning_rate(list(rates), args.out or default,
                             title=f"{args.target}: learning rate ({config.train.optimizer})")
    peak = int(rates.argmax())
    echo(f"wrote {out} ({len(rates)} steps, peak {rates[peak]:.3g} at step {peak + 1}){assumed}")
    return 0


def average_command(args):
    from transformerkit.training.averaging import average_checkpoints

    out, paths = average_checkpoints(args.run_dir, args.last, args.out)
    echo(f"wrote {out}: the mean of {', '.join(os.path.basename(p) for p in paths)}")
    return 0
