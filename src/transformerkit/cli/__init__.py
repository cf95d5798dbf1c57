"""Command line: ``transformerkit train | summary | config | translate | generate | evaluate |
classify | embed | attention | export | plot | average | serve | import`` and
``transformerkit --version``.

``parser.py`` defines the commands and options; each command is a function of
``training.py`` (train, summary, config, plot, average), ``translation.py`` (translate,
generate, evaluate, attention, export, serve), ``encoders.py`` (classify, embed, a
classifier's evaluate) or ``checkpoints.py`` (import), sharing ``common.py``. Keras is
imported only after ``--backend`` is read, because the backend is fixed at import.

While a command runs, a warning of the library's (one whose place is in ``transformerkit``'s
code: its ``stacklevel`` points at the library's caller, here the command) is one line on
stderr, ``transformerkit COMMAND: warning: MESSAGE``, as the command's errors are, without
the file, line and source line Python shows a programmer; other packages' warnings keep
Python's form. The filters (``python -W``, ``PYTHONWARNINGS``) apply as usual, and the
setting ends with the command (``main`` called in a Python process leaves it as it was).
"""

import logging
import os
import sys
import warnings

from transformerkit.cli.checkpoints import import_command
from transformerkit.cli.encoders import classify_command, embed_command
from transformerkit.cli.parser import BACKENDS, build_parser, package_version
from transformerkit.cli.training import (
    average_command,
    config_command,
    plot_command,
    summary_command,
    train_command,
)
from transformerkit.cli.translation import (
    attention_command,
    evaluate_command,
    export_command,
    generate_command,
    serve_command,
    translate_command,
)

__all__ = ["BACKENDS", "build_parser", "main", "package_version"]

COMMANDS = {"train": train_command, "summary": summary_command, "config": config_command,
            "translate": translate_command, "generate": generate_command,
            "evaluate": evaluate_command, "classify": classify_command, "embed": embed_command,
            "attention": attention_command, "export": export_command, "plot": plot_command,
            "average": average_command, "serve": serve_command, "import": import_command}

# commands that run a model over many batches: they keep freed memory for reuse
# (transformerkit.allocator; a process-wide setting the library never makes on import)
_HEAVY_COMMANDS = ("train", "translate", "generate", "evaluate", "classify", "embed")


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from transformerkit.config import ConfigError
    from transformerkit.extras import MissingExtra

    with warnings.catch_warnings():
        warnings.showwarning = _warning_printer(args.command, warnings.showwarning)
        try:
            if args.command in _HEAVY_COMMANDS:
                from transformerkit.allocator import keep_freed_memory

                keep_freed_memory()
            return COMMANDS[args.command](args)
        except (ConfigError, ValueError, TypeError, FileNotFoundError, FileExistsError,
                OSError, FloatingPointError, MissingExtra) as err:
            print(f"transformerkit {args.command}: error: {err}", file=sys.stderr)
            return 2


_LIBRARY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # transformerkit/


def _warning_printer(command, show_otherwise):
    """A ``warnings.showwarning`` for ``command``: the library's warnings (their place in
    :data:`_LIBRARY`, or their text starting ``transformerkit:``) as one line on stderr,
    ``transformerkit COMMAND: warning: MESSAGE``; any other through ``show_otherwise``."""

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if not (text.startswith("transformerkit:")
                or os.path.abspath(filename).startswith(_LIBRARY + os.sep)):
            return show_otherwise(message, category, filename, lineno, file, line)
        text = text.removeprefix("transformerkit:").strip()
        print(f"transformerkit {command}: warning: {text}", file=file or sys.stderr,
              flush=True)

    return show
