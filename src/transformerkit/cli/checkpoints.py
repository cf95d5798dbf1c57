"""``transformerkit import SOURCE --out RUN``: a Hugging Face checkpoint as a run directory
(:func:`transformerkit.importing.import_checkpoint`)."""

from transformerkit.cli.common import echo


def import_command(args):
    from transformerkit.importing import import_checkpoint

    run, model_type = import_checkpoint(args.source, args.out, force=args.force)
    echo(f"imported {args.source} ({model_type}) into {run}")
    return 0
