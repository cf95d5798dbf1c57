"""The commands of an encoder run: ``classify``, ``embed`` and ``evaluate``'s accuracy and
confusion counts."""

import os
import sys

from transformerkit.cli.common import echo, evaluation_data, input_texts, load_run, options_of
from transformerkit.run_directory import RunDirectory


def evaluate_classifier(args, run):
    """``evaluate`` of an encoder run: accuracy, the confusion counts and per-class scores
    of a split (``--split``, default val) or of ``--source TEXTS --reference LABELS``."""
    from transformerkit.decoding.options import SearchOptions
    from transformerkit.evaluation import classification_scores, format_confusion

    name, texts, gold = evaluation_data(args, run)
    if args.max_sentences:
        texts, gold = texts[: args.max_sentences], gold[: args.max_sentences]
    gold = [label.strip() for label in gold]
    unknown = sorted(set(gold) - set(run.labels))
    if unknown:
        raise ValueError(f"the labels {unknown[:5]} are not among the run's classes "
                         f"{run.labels[:20]}")
    batch_size = options_of(args, SearchOptions).batch_size  # evaluate's --batch-size
    predicted = run.classify(texts, batch_size=batch_size)
    scores = classification_scores(predicted, gold, run.labels)
    if args.output:
        from transformerkit.files import atomic_write_text

        atomic_write_text(args.output, "\n".join(predicted) + "\n")
    echo(f"{name}: {scores['examples']} texts, {len(run.labels)} classes")
    echo(f"accuracy = {scores['accuracy']:.4f}")
    echo(format_confusion(scores))
    for label, values in scores["per_class"].items():
        echo(f"{label}: precision {values['precision']:.4f} recall {values['recall']:.4f} "
               f"f1 {values['f1']:.4f} support {values['support']}")
    run_dir = RunDirectory(args.run_dir)
    metrics = run_dir.read_metrics() if os.path.exists(run_dir.metrics) else {}
    metrics.setdefault("evaluate", {})[name] = dict(scores, checkpoint=run.runtime.checkpoint)
    run_dir.write_metrics(metrics)
    echo(f"stored in {run_dir.metrics}")
    return 0


def classify_command(args):
    """``classify RUN [TEXT ...]``: one line per text, LABEL (``--probabilities``: every
    class with its probability, most likely first); an empty input line gives an empty
    output line."""
    run = load_run(args)
    for chunk in input_texts(args):
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
            echo(line)
    return 0


def embed_command(args):
    """``embed RUN``: the embedding of each stdin line, printed as one line of numbers or
    written with ``--out`` as a ``(lines, d_model)`` float32 .npy array. An empty line is
    an error naming it (it has no embedding)."""
    import numpy as np

    from transformerkit.files import atomic_path

    run = load_run(args)
    args.texts = []
    parts, offset = [], 0
    for chunk in input_texts(args):
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
            echo(" ".join(f"{x:.6g}" for x in row))
    if args.out:
        if not parts:
            raise ValueError("stdin had no lines to embed")
        array = np.concatenate(parts).astype("float32")
        with atomic_path(args.out) as tmp, open(tmp, "wb") as f:
            np.save(f, array)
        print(f"wrote {args.out}: {array.shape[0]} x {array.shape[1]} float32",
              file=sys.stderr)
    return 0
