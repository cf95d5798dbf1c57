"""The beam's length penalty on trained Multi30k runs: BLEU by GNMT alpha, chosen on val.

Beam search ranks a finished hypothesis by ``log P / lp(n)`` with the GNMT penalty
``lp(n) = ((5 + n) / 6) ** alpha`` (Wu et al. 2016, eq. 14; the Transformer paper searched
with alpha 0.6). A larger alpha favours longer outputs. This scores each trained run given
by ``--run`` (any budget, any seed) with beam 4 at every ``--alphas`` value, on Multi30k val
(where a recipe's alpha is chosen) and test2016 (reported beside it, never used to choose):
sacreBLEU, chrF and the length ratio (hypothesis / reference words, the brevity penalty's
input). A run is labelled by its updates and seed (its ``metrics.json`` and config); the
table gives each run and, per update count, the mean over seeds.

    python bench/length_penalty.py --run RUN_A --run RUN_B --alphas 0.6,1.0,1.4,1.8
    # -> bench/results/length_penalty.FAMILY.{json,md}
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "torch")
import common  # noqa: E402

SETS = ("val", "test2016")


def label(run_dir, run):
    """``(updates, seed)`` of a run."""
    with open(os.path.join(run_dir, "metrics.json"), encoding="utf-8") as f:
        steps = json.load(f)["steps"]
    return steps, run.config.train.seed


def score_run(run_dir, alphas):
    """One result dict per (set, alpha) of beam-4 translations of ``run_dir``."""
    import transformerkit
    from transformerkit.data.corpora import load_multi30k
    from transformerkit.evaluation import corpus_scores

    run = transformerkit.load(run_dir)
    updates, seed = label(run_dir, run)
    data = run.config.data
    results = []
    for name in SETS:
        sources, references = load_multi30k(name, data.source_lang, data.target_lang,
                                            data_dir=common.data_dir())
        for alpha in alphas:
            hypotheses = run.translate(sources, beam_size=4, alpha=alpha, penalty="gnmt")
            scores = corpus_scores(hypotheses, references)
            words = sum(len(h.split()) for h in hypotheses)
            results.append(dict(run=run_dir, updates=updates, seed=seed, set=name,
                                alpha=alpha, bleu=round(scores["bleu"], 2),
                                chrf=round(scores["chrf"], 2),
                                length_ratio=round(words / sum(len(r.split())
                                                               for r in references), 4),
                                bleu_signature=scores["bleu_signature"]))
            print({k: v for k, v in results[-1].items() if k != "bleu_signature"}, flush=True)
    return results


def table(results, alphas):
    head = " | ".join(f"alpha {a:g}" for a in alphas)
    lines = [f"| updates | seed | set | {head} | best alpha |",
             "|---:|---|---|" + "---:|" * len(alphas) + "---:|"]
    by = {(r["run"], r["set"], r["alpha"]): r for r in results}
    runs = sorted(dict.fromkeys((r["updates"], r["seed"], r["run"]) for r in results))
    groups = {}
    for updates, seed, run in runs:
        groups.setdefault(updates, []).append(run)
        for name in SETS:
            row = [by[(run, name, a)] for a in alphas]
            best = max(row, key=lambda r: r["bleu"])["alpha"]
            cells = " | ".join(f"{r['bleu']:.2f} ({r['length_ratio']:.3f})" for r in row)
            lines.append(f"| {updates} | {seed} | {name} | {cells} | {best:g} |")
    for updates, members in groups.items():
        if len(members) < 2:
            continue
        for name in SETS:
            means = [statistics.mean(by[(m, name, a)]["bleu"] for m in members) for a in alphas]
            best = alphas[max(range(len(alphas)), key=means.__getitem__)]
            cells = " | ".join(f"**{m:.2f}**" for m in means)
            lines.append(f"| {updates} | mean of {len(members)} | {name} | {cells} | "
                         f"{best:g} |")
    lines += ["", "Beam 4, GNMT length penalty; each cell: sacreBLEU (length ratio, hypothesis "
              "/ reference words). val chooses; test2016 is shown, not used to choose. "
              f"sacreBLEU signature: {results[0]['bleu_signature']}."]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="a trained run (repeat)")
    parser.add_argument("--alphas", default="0.6,1.0,1.4,1.8")
    parser.add_argument("--name", default="length_penalty")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    alphas = [float(a) for a in args.alphas.split(",")]
    results = [r for run_dir in args.run for r in score_run(run_dir, alphas)]
    payload = dict(machine=common.machine(), alphas=alphas, beam_size=4, penalty="gnmt",
                   results=results)
    common.write_results(args.name, payload, table(results, alphas))


if __name__ == "__main__":
    main()
