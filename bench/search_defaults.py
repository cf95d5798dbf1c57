"""Search defaults on Multi30k val: beam stopping rule and output-length cap, by BLEU and speed.

On a trained de->en run (default ``/work/runs/m30k``) and the 1014 val sentences, in
batches of 64 sorted by length, this measures, interleaved (round after round, every
configuration once per round; the best round counts for speed):

* **grid**: greedy and beam 4 (alpha 0.6), beam with the ``exact`` and ``early`` stopping
  rules, each with several length caps ``max_len_a * source_tokens + max_len_b`` (and none):
  sacreBLEU, chrF, sentences/s, how many outputs end at their cap without an end token;
* **live rows**: stop-at-EOS speed of the eager PyTorch loop before and after finished
  sentences leave the batch, the previous code loaded from ``git show REV:...`` into this
  process beside the current one, on the same batches, outputs checked token for token;
* **forced length**: the same A/B with 32 tokens forced (``min_new_tokens = max_new_tokens
  = 32``), where nothing finishes early, to show it does not get slower.

    python bench/search_defaults.py       # -> results/search_defaults.FAMILY.{json,md}
    python bench/search_defaults.py --rounds 1 --sentences 256   # quick look
"""

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "torch")
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECODING_FILES = ("__init__.py", "beam.py", "common.py", "compiled.py", "greedy.py",
                  "sampling.py", "scoring.py", "steps.py", "translate.py")
CAPS = [None, (1.0, 5), (1.2, 10), (1.5, 10)]


def load_previous_decoding(rev):
    """The ``transformerkit.decoding`` package at git revision ``rev``, imported under the
    name ``previous_decoding`` (its own internal imports renamed to it)."""
    folder = tempfile.mkdtemp(prefix="previous_decoding_")
    package = os.path.join(folder, "previous_decoding")
    os.makedirs(package)
    for name in DECODING_FILES:
        text = subprocess.run(["git", "show", f"{rev}:src/transformerkit/decoding/{name}"],
                              cwd=ROOT, check=True, capture_output=True, text=True).stdout
        with open(os.path.join(package, name), "w") as f:
            f.write(text.replace("transformerkit.decoding", "previous_decoding"))
    sys.path.insert(0, folder)
    return importlib.import_module("previous_decoding")


def batches_of(run, sources, batch_size):
    """Source id batches ``(rows, len)`` sorted by length, as ``translate_batches`` makes."""
    import numpy as np

    from transformerkit.data.pipeline import pad_batch
    from transformerkit.decoding.translate import encode_sources

    encoded = encode_sources(sources, run.source_tokenizer, run.model.max_length)
    order = np.argsort([len(e) for e in encoded], kind="stable")
    return [(order[i:i + batch_size], pad_batch([encoded[j] for j in order[i:i + batch_size]]))
            for i in range(0, len(order), batch_size)]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def grid_configs():
    """Greedy and early-stopping beam with every cap; exact beam without a cap and with one
    (the two rules differ little in BLEU, so the caps are compared on one of them)."""
    configs = [("greedy", None, cap) for cap in CAPS]
    configs += [("beam4", "exact", cap) for cap in CAPS[:1] + CAPS[2:3]]
    configs += [("beam4", "early", cap) for cap in CAPS]
    return configs


def decode_grid(run, batches, search, stopping, cap):
    """Translations (in val order) of one grid configuration through the current code."""
    from transformerkit.decoding import beam_translate, greedy_translate

    a, b = cap if cap else (None, None)
    tgt = run.target_tokenizer
    out = {}
    for order, ids in batches:
        if search == "greedy":
            found = greedy_translate(run.model, ids, max_len_a=a, max_len_b=b)
        else:
            found = [h[0].ids for h in beam_translate(run.model, ids, beam_size=4, alpha=0.6,
                                                      stopping=stopping, max_len_a=a,
                                                      max_len_b=b)]
        for i, o in zip(order, found, strict=True):
            out[int(i)] = o
    return [out[i] for i in range(len(out))], [tgt.decode(out[i]) for i in range(len(out))]


def at_cap(batches, outputs, cap, limit):
    """How many outputs have exactly their cap's length (stopped by it, no end token)."""
    import numpy as np

    from transformerkit.decoding.common import length_caps

    count = 0
    for order, ids in batches:
        a, b = cap if cap else (None, None)
        caps = length_caps(ids, limit, a, b)
        count += sum(len(outputs[int(i)]) >= c for i, c in zip(order, caps, strict=True))
    return int(count) if not isinstance(count, np.integer) else int(count)


def ab_decoders(run, previous, forced):
    """``{(search, code): fn(ids) -> ids lists}`` for the live-rows A/B."""
    import transformerkit.decoding as current

    extra = dict(max_new_tokens=32, min_new_tokens=32) if forced else {}
    extra.update(max_len_a=None, max_len_b=None)  # as the previous code's id-level default
    model = run.model
    fns = {}
    for name, module, options in (("previous", previous, {}),
                                  ("current", current, dict(stopping="exact"))):
        fns[("greedy", name)] = (lambda m: lambda ids: m.greedy_translate(model, ids, **extra))(
            module)
        fns[("beam4", name)] = (lambda m, o: lambda ids: [
            h[0].ids for h in m.beam_translate(model, ids, beam_size=4, **extra, **o)])(
            module, options)
    return fns


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="/work/runs/m30k")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the grid")
    parser.add_argument("--sentences", type=int, default=None, help="first N val sentences")
    parser.add_argument("--ab-rounds", type=int, default=2, help="rounds of the A/B")
    parser.add_argument("--ab-sentences", type=int, default=192,
                        help="val sentences of the A/B (the previous beam loop is slow)")
    parser.add_argument("--previous", default="HEAD", help="git revision of the old loops")
    parser.add_argument("--name", default="search_defaults")
    parser.add_argument("--skip-grid", action="store_true")
    args = parser.parse_args()

    import torch

    import transformerkit
    from transformerkit.data.corpora import load_multi30k
    from transformerkit.evaluation import corpus_scores

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    run = transformerkit.load(args.run)
    sources, references = load_multi30k("val", "de", "en", data_dir=common.data_dir())
    if args.sentences:
        sources, references = sources[: args.sentences], references[: args.sentences]
    batches = batches_of(run, sources, 64)
    ab_batches = batches_of(run, sources[: args.ab_sentences], 64)
    ab_count = min(len(sources), args.ab_sentences)
    previous = load_previous_decoding(args.previous)
    limit = run.model.max_length

    grid = {} if args.skip_grid else {c: [] for c in grid_configs()}
    ab = {(forced, key): [] for forced in (False, True)
          for key in ab_decoders(run, previous, False)}
    fns = {forced: ab_decoders(run, previous, forced) for forced in (False, True)}
    same = {}
    texts = {}
    ids_of = {}
    warm = batches[len(batches) // 2][1][:8]  # first calls pay one-time costs: not timed
    for forced in (False, True):
        for fn in fns[forced].values():
            fn(warm)
    for round_ in range(max(args.rounds, args.ab_rounds)):
        for config in grid if round_ < args.rounds else ():
            (ids, hyps), seconds = timed(lambda c=config: decode_grid(run, batches, *c))
            grid[config].append(seconds)
            texts[config], ids_of[config] = hyps, ids
            print(f"round {round_} {config}: {len(sources) / seconds:.1f} sentences/s",
                  flush=True)
        for (forced, key) in ab if round_ < args.ab_rounds else ():
            outputs = []
            start = time.perf_counter()
            for _, ids in ab_batches:
                outputs.extend(fns[forced][key](ids))
            ab[(forced, key)].append(time.perf_counter() - start)
            search, _ = key
            ref = same.setdefault((forced, search), outputs)
            same[(forced, search, "equal")] = ref == outputs and \
                same.get((forced, search, "equal"), True)
            print(f"round {round_} forced={forced} {key}: "
                  f"{ab_count / ab[(forced, key)][-1]:.1f} sentences/s", flush=True)

    rows = []
    for config, seconds in grid.items():
        search, stopping, cap = config
        scores = corpus_scores(texts[config], references)
        rows.append(dict(search=search, stopping=stopping,
                         max_len_a=cap[0] if cap else None, max_len_b=cap[1] if cap else None,
                         bleu=round(scores["bleu"], 2), chrf=round(scores["chrf"], 2),
                         sentences_per_second=round(len(sources) / min(seconds), 1),
                         seconds=[round(s, 2) for s in seconds],
                         outputs_at_cap=at_cap(batches, ids_of[config], cap, limit),
                         mean_output_tokens=round(sum(map(len, ids_of[config]))
                                                  / len(sources), 2),
                         bleu_signature=scores["bleu_signature"]))
    live = []
    for (forced, (search, code)), seconds in ab.items():
        live.append(dict(forced_32=forced, search=search, code=code,
                         sentences_per_second=round(ab_count / min(seconds), 1),
                         seconds=[round(s, 2) for s in seconds],
                         outputs_equal_previous=bool(same[(forced, search, "equal")])))
    payload = dict(machine=common.machine(), run=args.run, sentences=len(sources),
                   batch_size=64, rounds=args.rounds, previous=args.previous,
                   ab_sentences=ab_count, ab_rounds=args.ab_rounds,
                   threads=torch.get_num_threads(), grid=rows, live_rows=live)
    common.write_results(args.name, payload, table(payload))


def table(payload):
    lines = [f"Multi30k val ({payload['sentences']} sentences), run {payload['run']}, batches "
             f"of 64, PyTorch {payload['threads']} threads, best of {payload['rounds']} "
             "interleaved rounds.", "",
             "| search | stopping | max_len_a | max_len_b | BLEU | chrF | sentences/s | "
             "outputs at cap | mean tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in payload["grid"]:
        cap_a = "-" if r["max_len_a"] is None else r["max_len_a"]
        cap_b = "-" if r["max_len_b"] is None else r["max_len_b"]
        lines.append(f"| {r['search']} | {r['stopping'] or '-'} | {cap_a} | {cap_b} | "
                     f"{r['bleu']:.2f} | {r['chrf']:.2f} | {r['sentences_per_second']} | "
                     f"{r['outputs_at_cap']} | {r['mean_output_tokens']} |")
    lines += ["", f"Live rows (finished sentences leave the batch) vs the loops of "
              f"`{payload['previous']}`, same process, the first {payload['ab_sentences']} "
              f"val sentences, best of {payload['ab_rounds']} interleaved rounds (beam: exact "
              "stopping, no length cap, as before):", "",
              "| length | search | previous sentences/s | current sentences/s | speed-up | "
              "same outputs |", "|---|---|---|---|---|---|"]
    by = {(r["forced_32"], r["search"], r["code"]): r for r in payload["live_rows"]}
    for forced in (False, True):
        for search in ("greedy", "beam4"):
            old, new = by[(forced, search, "previous")], by[(forced, search, "current")]
            lines.append(f"| {'forced 32' if forced else 'to EOS'} | {search} | "
                         f"{old['sentences_per_second']} | {new['sentences_per_second']} | "
                         f"{new['sentences_per_second'] / old['sentences_per_second']:.2f}x | "
                         f"{new['outputs_equal_previous']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
