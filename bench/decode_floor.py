"""The arithmetic floor of decoding to EOS: the matrix products a search computes, the time
this CPU needs for them at its measured peak, and what a speed goal asks of it.

For each search (greedy, beam 4; at most 64 tokens, stopping at EOS) over the first
``--sentences`` sentences of Multi30k test2016 (``bench/decode.py``'s length-sorted batches of
``--batch``), float32, ``--threads`` threads:

- **time**: the compiled engine (``tk-compiled``) and CTranslate2 float32 (``ct2-float32``),
  each round a process per system (the two never share one: their OpenMP runtimes compete),
  in alternating order, ``--repeats`` rounds, the best kept; the compiled engine's time
  inside its packages (the model's step and the encoder pass, as opposed to the search's
  own work, the cache reordering and Python) from the same timed pass;
- **arithmetic**: every package call of the compiled search is recorded with its inputs'
  shapes (the rows, the position, the sentences and their source length); the eager code
  each package captures (``decode_step`` and ``source_memories`` with the unpacked float32
  weights) is run again at those shapes under PyTorch's ``FlopCounterMode``, which counts
  the matrix products (the projections, the output layer, the attention's where it is a
  product). Element-wise work, softmax and the search's own work are not counted, so the
  count is a lower bound of the arithmetic. CTranslate2 decodes the same sentences with
  the same model (in greedy search with the same live rows each step:
  ``decode_precision.py --rows``), so the count is taken as its too;
- **peak**: float32 ``torch.mm`` of 1024- and 2048-square matrices on the same threads, the
  faster kept (this CPU's FMA rate as its best library kernel reaches it).

The table gives each system's seconds, its products' GFLOP/s and the share of the peak; the
goal row divides CTranslate2 float32's seconds by ``--goal`` (1.3, issue goals' float32 bar)
and says what rate that time would require of the products alone, with nothing else
taking any time: above the peak, no engine reaches the goal on this CPU at these threads.

    python bench/decode_floor.py RUN [--threads 1] [--repeats 3]
    # -> bench/results/decode_floor.FAMILY.{json,md}
"""

import argparse
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode  # noqa: E402

HERE = os.path.abspath(__file__)
SYSTEMS = ("tk-compiled", "ct2-float32")
SEARCHES = ("greedy", "beam4")
TOKENS = 64  # at most, stopping at EOS


@contextlib.contextmanager
def recording(calls):
    """While active, every package the compiled engine loads appends to ``calls`` one
    ``(kind, shape, seconds)`` per call: ``("encoder", (sentences, source_len))`` or
    ``("step", (rows, index, sentences, source_len))`` (sentences and source length 0 for a
    model without a source). Wraps ``aot_step.package_call``, which makes each loaded
    package's call; a decoder made before this was entered is not recorded."""
    from transformerkit.decoding import aot_step

    original = aot_step.package_call

    def package_call(bucket, run):
        call = original(bucket, run)

        def recorded(*inputs):
            started = time.perf_counter()
            out = call(*inputs)
            seconds = time.perf_counter() - started
            calls.append((*call_shape(bucket, inputs), seconds))
            return out

        return recorded

    aot_step.package_call = package_call
    try:
        yield calls
    finally:
        aot_step.package_call = original


def call_shape(bucket, inputs):
    """``(kind, shape)`` of one package call's ``inputs`` (:func:`recording`)."""
    from transformerkit.decoding.aot_step import ENCODER

    if bucket == ENCODER:
        return "encoder", tuple(inputs[0].shape)
    tokens, index, _, _, memories = inputs[:5]  # (tokens, index, caches, cache_rows, memories)
    sentences, source_len = ((0, 0) if not memories
                             else (memories[0][0].shape[0], memories[0][0].shape[2]))
    return "step", (tokens.shape[0], int(index), sentences, source_len)


def products_flops(model, kind, shape):
    """The floating-point operations of the matrix products of one package call
    (:func:`call_shape`), counted by ``FlopCounterMode`` on the eager code the package
    captures, at float32 with the unpacked weights (packed ones run kernels it does not
    count), on zeros of the call's shapes."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from transformerkit.decoding.eager_steps import source_memories

    weights = model.step_weights("float32", packed=False)
    seq2seq = hasattr(model, "decoder_blocks")
    if kind == "encoder":
        sentences, source_len = shape
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            source_memories(model, torch.full((sentences, source_len), 4), weights)
        return counter.get_total_flops()
    rows, index, sentences, source_len = shape
    layers = model.num_decoder_layers if seq2seq else model.num_layers
    caches = [tuple(torch.zeros(index + 1, rows, model.num_heads, dim)
                    for dim in (model.key_dim, model.value_dim)) for _ in range(layers)]
    memories = None
    if seq2seq:
        memories = [(torch.zeros(sentences, model.num_heads, source_len, model.key_dim),
                     torch.zeros(sentences, model.num_heads, source_len, model.value_dim),
                     torch.zeros(sentences, 1, 1, source_len), torch.ones(sentences, 1, 1, 1))
                    for _ in range(layers)]
    tokens = torch.full((rows,), 4, dtype=torch.long)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.decode_step(tokens, index, caches, weights, memories, rows // max(sentences, 1))
    return counter.get_total_flops()


def search_flops(model, calls):
    """``{"encoder": FLOPs, "step": FLOPs}`` of the recorded ``calls`` (each distinct shape
    counted once)."""
    counted, totals = {}, {"encoder": 0, "step": 0}
    for kind, shape, _ in calls:
        key = (kind, tuple(shape))
        if key not in counted:
            counted[key] = products_flops(model, kind, tuple(shape))
        totals[kind] += counted[key]
    return totals


def worker(spec):
    """One system's round: each search over every batch once, after a warm-up batch; for
    the compiled engine also the shapes and seconds of its package calls."""
    import torch

    import transformerkit

    transformerkit.keep_freed_memory()  # the CLI's malloc setting, for both systems alike
    torch.set_num_threads(spec["threads"])
    batches, _, _, _ = decode.load_inputs(spec["run"], spec["sentences"], spec["batch"])
    results = []
    for search in SEARCHES:
        calls = []
        compiled = spec["system"] == "tk-compiled"
        with recording(calls) if compiled else contextlib.nullcontext():
            if compiled:
                run = decode.transformerkit_decoder(spec["run"], search, TOKENS, "compiled",
                                                    False)
            else:
                run = decode.ctranslate2_decoder(spec["run"], spec["system"], search, TOKENS,
                                                 False, spec["threads"])
            run(batches[-1][1])  # warm-up: loads (or builds) the packages
            calls.clear()
            started = time.perf_counter()
            for _, ids in batches:
                run(ids)
            seconds = time.perf_counter() - started
        results.append(dict(system=spec["system"], search=search, seconds=seconds,
                            calls=[[kind, list(shape), s] for kind, shape, s in calls]))
        print(f"    {spec['system']} {search}: {seconds:.3f} s", file=sys.stderr, flush=True)
    return results


def peak_gflops(threads):
    """float32 ``torch.mm`` GFLOP/s of 1024- and 2048-square matrices on ``threads``
    threads, the faster (:func:`common.matmul_peak`)."""
    import torch

    torch.set_num_threads(threads)
    return max(common.matmul_peak(seconds=3.0, n=n) for n in (1024, 2048))


def summarize(best, flops, peak, goal):
    """The result rows: per search each system's seconds, GFLOP/s and share of the
    ``peak``, the compiled engine's package seconds, and the goal's arithmetic (``flops``:
    per search, :func:`search_flops`)."""
    rows = []
    for search in (s for s in SEARCHES if s in flops):
        total = sum(flops[search].values())
        row = dict(search=search, gflop=round(total / 1e9, 2),
                   encoder_gflop=round(flops[search]["encoder"] / 1e9, 2),
                   floor_seconds=round(total / 1e9 / peak, 3), systems={})
        for system in SYSTEMS:
            found = best.get((system, search))
            if found is None:
                continue
            rate = total / 1e9 / found["seconds"]
            row["systems"][system] = dict(seconds=round(found["seconds"], 3),
                                          gflops=round(rate, 1),
                                          share_of_peak=round(rate / peak, 3))
            if found["calls"]:
                inside = sum(call[2] for call in found["calls"])
                row["systems"][system]["package_seconds"] = round(inside, 3)
                row["systems"][system]["package_gflops"] = round(total / 1e9 / inside, 1)
        peer = row["systems"].get("ct2-float32")
        if peer is not None:
            seconds = peer["seconds"] / goal
            row["goal"] = dict(speedup=goal, seconds=round(seconds, 3),
                               gflops=round(total / 1e9 / seconds, 1),
                               share_of_peak=round(total / 1e9 / seconds / peak, 3))
        rows.append(row)
    return rows


def table(rows, peak, threads):
    """The Markdown table of :func:`summarize`'s ``rows``."""
    lines = ["| search | what | seconds | products' GFLOP/s | share of the peak |",
             "|---|---|---:|---:|---:|"]
    for row in rows:
        for system, found in row["systems"].items():
            lines.append(f"| {row['search']} | {system} | {found['seconds']:.3f} | "
                         f"{found['gflops']:.1f} | {100 * found['share_of_peak']:.0f}% |")
            if "package_seconds" in found:
                rate = found["package_gflops"]
                lines.append(f"| {row['search']} | {system}: in its packages (step, encoder) "
                             f"| {found['package_seconds']:.3f} | {rate:.1f} | "
                             f"{100 * rate / peak:.0f}% |")
        lines.append(f"| {row['search']} | the products alone at the peak | "
                     f"{row['floor_seconds']:.3f} | {peak:.1f} | 100% |")
        goal = row.get("goal")
        if goal:
            lines.append(f"| {row['search']} | **goal: {goal['speedup']}x ct2-float32** | "
                         f"**{goal['seconds']:.3f}** | **{goal['gflops']:.1f}** | "
                         f"**{100 * goal['share_of_peak']:.0f}%** |")
    lines.append("")
    products = "; ".join(f"{row['search']} {row['gflop']:.1f} "
                         f"(encoder {row['encoder_gflop']:.1f})" for row in rows)
    lines.append(f"float32, {threads} thread{'s' if threads > 1 else ''}. Products, GFLOP: "
                 f"{products}. Peak: {peak:.1f} GFLOP/s (float32 `torch.mm`, square "
                 f"matrices). A goal row above 100% of the peak is out of reach of any engine "
                 f"on this CPU at this thread count.")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="run directory of a translation model")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--goal", type=float, default=1.3)
    parser.add_argument("--name", default="decode_floor")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if not args.run:
        parser.error("the run directory is required")
    import torch

    import transformerkit

    try:  # a clear error before any round: the model counts the products at the end
        model = transformerkit.load(args.run).model
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"decode_floor.py: {error}") from None
    env = {"KERAS_BACKEND": "torch", "OMP_NUM_THREADS": str(args.threads)}
    best, failed = {}, []
    for round_index in range(args.repeats):
        for system in SYSTEMS if round_index % 2 == 0 else SYSTEMS[::-1]:
            print(f"... round {round_index + 1}/{args.repeats}: {system}", flush=True)
            job = dict(system=system, run=os.path.abspath(args.run), threads=args.threads,
                       sentences=args.sentences, batch=args.batch)
            out = common.run_worker(HERE, ["--worker", json.dumps(job)], env, timeout=3600)
            if isinstance(out, dict):
                print("    failed:", out, flush=True)
                failed.append(dict(system=system, **out))
                continue
            for r in out:
                key = (r["system"], r["search"])
                if key not in best or r["seconds"] < best[key]["seconds"]:
                    best[key] = r
    for search in SEARCHES:
        if ("tk-compiled", search) in best and not best[("tk-compiled", search)]["calls"]:
            raise SystemExit("the compiled engine's search made no package call the recorder "
                             "saw: it decoded eagerly (see its warning) or its packages are "
                             "no longer made by aot_step.package_call")
    torch.set_num_threads(args.threads)
    flops = {search: search_flops(model, best[("tk-compiled", search)]["calls"])
             for search in SEARCHES if ("tk-compiled", search) in best}
    if not flops:
        raise SystemExit(f"the compiled engine's rounds failed: {failed}")
    peak = peak_gflops(args.threads)
    rows = summarize(best, flops, peak, args.goal)
    payload = {"machine": dict(common.machine(), threads=args.threads),
               "run": os.path.abspath(args.run), "sentences": args.sentences,
               "batch": args.batch, "repeats": args.repeats, "peak_gflops": round(peak, 1),
               "results": rows,
               "package_calls": {search: len(best[("tk-compiled", search)]["calls"])
                                 for search in flops},
               "failed": failed}
    common.write_results(args.name, payload, table(rows, peak, args.threads))


if __name__ == "__main__":
    main()
