"""When finished rows leave a greedy search's batch: ``greedy.DROP_SHARE`` by speed.

Greedy search in the eager loop takes a finished row's output at once and drops the
finished rows from the batch (gathering the kept rows' encoder memory and caches, or the
compiled engine's cache table) once they make up ``DROP_SHARE`` of it. This times greedy
decoding to the end token of the first ``--sentences`` sentences of Multi30k test2016
(``bench/decode.py``'s length-sorted batches of 64, at most 64 tokens) for each share of
``--shares`` (0: drop at every step that has a finished row) and each engine precision of
``--systems``, in one process per system, the shares taking turns pass by pass (every other
round in the reverse order), ``--rounds`` passes each, the best kept; the outputs of every
share are checked equal to the first's.

    python bench/drop_share.py RUN [--systems tk-compiled,tk-compiled-int8] [--rounds 7]
    # -> bench/results/drop_share.FAMILY.{json,md}
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode  # noqa: E402

HERE = os.path.abspath(__file__)
SYSTEMS = {"tk-float32": (True, "float32"), "tk-compiled": ("compiled", "float32"),
           "tk-compiled-int8": ("compiled", "int8")}


def worker(spec):
    """One system's passes: ``{share: [seconds, ...]}`` and whether every share's outputs
    equal the first share's."""
    import torch

    import transformerkit
    from transformerkit.decoding import greedy

    transformerkit.keep_freed_memory()
    torch.set_num_threads(spec["threads"])
    cache, precision = SYSTEMS[spec["system"]]
    batches, _, _, _ = decode.load_inputs(spec["run"], spec["sentences"], 64)
    run = decode.transformerkit_decoder(spec["run"], "greedy", 64, cache, False, precision)
    run(batches[-1][1])  # warm-up: loads (or builds) the packages
    shares = spec["shares"]
    seconds, outputs = {str(s): [] for s in shares}, {}
    for round_index in range(spec["rounds"]):
        for share in shares if round_index % 2 == 0 else shares[::-1]:
            greedy.DROP_SHARE = share
            started = time.perf_counter()
            found = [ids for _, batch in batches for ids in run(batch)]
            seconds[str(share)].append(time.perf_counter() - started)
            outputs[share] = found
    same = all(outputs[s] == outputs[shares[0]] for s in shares)
    return {"system": spec["system"], "seconds": seconds, "same_outputs": same}


def table(results, shares):
    lines = ["| system | " + " | ".join(f"share {s}: s" for s in shares)
             + " | best share against 0 | same outputs |",
             "|---|" + "---:|" * len(shares) + "---:|---|"]
    for r in results:
        best = {s: min(r["seconds"][str(s)]) for s in shares}
        base = best.get(0.0)
        gain = (f"{base / min(best.values()):.3f}x" if base else "")
        lines.append(f"| {r['system']} | " + " | ".join(f"{best[s]:.3f}" for s in shares)
                     + f" | {gain} | {'yes' if r['same_outputs'] else 'NO'} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="run directory of a trained Multi30k de->en model")
    parser.add_argument("--systems", default="tk-compiled,tk-compiled-int8",
                        help="comma-separated, of " + ", ".join(SYSTEMS))
    parser.add_argument("--shares", default="0,0.125,0.25")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="drop_share")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.run is None:
        parser.error("the run directory (RUN) is required")
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; the systems are "
                     f"{', '.join(SYSTEMS)}")
    shares = [float(s) for s in args.shares.split(",")]
    results = []
    for system in systems:
        spec = dict(system=system, run=os.path.abspath(args.run), sentences=args.sentences,
                    rounds=args.rounds, threads=args.threads, shares=shares)
        out = common.run_worker(HERE, ["--worker", json.dumps(spec)],
                                {"KERAS_BACKEND": "torch", "OMP_NUM_THREADS": str(args.threads)})
        if "error" in out:
            raise SystemExit(f"{system} failed: {out['error']}")
        print(f"{system}: {out}", flush=True)
        results.append(out)
    payload = {"machine": dict(common.machine(), threads=args.threads), "shares": shares,
               "sentences": args.sentences, "rounds": args.rounds, "results": results}
    common.write_results(args.name, payload, table(results, shares))


if __name__ == "__main__":
    main()
