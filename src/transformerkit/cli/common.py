"""What the commands share: loading a run, reading texts from arguments or stdin as valid
Unicode, printing, and the options the flags give."""

import dataclasses
import os
import sys


# -- using a trained run ------------------------------------------------------------------------
def load_run(args):
    """The run of ``args.run_dir`` with the runtime options the command line gives
    (``--checkpoint``, and for the commands that have them ``--engine``, ``--precision``,
    ``--threads``; the declared defaults for the others): ``Run.runtime``."""
    from transformerkit.api import load
    from transformerkit.decoding.options import RuntimeOptions

    return load(args.run_dir, options_of(args, RuntimeOptions))


def echo(text=""):
    print(text, flush=True)


def valid_text(text, where):
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


def stdin_chunks(stream, max_lines):
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
        chunk.append(valid_text(line, f"stdin line {number}").rstrip("\r\n"))
        try:
            more = len(chunk) < max_lines and bool(select.select([stream], [], [], 0)[0])
        except (OSError, ValueError):  # not selectable (e.g. a StringIO in tests)
            more = len(chunk) < max_lines
        if not more:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def input_texts(args):
    """The command line's TEXT arguments, else stdin's lines in chunks (as translate)."""
    texts = [valid_text(t, f"argument {i + 1}") for i, t in enumerate(args.texts)]
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    return [texts] if texts else stdin_chunks(stdin, args.batch_size)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def options_of(args, options_class, base=None):
    """The :mod:`~transformerkit.decoding.options` instance the command line gives: ``base``
    (the run's own options, e.g. ``Run.search``; None: the declared defaults) with the
    flags that were given replacing its values (``cli/parser.py`` leaves a flag not given
    out of ``args``)."""
    from dataclasses import fields

    from transformerkit.decoding.options import resolve

    given = {f.name: getattr(args, f.name) for f in fields(options_class)
             if hasattr(args, f.name)}
    return resolve(options_class, base, given, "the command line")


def evaluation_data(args, run):
    """``(name, sources, references)`` from ``--source/--reference`` or a split of the
    run's data (read from :func:`evaluation_data_dir`)."""
    from transformerkit.data import corpora

    if args.source or args.reference:
        if not (args.source and args.reference):
            raise ValueError("--source and --reference go together")
        sources, references = corpora.read_parallel(args.source, args.reference)
        return os.path.splitext(os.path.basename(args.source))[0], sources, references
    data = run.config.data
    data = dataclasses.replace(data, data_dir=evaluation_data_dir(args.data_dir, data))
    split = args.split or ("test2016" if data.dataset == "multi30k" else "val")
    if data.dataset == "multi30k":
        split = "test2016" if split == "test" else split
        sources, references = corpora.load_multi30k(split, data.source_lang, data.target_lang,
                                                    data.data_dir)
    elif split == "test2016":
        raise ValueError("--split test2016 is Multi30k's; this run's test split is --split "
                         "test")
    else:
        from transformerkit.training.corpus_specs import load_pairs

        pairs = load_pairs(data, split)
        if pairs is None:
            keys = {"val": "val_source/val_target, val_tsv or val_files",
                    "test": "test_source/test_target, test_tsv or test_files"}[split]
            raise ValueError(f"the run's config names no {split} data (data.{keys}); use "
                             "--source and --reference")
        sources, references = pairs
    return split, sources, references


def evaluation_data_dir(flag, data):
    """The data directory ``evaluate`` reads a run's split from: ``--data-dir``, else
    ``$TRANSFORMERKIT_DATA``, else the one the run recorded (``data.data_dir`` of its
    ``config.yaml``: ``train`` writes there the absolute directory it read), else None (the
    default cache, where Multi30k is downloaded)."""
    return flag or os.environ.get("TRANSFORMERKIT_DATA") or data.data_dir
