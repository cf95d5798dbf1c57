"""Training precision and quality: Multi30k de->en in float32 and in bfloat16, same recipe.

Two experiments on ``configs/multi30k_de_en.yaml`` (``transformerkit train`` in a process of
its own per run, then test2016 translated with greedy search and beam 4):

* **fixed steps**: every precision trains exactly ``--steps`` optimizer steps
  (``train.max_steps``) from each seed of ``--seeds``. Reported: the validation loss after
  each epoch (the curves), the final validation loss and test2016 sacreBLEU. The
  difference between the precisions is set against the spread between seeds of one
  precision (the noise that any change of seed brings).
* **fixed time** (``--minutes``, 0 to skip): the README's demo, a wall-clock budget per
  precision (seed 0), run one after the other on the otherwise idle machine: how many steps
  each precision does in the budget and the BLEU it reaches.

``train.precision`` is set explicitly (``float32`` / ``mixed_bfloat16``), and each run's
``metrics.json`` says which precision ran and why; bfloat16 pays only where the CPU has
bfloat16 units (AVX512-BF16 or AMX-BF16), which the machine line names.

    python bench/precision_quality.py --steps 750 --seeds 0,1 --minutes 10
    python bench/precision_quality.py --skip-train      # score the runs again

-> ``bench/results/precision_quality.FAMILY.{json,md}``.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import multi30k_bleu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_BUDGET_MINUTES = 24 * 60  # fixed-step runs: the step count stops them, not the clock


def run_one(args, run_dir, minutes, overrides):
    """Train (unless ``--skip-train``) and score one run; return its row."""
    from transformerkit.run_directory import RunDirectory

    wall = None
    if not args.skip_train:
        wall = round(multi30k_bleu.train(args.config, run_dir, minutes, overrides), 1)
    history = multi30k_bleu.read_history(run_dir)
    metrics = RunDirectory(run_dir).read_metrics()
    scores = multi30k_bleu.score(run_dir, [int(b) for b in args.beams.split(",")])
    return {"run": os.path.relpath(run_dir, ROOT), "overrides": overrides,
            "train_wall_seconds": wall, "train_seconds": metrics.get("train_seconds"),
            "steps": metrics.get("steps"), "stopped_by": metrics.get("stopped_by"),
            "precision": metrics.get("precision"),
            "val_loss_curve": [round(row["val_loss"], 4) for row in history if "val_loss" in row],
            "final_val_loss": round(history[-1]["val_loss"], 4) if history else None,
            "bleu": {r["search"]: r["sacrebleu"] for r in scores},
            "chrf": {r["search"]: r["chrf"] for r in scores}}


def spread(values):
    """max - min of a list (0 for one value)."""
    return max(values) - min(values) if values else float("nan")


def summarize(fixed, precisions, searches):
    """Per precision: the mean over seeds and the seed spread of val loss and each BLEU."""
    out = {}
    for precision in precisions:
        rows = [r for r in fixed if r["precision_requested"] == precision]
        entry = {"seeds": len(rows)}
        for key, values in [("final_val_loss", [r["final_val_loss"] for r in rows]),
                            *[(f"bleu {s}", [r["bleu"][s] for r in rows]) for s in searches]]:
            entry[key] = {"mean": round(statistics.mean(values), 4),
                          "seed_spread": round(spread(values), 4)}
        out[precision] = entry
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "multi30k_de_en.yaml"))
    parser.add_argument("--precisions", default="float32,mixed_bfloat16")
    parser.add_argument("--steps", type=int, default=750, help="fixed-step runs: optimizer steps")
    parser.add_argument("--seeds", default="0,1", help="fixed-step runs: comma-separated seeds")
    parser.add_argument("--minutes", type=float, default=10,
                        help="fixed-time runs: the budget per precision (0: none)")
    parser.add_argument("--beams", default="1,4", help="comma-separated beam sizes (1 = greedy)")
    parser.add_argument("--runs", default=os.path.join(ROOT, "runs", "bench-precision"),
                        help="folder for the run directories")
    parser.add_argument("--skip-train", action="store_true", help="score existing runs only")
    parser.add_argument("--name", default="precision_quality", help="results/NAME.{json,md}")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else []
    searches = ["greedy" if b == "1" else f"beam {b}" for b in args.beams.split(",")]

    fixed = []
    for i, seed in enumerate(seeds):
        # alternate the order, so no precision always runs first on a drifting machine
        for precision in (precisions if i % 2 == 0 else precisions[::-1]):
            run_dir = os.path.join(args.runs, f"steps{args.steps}-{precision}-seed{seed}")
            overrides = [f"train.precision={precision}", f"train.seed={seed}",
                         f"train.max_steps={args.steps}"]
            row = run_one(args, run_dir, NO_BUDGET_MINUTES, overrides)
            fixed.append({"precision_requested": precision, "seed": seed, **row})
            print(fixed[-1], flush=True)
    timed = []
    if args.minutes:
        for precision in precisions:
            run_dir = os.path.join(args.runs, f"minutes{args.minutes:g}-{precision}")
            row = run_one(args, run_dir, f"{args.minutes:g}", [f"train.precision={precision}"])
            timed.append({"precision_requested": precision, **row})
            print(timed[-1], flush=True)

    summary = summarize(fixed, precisions, searches) if fixed else {}
    payload = {"machine": common.machine(), "config": os.path.relpath(args.config, ROOT),
               "steps": args.steps, "seeds": seeds, "minutes": args.minutes,
               "fixed_steps": fixed, "fixed_steps_summary": summary, "fixed_time": timed}
    common.write_results(args.name, payload, report(args, fixed, summary, timed, searches))


def report(args, fixed, summary, timed, searches):
    lines = []
    if fixed:
        lines += [f"**Fixed steps** ({args.steps} optimizer steps; validation loss after each "
                  "epoch, test2016 sacreBLEU):", "",
                  "| precision | seed | steps | validation loss by epoch | final val loss | "
                  + " | ".join(f"BLEU {s}" for s in searches) + " | train s |",
                  "|---|---:|---:|---|---:|" + "---:|" * len(searches) + "---:|"]
        for r in fixed:
            lines.append(f"| {r['precision_requested']} | {r['seed']} | {r['steps']} | "
                         f"{', '.join(f'{v:.3f}' for v in r['val_loss_curve'])} | "
                         f"{r['final_val_loss']:.4f} | "
                         + " | ".join(f"{r['bleu'][s]:.1f}" for s in searches)
                         + f" | {r['train_seconds']:.0f} |")
        lines += ["", "| precision | seeds | final val loss (mean, seed spread) | "
                  + " | ".join(f"BLEU {s} (mean, seed spread)" for s in searches) + " |",
                  "|---|---:|---:|" + "---:|" * len(searches)]
        for precision, entry in summary.items():
            cells = [f"{entry[k]['mean']:.4f} ± {entry[k]['seed_spread'] / 2:.4f}"
                     if k == "final_val_loss" else
                     f"{entry[k]['mean']:.2f} ± {entry[k]['seed_spread'] / 2:.2f}"
                     for k in ["final_val_loss", *[f"bleu {s}" for s in searches]]]
            lines.append(f"| {precision} | {entry['seeds']} | " + " | ".join(cells) + " |")
        lines.append("\n± is half the spread (max - min) between seeds.")
    if timed:
        first = timed[0]["steps"] or 1
        lines += ["", f"**Fixed time** ({args.minutes:g} minutes of training, seed 0, one "
                  "precision after the other):", "",
                  "| precision | steps | steps vs first | epochs logged | final val loss | "
                  + " | ".join(f"BLEU {s}" for s in searches) + " |",
                  "|---|---:|---:|---:|---:|" + "---:|" * len(searches)]
        for r in timed:
            lines.append(f"| {r['precision_requested']} | {r['steps']} | "
                         f"{r['steps'] / first:.2f}x | {len(r['val_loss_curve'])} | "
                         f"{r['final_val_loss']:.4f} | "
                         + " | ".join(f"{r['bleu'][s]:.1f}" for s in searches) + " |")
    resolved = {r["precision_requested"]: r["precision"] for r in fixed + timed}
    lines.append(f"\n`metrics.json` precision of each run: {resolved}. sacreBLEU on detokenized "
                 "text (13a); test2016, 1,000 sentences.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
