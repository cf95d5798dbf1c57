"""A GPT's prompt written into its caches three ways, one row (``--threads``, default 1):

- **eager**: the loaded model's ``decode_prefill`` (the eager code), what the compiled
  engine runs with its model loaded;
- **prompt package**: :data:`~transformerkit.decoding.aot_step.PREFILL`, that code captured
  and compiled ahead of time, what the engine's stand-in (no Keras, no model file) runs for a
  prompt of :data:`~transformerkit.decoding.aot_files.PROMPT_PACKAGE_FROM` positions or more;
- **step package**: the small-rows step package one position a call, what the stand-in
  runs below that;

for prompts of each of ``--lengths`` positions (random ids), the three interleaved in each
of ``--repeats`` rounds, the best kept; each way's caches compared with the eager pass's
(the largest absolute difference). Also the seconds to load each package from its file in
a new process (what a stand-in pays before its first call with it; best of ``--repeats``)
and to build it. These are the figures the engine's policy rests on (the stand-in steps a
short prompt, because loading the prompt package costs what stepping some positions does;
the loaded engine keeps its eager pass, because the package is not faster).

    python bench/prompt_pass.py GPT_RUN [--lengths 8,16,32,64,190] [--repeats 5]
    # -> bench/results/prompt_pass.FAMILY.{json,md}
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.abspath(__file__)
WAYS = ("eager", "prompt package", "step package")


def load_worker(path):
    """Seconds to load the package ``path`` in this (new) process, PyTorch imported first."""
    import torch  # noqa: F401

    from transformerkit.decoding import aot_packages

    started = time.perf_counter()
    aot_packages.load(path)
    return {"seconds": time.perf_counter() - started}


def fill_ways(eager_steps, packaged_steps):
    """``{way: fill(tokens) -> caches}`` for :data:`WAYS`: ``tokens`` ``(rows, length)``
    written into new caches of ``length + 1`` positions by the engine's own code: the loaded
    model's :class:`~transformerkit.decoding.eager_steps.EagerSteps` (``eager_steps``: its
    one pass) and the stand-in's :class:`~transformerkit.decoding.aot_files.PackagedSteps`
    (``packaged_steps``, its packages looked up: the prompt package's one call, and the step
    package one position a call)."""
    from transformerkit.decoding.aot_step import PREFILL

    def eager(tokens):
        return eager_steps._start_language_model(tokens, tokens.shape[1],
                                                 tokens.shape[1] + 1)[0]

    def packaged(tokens):
        return packaged_steps._fill_prompt(packaged_steps._run.get(PREFILL), tokens,
                                           tokens.shape[1], tokens.shape[1] + 1)[0]

    def stepped(tokens):
        return packaged_steps._step_prompt(tokens, tokens.shape[1], tokens.shape[1] + 1)[0]

    return dict(zip(WAYS, (eager, packaged, stepped), strict=True))


def max_difference(caches, reference, length):
    """The largest absolute difference between the first ``length`` positions of two sets
    of caches."""
    return max(float((t[:length] - r[:length]).abs().max())
               for pair, ref in zip(caches, reference, strict=True)
               for t, r in zip(pair, ref, strict=True))


def time_ways(ways, lengths, repeats, vocab, seed=0):
    """One dict per length: each way's best milliseconds over ``repeats`` interleaved
    rounds (the order reversed every other round) and its caches' largest difference from
    the eager pass's."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    results = []
    names = list(ways)
    with torch.inference_mode():
        for length in lengths:
            tokens = torch.randint(0, vocab, (1, length), generator=generator)
            reference = ways[names[0]](tokens)
            row = {"length": length, "ms": {}, "max_difference": {}}
            for name in names:  # a first call each (kernels' first use), checked
                row["max_difference"][name] = max_difference(ways[name](tokens), reference,
                                                             length)
            for round_index in range(repeats):
                for name in names if round_index % 2 == 0 else names[::-1]:
                    started = time.perf_counter()
                    ways[name](tokens)
                    ms = (time.perf_counter() - started) * 1000
                    row["ms"][name] = min(row["ms"].get(name, ms), ms)
            results.append(row)
    return results


def table(results, loads, builds, repeats):
    """The Markdown table of :func:`time_ways`' ``results`` and the packages' ``loads`` and
    ``builds`` (``{way: seconds}``): each length's time per way, and the prompt package's
    with its load added (what a stand-in's first long prompt pays) against stepping."""
    loaded = loads[WAYS[1]] * 1000
    lines = ["| prompt positions | " + " | ".join(f"{way}, ms" for way in WAYS)
             + " | prompt package with its load, ms | caches' largest difference from eager "
               "(prompt / step package) |",
             "|---:|" + "---:|" * (len(WAYS) + 1) + "---|"]
    for row in results:
        lines.append(f"| {row['length']} | "
                     + " | ".join(f"{row['ms'][way]:.1f}" for way in WAYS)
                     + f" | {row['ms'][WAYS[1]] + loaded:.1f}"
                     + f" | {row['max_difference'][WAYS[1]]:.1e} / "
                       f"{row['max_difference'][WAYS[2]]:.1e} |")
    lines.append("")
    lines.append("| package | load from its file in a new process, s | build, s |")
    lines.append("|---|---:|---:|")
    for way in WAYS[1:]:
        lines.append(f"| {way} | {loads[way]:.2f} | {builds[way]:.1f} |")
    lines.append("")
    lines.append(f"One row, float32, best of {repeats} interleaved rounds.")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="run directory of a GPT")
    parser.add_argument("--lengths", default="8,16,32,64,190")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="prompt_pass")
    parser.add_argument("--load-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_worker:
        print(json.dumps(load_worker(args.load_worker)))
        return
    if args.run is None:
        parser.error("the GPT's run directory (RUN) is required")
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import torch

    torch.set_num_threads(args.threads)
    import transformerkit
    from transformerkit.decoding import aot_files, aot_step
    from transformerkit.decoding.eager_steps import EagerSteps

    model = transformerkit.load(args.run).model
    lengths = [int(n) for n in args.lengths.split(",")]
    with tempfile.TemporaryDirectory() as cache:
        # the stand-in the engine makes without Keras, over an empty cache: its first use of
        # each package builds it from the model (as the engine does where one is missing)
        aot_files.record("bench", model, cache)
        packaged = aot_files.PackagedSteps(aot_files.PackagedModel(
            aot_files.read_record("bench", cache), cache, load=lambda: model))
        packaged._run = packaged.runner()
        builds = {}
        for way, bucket in zip(WAYS[1:], (aot_step.PREFILL, "small"), strict=True):
            started = time.perf_counter()
            packaged._run.get(bucket)
            builds[way] = time.perf_counter() - started
        results = time_ways(fill_ways(EagerSteps(model), packaged), lengths, args.repeats,
                            model.vocab_size)
        loads = {}
        for _ in range(args.repeats):
            for way, bucket in zip(WAYS[1:], (aot_step.PREFILL, "small"), strict=True):
                path = packaged.model.package_path(bucket, "float32")
                out = common.run_worker(HERE, ["--load-worker", path],
                                        {"OMP_NUM_THREADS": str(args.threads)})
                if "error" in out:
                    raise SystemExit(f"loading the {way} failed: {out['error']}")
                loads[way] = min(loads.get(way, out["seconds"]), out["seconds"])
    payload = {"machine": dict(common.machine(), torch_version=torch.__version__),
               "run": os.path.abspath(args.run), "repeats": args.repeats,
               "threads": args.threads, "results": results, "loads": loads,
               "builds": builds}
    common.write_results(args.name, payload, table(results, loads, builds, args.repeats))


if __name__ == "__main__":
    main()
