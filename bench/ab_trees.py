"""Is a change slower? The same training step and decoding, timed on two git revisions of
``src/`` in alternating processes.

A refactor that should not change speed (new homes for the training step, typed options,
routers) is checked with this script: each revision's ``src/`` is exported with ``git
archive`` into a temporary folder, and one worker process per (revision, measurement) runs
it with that folder first on ``PYTHONPATH``. The pairs alternate (before, after; then
after, before; ...), so a machine that drifts (other processes, frequency) hits both sides
alike; each pair gives a ratio after/before, and the report gives the median ratio and its
range over the pairs. Each worker also reports a digest of what it computed (the weights
after the steps, the decoded ids), which must be the same on both revisions where the
change is meant to keep every number.

Measurements (randomly initialised, seeded; no data needed):

- ``train``: the small Multi30k Transformer (3+3 layers, d_model 256, 8 heads, d_ff 512,
  8000 ids, tied) on one batch of 96 x 22 source and 23 target ids: 3 warm-up steps, then
  the time of ``--steps`` steps;
- ``greedy``: the same model decoding 64 sentences of 20 ids to exactly 32 tokens;
- ``beam4``: beam search of width 4 on 32 sentences, exactly 32 tokens.

    python bench/ab_trees.py --before f53d7f9 --after HEAD --pairs 6
    # -> bench/results/ab_trees.FAMILY.{json,md}
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))
MEASUREMENTS = ("train", "greedy", "beam4")
SMALL = dict(vocab=8000, layers=3, d_model=256, heads=8, d_ff=512)


def small_model():
    """The small Transformer, seeded, built."""
    import keras

    from transformerkit.models import Transformer

    keras.utils.set_random_seed(0)
    return Transformer(SMALL["vocab"], SMALL["vocab"], num_layers=SMALL["layers"],
                       d_model=SMALL["d_model"], num_heads=SMALL["heads"],
                       d_ff=SMALL["d_ff"], max_length=256, tie_embeddings="all")


def digest(arrays):
    """A short hash of ``arrays`` (bytes of each, in order)."""
    h = hashlib.sha256()
    for array in arrays:
        h.update(array.tobytes())
    return h.hexdigest()[:16]


def train_worker(steps):
    """Seconds per step of the small model, and a digest of its weights after."""
    import numpy as np

    from transformerkit import training

    model = small_model()
    model.compile(optimizer=training.paper_optimizer(SMALL["d_model"], 4000),
                  loss=training.MaskedCrossEntropy(0.1))
    if hasattr(training, "attach_train_step"):  # revisions where training/ owns the step
        training.attach_train_step(model)
    rng = np.random.default_rng(0)
    source = rng.integers(4, SMALL["vocab"], (96, 22)).astype("int32")
    target = rng.integers(4, SMALL["vocab"], (96, 24)).astype("int32")
    batch = ((source, target[:, :-1]), target[:, 1:])
    for _ in range(3):
        model.train_on_batch(*batch)
    start = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(*batch)
    seconds = (time.perf_counter() - start) / steps
    return seconds, digest(np.asarray(w) for w in model.get_weights())


def decode_worker(search, repeats):
    """Seconds per batch of forced 32-token decoding, and a digest of the ids."""
    import numpy as np

    from transformerkit.decoding import beam_translate, greedy_translate

    model = small_model()
    rng = np.random.default_rng(1)
    rows = 64 if search == "greedy" else 32
    ids = rng.integers(4, SMALL["vocab"], (rows, 20)).astype("int32")
    forced = dict(max_new_tokens=32, min_new_tokens=32, max_len_a=None, max_len_b=None)
    if search == "greedy":
        def decode():
            return greedy_translate(model, ids, **forced)
    else:
        def decode():
            return [h[0].ids for h in beam_translate(model, ids, beam_size=4, **forced)]
    decode()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = decode()
        times.append(time.perf_counter() - start)
    return min(times), digest(np.asarray(row, dtype="int64") for row in out)


def worker(measurement, steps, repeats):
    import transformerkit

    if measurement == "train":
        seconds, fingerprint = train_worker(steps)
    else:
        seconds, fingerprint = decode_worker(measurement, repeats)
    return {"seconds": seconds, "digest": fingerprint, "source": transformerkit.__file__}


def export_src(rev, folder):
    """``rev``'s ``src/`` under ``folder``; its commit id."""
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", REPO, "archive", commit, "src"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return commit


def measure(src, measurement, args):
    env = {"PYTHONPATH": os.path.join(src, "src"), "OMP_NUM_THREADS": str(args.threads),
           "TRANSFORMERKIT_MALLOC": "system"}
    result = common.run_worker(HERE, ["--worker", measurement, "--steps", str(args.steps),
                                      "--repeats", str(args.repeats)], env)
    if "error" in result:
        raise SystemExit(f"{measurement} on {src}: {result['error']}")
    if not result["source"].startswith(src):
        raise SystemExit(f"the worker imported {result['source']}, not {src}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="HEAD~1", help="git revision measured first")
    parser.add_argument("--after", default="HEAD", help="git revision compared with it")
    parser.add_argument("--pairs", type=int, default=6, help="alternating pairs per measurement")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    parser.add_argument("--repeats", type=int, default=3, help="timed decodes (best kept)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default=",".join(MEASUREMENTS),
                        help="comma list of " + ", ".join(MEASUREMENTS))
    parser.add_argument("--name", default="ab_trees")
    parser.add_argument("--worker", choices=MEASUREMENTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.repeats)))
        return
    chosen = [m for m in args.only.split(",") if m]
    unknown = set(chosen) - set(MEASUREMENTS)
    if unknown or args.pairs < 1:
        raise SystemExit(f"--only takes {MEASUREMENTS}; --pairs >= 1 (got {args.only!r})")
    with tempfile.TemporaryDirectory() as before, tempfile.TemporaryDirectory() as after:
        commits = {"before": export_src(args.before, before),
                   "after": export_src(args.after, after)}
        trees = {"before": before, "after": after}
        results = {m: {"before": [], "after": []} for m in chosen}
        for pair in range(args.pairs):
            order = ("before", "after") if pair % 2 == 0 else ("after", "before")
            for measurement in chosen:
                for side in order:
                    results[measurement][side].append(measure(trees[side], measurement, args))
                print(f"pair {pair + 1}/{args.pairs} {measurement}: " + ", ".join(
                    f"{side} {results[measurement][side][-1]['seconds'] * 1e3:.1f} ms"
                    for side in ("before", "after")), flush=True)
    rows, summary = [], {}
    for measurement in chosen:
        before_runs, after_runs = results[measurement]["before"], results[measurement]["after"]
        ratios = [a["seconds"] / b["seconds"] for a, b in zip(after_runs, before_runs, strict=True)]
        same = {r["digest"] for r in before_runs} == {r["digest"] for r in after_runs}
        summary[measurement] = {
            "before_ms": [r["seconds"] * 1e3 for r in before_runs],
            "after_ms": [r["seconds"] * 1e3 for r in after_runs],
            "ratios": ratios, "median_ratio": statistics.median(ratios),
            "same_numbers": same}
        rows.append(f"| {measurement} | {args.pairs} | "
                    f"{statistics.median(summary[measurement]['before_ms']):.1f} | "
                    f"{statistics.median(summary[measurement]['after_ms']):.1f} | "
                    f"{statistics.median(ratios):.3f} | {min(ratios):.3f}-{max(ratios):.3f} | "
                    f"{'yes' if same else 'no'} |")
    table = "\n".join([
        f"After ({args.after}, {commits['after'][:10]}) against before ({args.before}, "
        f"{commits['before'][:10]}), alternating processes, {args.threads} threads.", "",
        "| measurement | pairs | before ms (median) | after ms (median) | after / before "
        "(median) | range | same numbers |",
        "|---|---:|---:|---:|---:|---|---|", *rows])
    common.write_results(args.name, {"machine": common.machine(), "commits": commits,
                                     "args": vars(args), "results": summary}, table)


if __name__ == "__main__":
    main()
