"""Multi30k de->en: train for a fixed wall-clock budget on this machine, then score test2016.

One invocation trains ``configs/multi30k_de_en.yaml`` with ``transformerkit train`` for
``--minutes`` (60 by default; the budget covers the training steps, the per-epoch
validation and checkpoints), then translates Multi30k test2016 with greedy search and beam
search and reports BLEU two ways:

* **sacrebleu** on detokenized text (the standard; its signature is recorded), with chrF;
* **tutorial BLEU**: lower-cased, split into word and punctuation tokens, as most Multi30k
  tutorials report it (the well-known 36.5 of the 3+3-layer, 256-wide Transformer trained
  on a GPU with greedy decoding is of this kind).

Also reported: seconds per training epoch, epochs and optimizer steps done in the budget.

    python bench/multi30k_bleu.py          # 60 minutes -> results/multi30k_bleu.FAMILY.*
    python bench/multi30k_bleu.py --minutes 10 --name multi30k_bleu_10m
    python bench/multi30k_bleu.py --updates 8250   # an update budget: load-insensitive
    python bench/multi30k_bleu.py --skip-train --run runs/bench-multi30k   # score only
    python bench/multi30k_bleu.py --skip-train --run RUN --alpha 1.4   # another length penalty
    python bench/multi30k_bleu.py --skip-train --run RUN --search no_repeat_ngram_size=4
    python bench/multi30k_bleu.py --average 5   # also the last 5 epoch checkpoints averaged
    python bench/multi30k_bleu.py --average 5 --set model.dropout=0.1 \
        --name multi30k_bleu_dropout_0_1       # one setting changed, its own result file

With ``--average N`` the run keeps its last N epoch checkpoints and averages them at the end
(``train.average_last``, the paper's section 6.1 recipe); both the final model and the
average are scored, in one table.
"""

import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE_BAR = 36.5  # tutorial BLEU of the best-known small Transformer on Multi30k de->en


def train(config, run_dir, minutes, overrides, updates=None):
    """Run ``transformerkit train`` for ``minutes``, or for ``updates`` optimizer updates
    with no time budget; return its wall-clock seconds."""
    budget = [f"train.time_budget={minutes}m"] if updates is None else \
        ["train.time_budget=null", f"train.max_steps={updates}"]
    return common.train_run(config, run_dir, [*budget, "train.epochs=1000", *overrides])


def read_history(run_dir):
    """Rows of the run's ``history.csv`` as dicts of floats."""
    from transformerkit.run_directory import RunDirectory

    with open(RunDirectory(run_dir).history, newline="") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)}
                for row in csv.DictReader(f)]


def val_loss_line(history):
    """Where the validation loss was lowest, against where the run ended (an over-fitting
    run's lowest is well before its end)."""
    losses = [(row["val_loss"], i + 1) for i, row in enumerate(history) if "val_loss" in row]
    if not losses:
        return ""
    low, epoch = min(losses)
    return (f"Validation loss: lowest {low:.3f} after epoch {epoch}, {losses[-1][0]:.3f} "
            f"after the last ({losses[-1][1]}). ")


def score(run_dir, beams, max_sentences=None, checkpoint="model", search=None):
    """Translate test2016 with each beam size (the run's own ``search:`` settings, with the
    options of ``search`` in their place, e.g. ``{"alpha": 1.4}``); return one result dict
    per beam size."""
    import transformerkit
    from transformerkit.data.corpora import load_multi30k
    from transformerkit.evaluation import corpus_scores

    run = transformerkit.load(run_dir, checkpoint=checkpoint)
    data = run.config.data
    sources, references = load_multi30k("test2016", data.source_lang, data.target_lang,
                                        data_dir=common.data_dir())
    sources, references = sources[:max_sentences], references[:max_sentences]
    results = []
    for beam in beams:
        start = time.perf_counter()
        options = run.search_options(None, dict(search or {}, beam_size=beam))
        hypotheses = run.translate(sources, options)
        seconds = time.perf_counter() - start
        scores = corpus_scores(hypotheses, references)
        results.append({"search": "greedy" if beam == 1 else f"beam {beam}", "beam_size": beam,
                        "alpha": options.alpha,
                        "no_repeat_ngram_size": options.no_repeat_ngram_size,
                        "weights": checkpoint,
                        "sentences": len(sources), "decode_seconds": round(seconds, 1),
                        "sacrebleu": scores["bleu"], "chrf": scores["chrf"],
                        "tutorial_bleu": common.tutorial_bleu(hypotheses, references),
                        "bleu_signature": scores["bleu_signature"],
                        "examples": [list(example) for example in zip(
                            sources[:3], hypotheses[:3], references[:3], strict=True)]})
        print({k: v for k, v in results[-1].items() if k != "examples"}, flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "multi30k_de_en.yaml"))
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--updates", type=int, default=None,
                        help="train for this many optimizer updates instead of --minutes "
                             "(the count --minutes gives on this machine when it is quiet: "
                             "the result no longer depends on what else runs)")
    parser.add_argument("--run", default=os.path.join(ROOT, "runs", "bench-multi30k"))
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--beams", default="1,4", help="comma-separated beam sizes (1 = greedy)")
    parser.add_argument("--skip-train", action="store_true", help="score an existing --run")
    parser.add_argument("--max-sentences", type=int, default=None)
    parser.add_argument("--alpha", type=float, default=None,
                        help="beam search's length penalty (default: the run's search.alpha; "
                             "to score a run trained before its config chose one)")
    parser.add_argument("--search", action="append", default=[], metavar="OPTION=VALUE",
                        help="another search option in place of the run's (repeat), e.g. "
                             "no_repeat_ngram_size=4")
    parser.add_argument("--name", default="multi30k_bleu", help="results/NAME.{json,md}")
    parser.add_argument("--average", type=int, default=None, metavar="N",
                        help="also average the last N epoch checkpoints and score the average")
    args = parser.parse_args()
    if args.average:
        args.set = [f"train.average_last={args.average}",
                    f"train.checkpoints_to_keep={args.average}", *args.set]

    minutes = f"{args.minutes:g}"
    train_seconds = None
    if not args.skip_train:
        train_seconds = train(args.config, args.run, minutes, args.set, args.updates)
    history = read_history(args.run)
    epoch_seconds = [row["epoch_seconds"] for row in history if "epoch_seconds" in row]
    beams = [int(b) for b in args.beams.split(",")]
    import yaml

    search = {key: yaml.safe_load(value) for key, value in
              (item.split("=", 1) for item in args.search)}
    if args.alpha is not None:
        search["alpha"] = args.alpha
    results = score(args.run, beams, args.max_sentences, search=search)
    if args.average:
        results += score(args.run, beams, args.max_sentences, checkpoint="averaged",
                         search=search)

    payload = {"machine": common.machine(), "config": os.path.relpath(args.config, ROOT),
               "overrides": args.set, "minutes": None if args.updates else args.minutes,
               "updates": args.updates,
               "train_wall_seconds": train_seconds and round(train_seconds, 1),
               "epochs_logged": len(history),
               "seconds_per_epoch": epoch_seconds,
               "final_val_loss": history[-1].get("val_loss") if history else None,
               "val_loss_by_epoch": [row.get("val_loss") for row in history],
               "results": results}
    from transformerkit.run_directory import RunDirectory

    metrics = RunDirectory(args.run).read_metrics()
    if payload["train_wall_seconds"] is None:  # --skip-train: the run's own record
        payload["train_seconds"] = metrics.get("train_seconds")
    stopped_by = metrics.get("stopped_by", "n/a")
    payload["stopped_by"] = stopped_by
    precision = (metrics.get("precision") or {}).get("used", "n/a")
    payload["precision"] = precision
    payload["optimizer_steps"] = metrics.get("steps")
    # the median: the last epoch is usually cut short by the budget
    median_epoch = f"{statistics.median(epoch_seconds):.0f} s" if epoch_seconds else "n/a"
    lines = ["| weights | search | test2016 sacrebleu BLEU | chrF | tutorial BLEU (lower-cased "
             "words) | decode time |",
             "|---|---|---:|---:|---:|---:|"]
    for r in results:
        weights = ("final model" if r["weights"] == "model"
                   else f"average of the last {args.average} epochs")
        search = r["search"] + (f", alpha {r['alpha']:g}" if r["beam_size"] > 1 else "") + (
            f", no repeated {r['no_repeat_ngram_size']}-grams"
            if r.get("no_repeat_ngram_size") else "")
        lines.append(f"| {weights} | {search} | {r['sacrebleu']:.1f} | {r['chrf']:.1f} | "
                     f"{r['tutorial_bleu']:.1f} | {r['decode_seconds']:.0f} s |")
    lines.append(
        f"\n{f'{args.updates} updates' if args.updates else f'{minutes} minutes'} of "
        f"training ({payload['config']}"
        f"{' ' + ' '.join(args.set) if args.set else ''}) on {common.machine()['cores']} CPU "
        f"cores in {precision}: {len(history)} epochs logged (stopped by: {stopped_by}), "
        f"{payload['optimizer_steps'] or 'n/a'} optimizer steps, {median_epoch} per "
        f"epoch (median; training + validation). {val_loss_line(history)}"
        f"Reference bar: {REFERENCE_BAR} tutorial BLEU (3+3 layers, 256 wide, greedy, GPU). "
        f"sacrebleu signature: {results[0]['bleu_signature']}.")
    common.write_results(args.name, payload, "\n".join(lines))


if __name__ == "__main__":
    main()
