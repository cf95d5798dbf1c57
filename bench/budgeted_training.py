"""Budgeted training: the Multi30k recipe with and without the cooldown, by budget and seed.

A time budget decides how many updates a run gets, and that number is what a slower CPU
changes: a 2-core Xeon without bfloat16 gets about 660 updates from ``make demo``'s 10
minutes, the AMX Xeon about 1,300 in float32. So a budget here is an update count
(``660``: ``train.max_steps``, no time budget: the same run on every CPU) or, to check the
budget's own estimate of its length, minutes (``2.5m``: ``train.time_budget``); each recipe
is a set of ``--set`` overrides of ``configs/multi30k_de_en.yaml``:

- ``schedule``: the paper's schedule cut off at the budget (``train.cooldown=0``), warmup
  400, ``lr_scale`` 0.5, dropout 0.1: the recipe before the cooldown;
- ``cooldown``: the same schedule cooled down to zero over the run's last fifth
  (``train.cooldown`` null: 0.2);
- ``cooldown-warmup200``: that, warming up over 200 updates instead of 400;
- ``cooldown-lr0.35``: that with ``lr_scale`` 0.35;
- ``recipe``: the config as it ships (the cooldown, warmup 200, ``lr_scale`` 0.35, dropout
  0.05);
- more with ``--recipe NAME=KEY=VALUE,KEY=VALUE``.

Every run trains in a process of its own (``transformerkit train``), then is scored on
Multi30k val (the run's own final evaluation, greedy) and test2016 (beam 4 with the paper's
alpha 0.6 whatever the run's ``search:`` says, so that every row compares training alone;
sacrebleu),
with the share of test2016 outputs that repeat a word 4-gram (the loops of an
under-trained model: "wearing a red vest is wearing a red vest").

    python bench/budgeted_training.py --budgets 660,1320 --seeds 0,1,2 \
        --recipes schedule,cooldown-lr0.35,recipe
    # -> bench/results/budgeted_training.FAMILY.{json,md}
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "multi30k_de_en.yaml")
# each pins what the shipped config may change, so that a name keeps meaning what it measured
RECIPES = {"schedule": ["train.cooldown=0", "train.warmup_steps=400", "train.lr_scale=0.5",
                        "model.dropout=0.1"],
           "cooldown": ["train.warmup_steps=400", "train.lr_scale=0.5", "model.dropout=0.1"],
           "cooldown-warmup200": ["train.warmup_steps=200", "train.lr_scale=0.5",
                                  "model.dropout=0.1"],
           "cooldown-lr0.35": ["train.warmup_steps=200", "train.lr_scale=0.35",
                               "model.dropout=0.1"],
           "recipe": []}


def repeats_a_phrase(text, n=4):
    """Whether ``text`` holds some word ``n``-gram twice."""
    words = text.lower().split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(grams) != len(set(grams))


def train(run_dir, budget, seed, overrides):
    """A run of ``budget`` updates (``660``: ``train.max_steps``) or minutes (``2.5m``:
    ``train.time_budget``)."""
    limit = ([f"train.time_budget={budget}", "train.max_steps=null"] if budget.endswith("m")
             else [f"train.max_steps={budget}", "train.time_budget=null"])
    return common.train_run(CONFIG, run_dir, [*limit, "train.epochs=1000",
                                              f"train.seed={seed}", "train.verbose=0",
                                              *overrides])


def score(run_dir):
    """The run's scores (kept in RUN/bench_scores.json: a rerun reads them)."""
    kept = os.path.join(run_dir, "bench_scores.json")
    if os.path.isfile(kept):
        with open(kept, encoding="utf-8") as f:
            return json.load(f)
    scores = _score(run_dir)
    with open(kept, "w", encoding="utf-8") as f:
        json.dump(scores, f)
    return scores


def _score(run_dir):
    import transformerkit
    from transformerkit.data.corpora import load_multi30k
    from transformerkit.evaluation import corpus_scores

    run = transformerkit.load(run_dir)
    data = run.config.data
    sources, references = load_multi30k("test2016", data.source_lang, data.target_lang,
                                        data_dir=common.data_dir())
    hypotheses = run.translate(sources, beam_size=4, alpha=0.6)
    scores = corpus_scores(hypotheses, references)
    with open(os.path.join(run_dir, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    return {"val_bleu": metrics["val_bleu"], "val_chrf": metrics["val_chrf"],
            "test2016_bleu": scores["bleu"], "test2016_chrf": scores["chrf"],
            "bleu_signature": scores["bleu_signature"],
            "repeated_phrase_share": round(sum(map(repeats_a_phrase, hypotheses))
                                           / len(hypotheses), 4),
            "steps": metrics["steps"], "precision": metrics["precision"]["used"],
            "final_learning_rate": metrics.get("final_learning_rate"),
            "examples": hypotheses[:3]}


def table(results, recipes):
    lines = ["| budget | recipe | seeds | val BLEU (mean, each) | val chrF | test2016 BLEU, "
             "beam 4 (mean, each) | test2016 chrF | outputs repeating a 4-gram |",
             "|---:|---|---:|---|---:|---|---:|---:|"]
    for budget in dict.fromkeys(r["budget"] for r in results):
        for recipe in recipes:
            runs = [r for r in results if r["budget"] == budget and r["recipe"] == recipe]
            if not runs:
                continue

            def mean(key, runs=runs):
                return statistics.mean(r[key] for r in runs)

            each = ", ".join(f"{r['val_bleu']:.1f}" for r in runs)
            each_test = ", ".join(f"{r['test2016_bleu']:.1f}" for r in runs)
            steps = ", ".join(str(r["steps"]) for r in runs)
            label = budget if budget.endswith("m") else f"{budget} updates"
            if budget.endswith("m"):
                label += f" ({steps} updates)"
            lines.append(f"| {label} | {recipe} | {len(runs)} | {mean('val_bleu'):.2f} "
                         f"({each}) | {mean('val_chrf'):.1f} | {mean('test2016_bleu'):.2f} "
                         f"({each_test}) | {mean('test2016_chrf'):.1f} | "
                         f"{100 * mean('repeated_phrase_share'):.1f}% |")
    return "\n".join(lines)


def paired(results, recipe="recipe", baseline="schedule"):
    """The table of ``recipe`` minus ``baseline`` seed by seed (the same seed: the same
    initial weights and batch order), per budget where both have runs of the same seeds:
    the mean difference, each seed's, and on how many seeds ``recipe`` scored higher. A
    lead on every seed says more than overlapping ranges of scores, whose spread between
    seeds is mostly what both recipes share."""
    lines = [f"| budget | seeds | val BLEU, {recipe} - {baseline} (mean, each) | higher on "
             f"| test2016 BLEU, {recipe} - {baseline} (mean, each) | higher on |",
             "|---:|---:|---|---:|---|---:|"]
    for budget in dict.fromkeys(r["budget"] for r in results):
        runs = {(r["recipe"], r["seed"]): r for r in results if r["budget"] == budget}
        seeds = sorted(seed for name, seed in runs if name == recipe
                       and (baseline, seed) in runs)
        if not seeds:
            continue
        cells = []
        for key in ("val_bleu", "test2016_bleu"):
            gaps = [runs[recipe, seed][key] - runs[baseline, seed][key] for seed in seeds]
            each = ", ".join(f"{gap:+.1f}" for gap in gaps)
            cells.append(f"{statistics.mean(gaps):+.2f} ({each}) | "
                         f"{sum(gap > 0 for gap in gaps)} of {len(gaps)}")
        label = budget if budget.endswith("m") else f"{budget} updates"
        lines.append(f"| {label} | {len(seeds)} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="660",
                        help="budgets, comma-separated: updates (660) or minutes (2.5m)")
    parser.add_argument("--seeds", default="0", help="seeds, comma-separated")
    parser.add_argument("--recipe", action="append", default=[], metavar="NAME=KEY=VALUE,...",
                        help="another recipe: its overrides")
    parser.add_argument("--recipes", default=None,
                        help="which recipes to run, comma-separated (default: all)")
    parser.add_argument("--work", default="/tmp/budgeted_training",
                        help="folder of the runs (kept: a rerun scores a finished run again)")
    parser.add_argument("--name", default="budgeted_training")
    parser.add_argument("--finished-only", action="store_true",
                        help="table the runs already in --work, train none (a budget, seed "
                             "and recipe without a finished run is left out)")
    parser.add_argument("--keep-results", action="store_true",
                        help="keep the results already in results/NAME.FAMILY.json (this "
                             "CPU family's) that this run does not measure again")
    args = parser.parse_args()
    recipes = dict(RECIPES)
    for spec in args.recipe:
        name, _, overrides = spec.partition("=")
        recipes[name] = [o for o in overrides.split(",") if o]
    chosen = args.recipes.split(",") if args.recipes else list(recipes)
    results = []
    for budget in args.budgets.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            for recipe in chosen:  # recipes alternate within a seed: the machine drifts
                run_dir = os.path.join(args.work, f"{recipe}-{budget}-s{seed}")
                seconds = None
                if not os.path.isfile(os.path.join(run_dir, "metrics.json")):
                    if args.finished_only:
                        continue
                    seconds = round(train(run_dir, budget, seed, recipes[recipe]), 1)
                result = dict(budget=budget, recipe=recipe, seed=seed,
                              overrides=recipes[recipe], wall_seconds=seconds,
                              **score(run_dir))
                print({k: v for k, v in result.items() if k != "examples"}, flush=True)
                results.append(result)
    machine = common.machine()
    used = {name: recipes[name] for name in chosen}
    commands, note = [machine["command"]], None
    if args.keep_results:
        results, used, commands = kept_results(args.name, machine, results, used)
        note = earlier_note(args.name, machine)
    payload = {"machine": machine, "config": os.path.relpath(CONFIG, ROOT), "recipes": used,
               "results": results, "commands": commands, "note": note}
    common.write_results(args.name, payload, report(payload))


def report(payload):
    """The table of ``payload``'s results, and its note (what the recipes' names stood for
    when the runs were made) where it has one."""
    text = table(payload["results"], list(payload["recipes"]))
    gaps = paired(payload["results"])
    if gaps:
        text += ("\n\nThe recipe against the recipe before it (`schedule`), seed by seed:\n\n"
                 + gaps)
    return text + (f"\n\n{payload['note']}" if payload.get("note") else "")


def earlier_note(name, machine):
    path = common.result_stem(name, machine) + ".json"
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("note")


def kept_results(name, machine, results, recipes):
    """``results`` after the earlier results of ``results/NAME.FAMILY.json`` that they do not
    measure again (same budget, recipe and seed); the earlier file must come from the same
    CPU model and flags. Returns (results, recipes, commands)."""
    path = common.result_stem(name, machine) + ".json"
    if not os.path.isfile(path):
        return results, recipes, [machine["command"]]
    with open(path, encoding="utf-8") as f:
        earlier = json.load(f)
    where = ("cpu", "cpu_flags", "cores")
    if any(earlier["machine"].get(k) != machine.get(k) for k in where):
        raise SystemExit(f"--keep-results: {path} was measured on "
                         f"{earlier['machine'].get('cpu')} {earlier['machine'].get('cpu_flags')}"
                         f", not this CPU: give another --name")
    fresh = {(r["budget"], r["recipe"], r["seed"]) for r in results}
    kept = [r for r in earlier["results"] if (r["budget"], r["recipe"], r["seed"]) not in fresh]
    merged = {**earlier.get("recipes", {}), **recipes}
    commands = [*earlier.get("commands", [earlier["machine"].get("command")]),
                machine["command"]]
    return kept + results, merged, commands


if __name__ == "__main__":
    main()
