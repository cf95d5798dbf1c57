"""Repeated-phrase loops of trained Multi30k runs, and what ``no_repeat_ngram_size`` does.

A model trained for a few hundred updates sometimes loops: "a man wearing a red vest is
wearing a red vest, and a red vest is sitting in a red vest ...". The search option
``no_repeat_ngram_size`` n (fairseq's ``--no-repeat-ngram-size``, ``transformers``' and
CTranslate2's) bans every token that would give an output a token n-gram twice. This scores
each trained run given by ``--run`` (any budget, any seed) at each ``--sizes`` value (0 =
off), greedy and beam 4 (GNMT ``--alpha``), on Multi30k val (where a recipe's setting is
chosen) and test2016 (reported, never used to choose): sacreBLEU, chrF and the share of
outputs that repeat a word 4-gram (the loops; a real sentence rarely does). Runs are
labelled by their updates and seed; per update count the table also gives the mean over
seeds.

    python bench/repeated_ngrams.py --run RUN_A --run RUN_B --sizes 0,3,4 --alpha 1.4
    # -> bench/results/repeated_ngrams.FAMILY.{json,md}
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "torch")
import common  # noqa: E402
from budgeted_training import repeats_a_phrase  # noqa: E402 (a word 4-gram twice)

SETS = ("val", "test2016")
SEARCHES = ("greedy", "beam4")


def score_run(run_dir, sizes, alpha):
    """One result dict per (set, search, size) of ``run_dir``'s translations."""
    import transformerkit
    from transformerkit.data.corpora import load_multi30k
    from transformerkit.evaluation import corpus_scores

    run = transformerkit.load(run_dir)
    with open(os.path.join(run_dir, "metrics.json"), encoding="utf-8") as f:
        updates = json.load(f)["steps"]
    data = run.config.data
    results = []
    for name in SETS:
        sources, references = load_multi30k(name, data.source_lang, data.target_lang,
                                            data_dir=common.data_dir())
        for search in SEARCHES:
            beam = dict(beam_size=1) if search == "greedy" else dict(beam_size=4, alpha=alpha,
                                                                       penalty="gnmt")
            for size in sizes:
                hypotheses = run.translate(sources, no_repeat_ngram_size=size, **beam)
                scores = corpus_scores(hypotheses, references)
                loops = [i for i, h in enumerate(hypotheses) if repeats_a_phrase(h)]
                results.append(dict(
                    run=run_dir, updates=updates, seed=run.config.train.seed, set=name,
                    search=search, size=size, bleu=round(scores["bleu"], 2),
                    chrf=round(scores["chrf"], 2),
                    repeated_phrase_share=round(len(loops) / len(hypotheses), 4),
                    # the demo's samples.txt shows the first five val sentences
                    loops_in_first_five=sum(i < 5 for i in loops),
                    bleu_signature=scores["bleu_signature"]))
                print({k: v for k, v in results[-1].items() if k != "bleu_signature"},
                      flush=True)
    return results


def table(results, sizes):
    head = " | ".join(f"n={s}" if s else "off" for s in sizes)
    lines = [f"| updates | seed | set | search | {head} |",
             "|---:|---|---|---|" + "---:|" * len(sizes)]
    by = {(r["run"], r["set"], r["search"], r["size"]): r for r in results}
    runs = sorted(dict.fromkeys((r["updates"], r["seed"], r["run"]) for r in results))
    groups = {}

    def cell(bleu, share):
        return f"{bleu:.2f} ({100 * share:.1f}%)"

    for updates, seed, run in runs:
        groups.setdefault(updates, []).append(run)
        for name in SETS:
            for search in SEARCHES:
                row = [by[(run, name, search, s)] for s in sizes]
                cells = " | ".join(cell(r["bleu"], r["repeated_phrase_share"]) for r in row)
                lines.append(f"| {updates} | {seed} | {name} | {search} | {cells} |")
    for updates, members in groups.items():
        if len(members) < 2:
            continue
        for name in SETS:
            for search in SEARCHES:
                cells = " | ".join(
                    "**" + cell(statistics.mean(by[(m, name, search, s)]["bleu"]
                                                for m in members),
                                statistics.mean(by[(m, name, search, s)]
                                                ["repeated_phrase_share"]
                                                for m in members)) + "**"
                    for s in sizes)
                lines.append(f"| {updates} | mean of {len(members)} | {name} | {search} | "
                             f"{cells} |")
    lines += ["", "Each cell: sacreBLEU (share of outputs repeating a word 4-gram) with "
              "`no_repeat_ngram_size` n (token n-grams of the run's BPE; off = 0). beam4: "
              f"GNMT alpha {results[0].get('alpha', '')}. val chooses; test2016 is shown, not "
              f"used to choose. sacreBLEU signature: {results[0]['bleu_signature']}."]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="a trained run (repeat)")
    parser.add_argument("--sizes", default="0,3,4")
    parser.add_argument("--alpha", type=float, default=1.4,
                        help="beam 4's GNMT length penalty (the Multi30k recipe's)")
    parser.add_argument("--name", default="repeated_ngrams")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    sizes = [int(s) for s in args.sizes.split(",")]
    results = [dict(r, alpha=args.alpha) for run_dir in args.run
               for r in score_run(run_dir, sizes, args.alpha)]
    payload = dict(machine=common.machine(), sizes=sizes, alpha=args.alpha, results=results)
    common.write_results(args.name, payload, table(results, sizes))


if __name__ == "__main__":
    main()
