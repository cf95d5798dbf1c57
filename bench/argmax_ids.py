"""Greedy decoding's choice over the vocabulary, each way ``argmax_ids`` can take it on eager
PyTorch (``transformerkit/decoding/common.py``), one thread by default (``--threads``):

- **numpy**: NumPy's arg-max on the CPU tensor's memory (what ``argmax_ids`` runs for a CPU
  tensor of a dtype NumPy reads);
- **chunk maxima**: each row's largest chunk maximum, then the column inside that chunk
  (what it runs for other tensors with at least ``CHUNKED_ARGMAX_MIN_ROWS`` rows);
- **torch.max**: ``torch.max(x, -1).indices`` (what it runs for fewer rows).

Each way takes the arg-max of the same ``--tensors`` float32 logits ``(rows, vocab)`` (random
normal values, a fresh tensor a call, as a step's new logits are), for each of ``--rows`` and
``--vocabs``; the ways interleaved in each of ``--repeats`` rounds, the best round kept,
microseconds a call. Each way's ids are checked against ``numpy.argmax`` before timing.

    python bench/argmax_ids.py [--rows 1,4,16,64] [--vocabs 8000,50257] [--repeats 5]
    # -> bench/results/argmax_ids.FAMILY.{json,md}
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

WAYS = ("numpy", "chunk maxima", "torch.max")


def ways():
    """``{way: f(x (rows, n) float32 CPU tensor) -> (rows,) ids}`` for :data:`WAYS`."""
    import torch

    from transformerkit.decoding.common import ARGMAX_CHUNK, _chunked_argmax

    return {"numpy": lambda x: torch.from_numpy(np.argmax(x.numpy(), axis=-1)),
            "chunk maxima": lambda x: _chunked_argmax(x, x.shape[1] // ARGMAX_CHUNK),
            "torch.max": lambda x: torch.max(x, -1).indices}


def time_ways(functions, rows_list, vocabs, repeats, tensors, seed=0):
    """One result per ``(rows, vocab)``: ``{"rows", "vocab", "us": {way: best us a call}}``;
    raises where a way's ids differ from ``numpy.argmax`` (ties included: equal values are
    put in each row)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    results = []
    for vocab in vocabs:
        for rows in rows_list:
            xs = [torch.randn(rows, vocab, generator=generator) for _ in range(tensors)]
            xs[0][:, vocab // 3] = xs[0][:, 2 * vocab // 3] = xs[0].max() + 1  # a tie
            want = [np.argmax(x.numpy(), axis=-1) for x in xs]
            for way, function in functions.items():
                for x, expected in zip(xs, want, strict=True):
                    if not np.array_equal(np.asarray(function(x)), expected):
                        raise AssertionError(f"{way} differs from numpy.argmax at {rows} "
                                             f"rows of {vocab}")
            best = {}
            for _ in range(repeats):
                for way, function in functions.items():
                    started = time.perf_counter()
                    for x in xs:
                        function(x)
                    seconds = (time.perf_counter() - started) / len(xs)
                    best[way] = min(best.get(way, seconds), seconds)
            results.append({"rows": rows, "vocab": vocab,
                            "us": {way: round(s * 1e6, 1) for way, s in best.items()}})
    return results


def table(results, repeats, threads):
    """The Markdown table of ``results``: a row per ``(rows, vocab)``, us a call per way."""
    lines = ["| rows | vocabulary | " + " | ".join(f"{way}, us" for way in WAYS) + " |",
             "|---:|---:|" + "---:|" * len(WAYS)]
    for row in results:
        lines.append(f"| {row['rows']} | {row['vocab']} | "
                     + " | ".join(f"{row['us'][way]:.1f}" for way in WAYS) + " |")
    lines.append("")
    lines.append(f"Float32 logits, a fresh tensor a call, {threads} thread(s), best of "
                 f"{repeats} interleaved rounds.")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,16,64")
    parser.add_argument("--vocabs", default="8000,50257")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tensors", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="argmax_ids")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    results = time_ways(ways(), [int(n) for n in args.rows.split(",")],
                        [int(n) for n in args.vocabs.split(",")], args.repeats, args.tensors)
    payload = {"machine": dict(common.machine(), torch_version=torch.__version__,
                               numpy_version=np.__version__),
               "repeats": args.repeats, "threads": args.threads, "tensors": args.tensors,
               "results": results}
    common.write_results(args.name, payload, table(results, args.repeats, args.threads))


if __name__ == "__main__":
    main()
