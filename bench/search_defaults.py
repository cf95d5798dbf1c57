"""Search defaults on Multi30k val: beam stopping rule and output-length cap, by BLEU and speed.

On a trained de->en run (``--run``) and the 1014 val sentences, in
batches of 64 sorted by length, this measures, interleaved (round after round, every
configuration once per round; the best round counts for speed):

* **grid**: greedy and beam 4 (alpha 0.6), beam with the ``exact`` and ``early`` stopping
  rules, each with several length caps ``max_len_a * source_tokens + max_len_b`` (and none):
  sacreBLEU, chrF, sentences/s, how many outputs end at their cap without an end token;
* **live rows** (unless ``--skip-ab``): stop-at-EOS speed of the eager PyTorch loop when
  finished sentences leave the batch (``drop_finished=True``, the default) against the same
  loop keeping every row (``drop_finished=False``), on the same batches, outputs checked
  token for token;
* **forced length**: the same A/B with 32 tokens forced (``min_new_tokens = max_new_tokens
  = 32``), where nothing finishes early, to show it does not get slower.

    python bench/search_defaults.py --run RUN --rounds 2 --skip-ab
                                          # -> results/search_defaults.FAMILY.{json,md}
    python bench/search_defaults.py --run RUN --rounds 1 --sentences 256   # quick look
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "torch")
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPS = [None, (1.0, 5), (1.2, 10), (1.5, 10)]


def batches_of(run, sources, batch_size):
    """Source id batches ``(rows, len)`` sorted by length, as ``translate_batches`` makes."""
    import numpy as np

    from transformerkit.data.padding import pad_batch
    from transformerkit.decoding.texts import encode_sources

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

    from transformerkit.decoding.texts import length_caps

    count = 0
    for order, ids in batches:
        a, b = cap if cap else (None, None)
        caps = length_caps(ids, limit, a, b)
        count += sum(len(outputs[int(i)]) >= c for i, c in zip(order, caps, strict=True))
    return int(count) if not isinstance(count, np.integer) else int(count)


def ab_decoders(run, forced):
    """``{(search, rows): fn(ids) -> ids lists}`` for the live-rows A/B: ``rows`` is
    ``"kept"`` (``drop_finished=False``) or ``"live"`` (finished rows leave the batch)."""
    from transformerkit.decoding import beam_translate, greedy_translate

    extra = dict(max_new_tokens=32, min_new_tokens=32) if forced else {}
    extra.update(max_len_a=None, max_len_b=None, stopping="exact")
    greedy_extra = {k: v for k, v in extra.items() if k != "stopping"}
    model = run.model
    fns = {}
    for name, drop in (("kept", False), ("live", True)):
        fns[("greedy", name)] = (lambda d: lambda ids: greedy_translate(
            model, ids, drop_finished=d, **greedy_extra))(drop)
        fns[("beam4", name)] = (lambda d: lambda ids: [
            h[0].ids for h in beam_translate(model, ids, beam_size=4, drop_finished=d,
                                             **extra)])(drop)
    return fns


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a trained Multi30k de->en run")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the grid")
    parser.add_argument("--sentences", type=int, default=None, help="first N val sentences")
    parser.add_argument("--ab-rounds", type=int, default=2, help="rounds of the A/B")
    parser.add_argument("--ab-sentences", type=int, default=192,
                        help="val sentences of the A/B (beam search keeping every row is slow)")
    parser.add_argument("--name", default="search_defaults")
    parser.add_argument("--skip-grid", action="store_true")
    parser.add_argument("--skip-ab", action="store_true",
                        help="only the grid: no live-rows A/B")
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
    limit = run.model.max_length

    grid = {} if args.skip_grid else {c: [] for c in grid_configs()}
    fns = {} if args.skip_ab else {forced: ab_decoders(run, forced) for forced in (False, True)}
    ab = {(forced, key): [] for forced in fns for key in fns[forced]}
    same = {}
    texts = {}
    ids_of = {}
    warm = batches[len(batches) // 2][1][:8]  # first calls pay one-time costs: not timed
    for forced in fns:
        for fn in fns[forced].values():
            fn(warm)
    for round_ in range(max(args.rounds, args.ab_rounds if fns else 0)):
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
    for (forced, (search, row_policy)), seconds in ab.items():
        live.append(dict(forced_32=forced, search=search, rows=row_policy,
                         sentences_per_second=round(ab_count / min(seconds), 1),
                         seconds=[round(s, 2) for s in seconds],
                         outputs_equal_kept=bool(same[(forced, search, "equal")])))
    payload = dict(machine=common.machine(), run=args.run, sentences=len(sources),
                   batch_size=64, rounds=args.rounds, threads=torch.get_num_threads(),
                   grid=rows, live_rows=live)
    if not args.skip_ab:
        payload.update(ab_sentences=ab_count, ab_rounds=args.ab_rounds)
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
    if not payload["live_rows"]:
        return "\n".join(lines)
    lines += ["", "Live rows (finished sentences leave the batch, the default) against every "
              "row kept (`drop_finished=False`), same process, the first "
              f"{payload['ab_sentences']} val sentences, best of {payload['ab_rounds']} "
              "interleaved rounds (beam: exact stopping; no length cap):", "",
              "| length | search | rows kept: sentences/s | live rows: sentences/s | speed-up | "
              "same outputs |", "|---|---|---|---|---|---|"]
    by = {(r["forced_32"], r["search"], r["rows"]): r for r in payload["live_rows"]}
    for forced in (False, True):
        for search in ("greedy", "beam4"):
            old, new = by[(forced, search, "kept")], by[(forced, search, "live")]
            lines.append(f"| {'forced 32' if forced else 'to EOS'} | {search} | "
                         f"{old['sentences_per_second']} | {new['sentences_per_second']} | "
                         f"{new['sentences_per_second'] / old['sentences_per_second']:.2f}x | "
                         f"{new['outputs_equal_kept']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
