"""Budgeted training of the Shakespeare GPTs: nanoGPT's cosine cut off by a time budget,
against the same cosine cooled down to zero at the budget's end.

``configs/shakespeare_gpt.yaml`` (and ``shakespeare_gpt_bpe.yaml``) train nanoGPT's CPU
recipe: AdamW, warmup 100, a cosine decay to 1e-4 over 2,000 updates, under a 10-minute
time budget. Where the CPU finishes the 2,000 updates in time the cosine runs out as
planned; on a CPU slow enough for the budget to end the run first, the cosine stops where
it stands, at a high rate. A budget here is a time budget short enough to end the run
early on this CPU (``20s``: the CPU on which the 10 minutes end at the same update), each
recipe a set of ``--set`` overrides of the config:

- ``cut``: the config as it ships (``train.cooldown`` null: off for ``adamw_cosine``);
- ``cooldown``: the cosine, cooled down to zero over the run's last fifth, its end
  estimated from the measured update rate (``train.cooldown=0.2``, what the Multi30k
  recipe does);
- ``fitted``: a reference, not a budget: the cosine planned over the same number of
  updates as the seed's ``cut`` run (``train.max_steps``), as if the run had known its
  length (only where the budget ended the ``cut`` run);
- more with ``--recipe NAME=KEY=VALUE,KEY=VALUE``.

Every run trains in a process of its own (``transformerkit train``); its score is the
validation loss of its final evaluation (``metrics.json``: the config's 20 validation
batches, the same ones for every run of a config), with the update count and the rate the
run ended on. Seeds pair the recipes (the same initial weights and batches).

    python bench/budgeted_gpt.py --budgets 20s,40s --seeds 0,1,2
    # -> bench/results/budgeted_gpt.FAMILY.{json,md}
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "shakespeare_gpt.yaml")
RECIPES = {"cut": ["train.cooldown=0"], "cooldown": ["train.cooldown=0.2"], "fitted": []}


def overrides(budget, seed, recipe, recipes, steps_of_cut=None):
    """The ``--set`` overrides of a run: a time budget (``fitted``: the ``cut`` run's update
    count instead), the seed, quiet output, then the recipe's own."""
    if recipe == "fitted":
        if not steps_of_cut:
            raise SystemExit("recipe fitted needs the same seed's cut run first")
        limit = [f"train.max_steps={steps_of_cut}", "train.time_budget=null"]
    else:
        limit = [f"train.time_budget={budget}"]
    return [*limit, f"train.seed={seed}", "train.verbose=0", "train.samples=0",
            *recipes[recipe]]


def score(run_dir):
    """What the run's ``metrics.json`` says of its end."""
    with open(os.path.join(run_dir, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    return {"val_loss": metrics["val_loss"], "steps": metrics["steps"],
            "stopped_by": metrics["stopped_by"],
            "final_learning_rate": metrics.get("final_learning_rate"),
            "train_seconds": metrics.get("train_seconds")}


def table(results, recipes):
    lines = ["| budget | recipe | seeds | updates (each) | final rate (mean) | val loss (mean, "
             "each) | against cut, seed by seed (mean, each) |",
             "|---|---|---:|---|---:|---|---|"]
    for budget in dict.fromkeys(r["budget"] for r in results):
        at = {(r["recipe"], r["seed"]): r for r in results if r["budget"] == budget}
        for recipe in recipes:
            runs = [r for r in results if r["budget"] == budget and r["recipe"] == recipe]
            if not runs:
                continue
            gaps = [r["val_loss"] - at["cut", r["seed"]]["val_loss"] for r in runs
                    if recipe != "cut" and ("cut", r["seed"]) in at]
            against = (f"{statistics.mean(gaps):+.3f} ("
                       + ", ".join(f"{g:+.3f}" for g in gaps) + ")") if gaps else ""
            lines.append(
                f"| {budget} | {recipe} | {len(runs)} | "
                f"{', '.join(str(r['steps']) for r in runs)} | "
                f"{statistics.mean(r['final_learning_rate'] or 0.0 for r in runs):.2e} | "
                f"{statistics.mean(r['val_loss'] for r in runs):.4f} ("
                + ", ".join(f"{r['val_loss']:.4f}" for r in runs) + f") | {against} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--budgets", default="20s",
                        help="time budgets, comma-separated (20s, 1.5m)")
    parser.add_argument("--seeds", default="0", help="seeds, comma-separated")
    parser.add_argument("--recipe", action="append", default=[], metavar="NAME=KEY=VALUE,...",
                        help="another recipe: its overrides")
    parser.add_argument("--recipes", default="cut,cooldown,fitted",
                        help="which recipes to run, comma-separated (cut before fitted)")
    parser.add_argument("--work", default="/tmp/budgeted_gpt",
                        help="folder of the runs (kept: a rerun scores a finished run again)")
    parser.add_argument("--name", default="budgeted_gpt")
    args = parser.parse_args()
    recipes = dict(RECIPES)
    for spec in args.recipe:
        name, _, sets = spec.partition("=")
        recipes[name] = [o for o in sets.split(",") if o]
    chosen = args.recipes.split(",")
    config_name = os.path.splitext(os.path.basename(args.config))[0]
    results = []
    for budget in args.budgets.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            steps_of_cut = None
            for recipe in chosen:  # recipes alternate within a seed: the machine drifts
                if recipe == "fitted" and not steps_of_cut:
                    continue  # the budget did not end the cut run: fitted would be that run
                run_dir = os.path.join(args.work, f"{config_name}-{recipe}-{budget}-s{seed}")
                if not os.path.isfile(os.path.join(run_dir, "metrics.json")):
                    common.train_run(args.config, run_dir,
                                     overrides(budget, seed, recipe, recipes, steps_of_cut))
                result = dict(budget=budget, recipe=recipe, seed=seed, **score(run_dir))
                if recipe == "cut" and result["stopped_by"] == "time_budget":
                    steps_of_cut = result["steps"]
                print(result, flush=True)
                results.append(result)
    machine = common.machine()
    payload = {"machine": machine, "config": os.path.relpath(args.config, ROOT),
               "recipes": {name: recipes[name] for name in chosen}, "results": results}
    common.write_results(args.name, payload, table(results, chosen))


if __name__ == "__main__":
    main()
