"""A beam search's compiled step work, its best candidates taken two ways, per call.

The compiled engine runs a beam search's own work of a step (the candidates' scores, the
best ``2 * beam`` of each sentence, the finished hypotheses, the next beams) as one package
(:mod:`transformerkit.decoding.aot_search`). Its selection is captured two ways:

- **written**: the scores of every extension written out, ``(rows, vocab)`` floats
  (log-softmax plus the prefix's score, the token rules), then ``chunked_top_k`` of them,
  as the eager loop does (and the package did before the other way);
- **unwritten**: the scores computed inside the chunk maxima's reduction and again for the
  best chunks' columns only, never written (``grouped_top_k``): what the engine builds now.

Both are built here from the same function, the one a beam search of ``RUN``'s model hands
the engine (``beam.SCORE_CHUNK`` wider than the vocabulary makes the capture take the
written way), and called on the same inputs (random logits of the model's vocabulary, beams
``--beam``, a step at index 5) at each of ``--sentences`` (rows = sentences x beam), the two
interleaved in each of ``--repeats`` rounds of ``--calls`` calls, the median and best
milliseconds a call kept; their outputs must be identical, else the bench stops.

    python bench/search_work.py RUN [--beam 4] [--sentences 1,16,64] [--repeats 15]
    # -> bench/results/search_work.FAMILY.{json,md}
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

WAYS = ("written", "unwritten")
INDEX = 5  # the step the inputs are at


def search_work(model, beam_size):
    """``(work, settings)``: the step work and settings a compiled beam search of ``model``
    (one sentence, ``beam_size`` beams) hands the engine to package."""
    import numpy as np

    from transformerkit.decoding import beam_translate
    from transformerkit.decoding.aot_step import CompiledSteps

    found = []
    original = CompiledSteps.search_work

    def recorded(self, work, settings):
        found.append((work, settings))
        return original(self, work, settings)

    CompiledSteps.search_work = recorded
    try:
        beam_translate(model, np.array([[5, 6, 7, 2]], "int32"), beam_size=beam_size,
                       max_new_tokens=4, use_cache="compiled")
    finally:
        CompiledSteps.search_work = original
    return found[0]


def build_ways(work, settings, folder):
    """``{way: (package call, build seconds)}``, each way's package built into ``folder``."""
    from transformerkit.decoding import aot_packages, aot_search, beam

    packages, chunk = {}, beam.SCORE_CHUNK
    for way in WAYS:
        beam.SCORE_CHUNK = settings["vocab"] + 1 if way == "written" else chunk
        path = os.path.join(folder, f"search-{way}.pt2")
        started = time.perf_counter()
        try:
            aot_search.build_package(work, settings, path)
        finally:
            beam.SCORE_CHUNK = chunk
        packages[way] = (aot_packages.load(path), time.perf_counter() - started)
    return packages


def inputs_for(sentences, beam_size, vocab, width=16, seed=0):
    """The package's inputs (:data:`~transformerkit.decoding.aot_search.FIELDS` after the
    logits and the index) for ``sentences`` sentences at step :data:`INDEX`: random logits
    and live beams' log-probabilities, nothing finished yet."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    rows = sentences * beam_size
    return [torch.randn(rows, vocab, generator=generator) * 3, torch.tensor(INDEX),
            torch.randint(3, vocab, (rows, width), dtype=torch.int32, generator=generator),
            -torch.rand(sentences, beam_size, generator=generator) * 5,
            torch.zeros(rows, width, dtype=torch.int32),
            torch.full((sentences, beam_size), float("-inf")),
            torch.full((sentences, beam_size), float("-inf")),
            torch.zeros(sentences, beam_size, dtype=torch.int32), torch.ones(sentences),
            torch.full((sentences,), width - 1, dtype=torch.int32),
            torch.ones(sentences, dtype=torch.bool)]


def time_ways(packages, sentences_list, beam_size, vocab, repeats, calls):
    """One dict per sentence count: each way's median and best ms a call over ``repeats``
    interleaved rounds (the order reversed every other round) of ``calls`` calls."""
    import torch

    results = []
    for sentences in sentences_list:
        inputs = inputs_for(sentences, beam_size, vocab)
        outputs = {way: packages[way][0](list(inputs)) for way in WAYS}
        if not all(torch.equal(a, b) for a, b in zip(*outputs.values(), strict=True)):
            raise SystemExit(f"the two ways differ at {sentences} sentences")
        ms = {way: [] for way in WAYS}
        for round_index in range(repeats):
            for way in WAYS if round_index % 2 == 0 else WAYS[::-1]:
                started = time.perf_counter()
                for _ in range(calls):
                    packages[way][0](list(inputs))  # a boxed call may empty its list
                ms[way].append((time.perf_counter() - started) * 1000 / calls)
        results.append({"sentences": sentences, "rows": sentences * beam_size,
                        "median_ms": {w: round(statistics.median(ms[w]), 4) for w in WAYS},
                        "best_ms": {w: round(min(ms[w]), 4) for w in WAYS}})
    return results


def table(results, builds, beam_size, vocab, repeats, calls, threads=1):
    """The Markdown table of :func:`time_ways`' ``results`` on ``threads`` threads."""
    lines = ["| sentences | rows | written, ms a call | unwritten, ms a call | "
             "unwritten / written |", "|---:|---:|---:|---:|---:|"]
    for row in results:
        written, unwritten = row["median_ms"]["written"], row["median_ms"]["unwritten"]
        lines.append(f"| {row['sentences']} | {row['rows']} | {written:.3f} | "
                     f"{unwritten:.3f} | {unwritten / written:.2f} |")
    lines.append("")
    lines.append(f"Beam {beam_size}, {vocab} words, the step at index {INDEX}; median of "
                 f"{repeats} interleaved rounds of {calls} calls, {threads} "
                 f"thread{'s' if threads > 1 else ''}; both ways give "
                 f"identical outputs. Built in {builds['written']:.0f} s (written) and "
                 f"{builds['unwritten']:.0f} s (unwritten).")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory of a Transformer")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--sentences", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="search_work")
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import torch

    torch.set_num_threads(args.threads)
    import transformerkit

    model = transformerkit.load(args.run).model
    work, settings = search_work(model, args.beam)
    sentences = [int(n) for n in args.sentences.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        packages = build_ways(work, settings, folder)
        results = time_ways(packages, sentences, args.beam, settings["vocab"], args.repeats,
                            args.calls)
    builds = {way: round(packages[way][1], 1) for way in WAYS}
    payload = {"machine": dict(common.machine(), torch_version=torch.__version__),
               "run": os.path.abspath(args.run), "beam": args.beam,
               "vocab": settings["vocab"], "repeats": args.repeats, "calls": args.calls,
               "threads": args.threads, "results": results, "builds": builds}
    common.write_results(args.name, payload, table(results, builds, args.beam,
                                                   settings["vocab"], args.repeats,
                                                   args.calls, args.threads))


if __name__ == "__main__":
    main()
