"""Decoding precision: transformerkit in float32, bfloat16 and int8 (``--precision``) next
to CTranslate2 float32 and int8 on the same weights (``transformerkit export``), greedy and
beam 4, with BLEU, the share of sentences identical to our float32 output, and sentences/s.

Two workloads on Multi30k test2016 (German -> English), sorted by length, batches of
``--batch`` (64):

- **to EOS**: the first ``--sentences`` sentences decoded as users decode (stop at the end
  token, at most 64 tokens, no length cap relative to the source); BLEU against the
  references and the share of outputs identical to transformerkit float32's come from
  these.
- **32 forced**: outputs forced to exactly 32 tokens (the end token forbidden before), so
  that every system does the same work whatever the weights (a briefly trained run may end
  its sentences at once).

Every system runs in processes of its own, one per system and round, in the reverse order
every other round (``bench/decode.py``'s protocol: CTranslate2's OpenMP pool and PyTorch's
must not share a process); each configuration keeps its best of ``--repeats`` rounds; every
system uses ``--threads`` CPU threads (1).

    python bench/decode_precision.py RUN   # -> bench/results/decode_precision.{json,md}

``--kernels`` times the products alone instead, on the Multi30k model's shapes (one
thread, interleaved, best of ``--repeats`` rounds): float32 packed for oneDNN, bfloat16
packed for oneDNN (ours) against ``addmm`` on a bfloat16 weight copy, int8 (ours); and in a
process under ``ONEDNN_MAX_CPU_ISA=AVX2`` (no bfloat16 units for oneDNN) PyTorch's own
bfloat16 ``addmm`` against our emulation and float32 (-> ``decode_precision_kernels``).
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
SYSTEMS = ("tk-float32", "tk-bfloat16", "tk-int8", "ct2-float32", "ct2-int8")
# (search, output tokens, forced)
WORKLOADS = [("greedy", 64, False), ("beam4", 64, False), ("greedy", 32, True),
             ("beam4", 32, True)]


def decoder(run_dir, system, search, tokens, forced, threads):
    """``decode(ids) -> [ids, ...]`` for ``system`` (``tk-PRECISION`` or ``ct2-TYPE``)."""
    if system.startswith("ct2"):
        return decode.ctranslate2_decoder(run_dir, system, search, tokens, forced, threads)
    from transformerkit.layers import lowprec

    precision = system.split("-")[1]
    inner = decode.transformerkit_decoder(run_dir, search, tokens, True, forced)

    def run(ids):
        with lowprec.using(precision):
            return inner(ids)

    return run


def worker(spec):
    """Every workload of one system once, after a warm-up batch each."""
    import transformerkit
    from transformerkit.evaluation import corpus_scores

    transformerkit.keep_freed_memory()  # the CLI's malloc setting, for every system alike
    results = []
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    for search, tokens, forced in WORKLOADS:
        count = spec["forced_sentences"] if forced else spec["sentences"]
        batches, references, target_tok, _ = decode.load_inputs(spec["run"], count,
                                                                 spec["batch"])
        count = sum(len(chunk) for chunk, _ in batches)
        run = decoder(spec["run"], spec["system"], search, tokens, forced, threads)
        run(batches[-1][1])  # warm-up: packs the weights, builds the kernels
        outputs = [None] * count
        started = time.perf_counter()
        for chunk, ids in batches:
            for i, out in zip(chunk, run(ids), strict=True):
                outputs[i] = [int(t) for t in out]
        seconds = time.perf_counter() - started
        job = dict(system=spec["system"], search=search, tokens=tokens, forced=forced,
                   sentences=count, seconds=round(seconds, 3),
                   mean_output_tokens=round(sum(map(len, outputs)) / count, 1))
        if not forced:
            job["bleu"] = corpus_scores([target_tok.decode(o) for o in outputs],
                                        references[:count])["bleu"]
            job["outputs"] = outputs
        print(f"    {spec['system']} {search} {tokens}{' forced' if forced else ''}: "
              f"{job['seconds']} s", file=sys.stderr, flush=True)
        results.append(job)
    return results


def run_all(args):
    import torch

    threads = str(args.threads)
    env = {"KERAS_BACKEND": "torch", "OMP_NUM_THREADS": threads}
    timings, failed = {}, []
    for round_index in range(args.repeats):
        systems = list(SYSTEMS) if round_index % 2 == 0 else list(reversed(SYSTEMS))
        for system in systems:
            spec = dict(system=system, run=os.path.abspath(args.run), batch=args.batch,
                        sentences=args.sentences, forced_sentences=args.forced_sentences)
            print(f"... round {round_index + 1}/{args.repeats}: {system}", flush=True)
            out = common.run_worker(HERE, ["--worker", json.dumps(spec)], env, timeout=3600)
            if isinstance(out, dict):
                print("    failed:", out, flush=True)
                failed.append(dict(system=system, **out))
                continue
            for r in out:
                timings.setdefault((r["system"], r["search"], r["tokens"], r["forced"]),
                                   []).append(r)
    results = []
    for key in sorted(timings, key=lambda k: (WORKLOADS.index(k[1:]), SYSTEMS.index(k[0]))):
        runs = timings[key]
        best = min(runs, key=lambda r: r["seconds"])
        results.append(dict(best, timings=[r["seconds"] for r in runs],
                            sentences_per_second=round(best["sentences"] / best["seconds"], 1)))
    for r in results:  # identical to transformerkit float32's output, same workload
        reference = next((x for x in results if x["system"] == "tk-float32"
                          and x["search"] == r["search"] and x["forced"] == r["forced"]
                          and "outputs" in x), None)
        if reference is not None and "outputs" in r:
            same = sum(a == b for a, b in zip(r["outputs"], reference["outputs"], strict=True))
            r["identical_to_float32"] = round(same / len(r["outputs"]), 4)
    for r in results:
        r.pop("outputs", None)
    from transformerkit import precisions

    flags = sorted(f for f in precisions.cpu_flags() if f.startswith(("avx512", "amx"))
                   or f in ("avx2", "avx_vnni"))
    payload = {"machine": dict(common.machine(), threads=args.threads,
                               torch_version=torch.__version__),
               "cpu_flags_all": flags, "auto": precisions.choose("auto"),
               "run": os.path.abspath(args.run), "batch": args.batch, "repeats": args.repeats,
               "results": results, "failed": failed}
    common.write_results(args.name, payload, table(results))


def table(results):
    def find(system, search, forced):
        return next((r for r in results if r["system"] == system and r["search"] == search
                     and r["forced"] == forced), None)

    rows = ["| system | search | output tokens | mean output tokens | sentences/s | "
            "vs CT2 float32 | vs CT2 int8 | BLEU | identical to tk float32 |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ct2 = {t: find(f"ct2-{t}", r["search"], r["forced"]) for t in ("float32", "int8")}
        ratio = {t: f"{r['sentences_per_second'] / c['sentences_per_second']:.2f}x"
                 if c and c is not r else "" for t, c in ct2.items()}
        tokens = f"{r['tokens']} forced" if r["forced"] else f"<= {r['tokens']} (EOS)"
        identical = r.get("identical_to_float32")
        rows.append(f"| {r['system']} | {r['search']} | {tokens} | {r['mean_output_tokens']} | "
                    f"{r['sentences_per_second']} "
                    f"| {ratio['float32']} | {ratio['int8']} | {r.get('bleu', '')} | "
                    f"{'' if identical is None else f'{100 * identical:.1f}%'} |")
    return "\n".join(rows)


# (rows, d_in, d_out): the fused query/key/value, the feed-forward's two, the output
# projection by the tied 8000-word table; 64 rows (greedy) and 256 (beam 4 of 64)
KERNEL_SHAPES = [(64, 256, 768), (64, 256, 512), (64, 512, 256), (64, 256, 8000),
                 (256, 256, 768), (256, 256, 8000)]


def shape_kernels(rows, d_in, d_out):
    """``{name: call}``: the kernels compared on one product shape."""
    import torch

    from transformerkit import internals
    from transformerkit.layers import lowprec

    pack, linear = internals.get("onednn_pack"), internals.get("onednn_linear")
    x = torch.randn(rows, d_in)
    weight, bias = torch.randn(d_out, d_in) / 16, torch.randn(d_out)
    low_kernel, low_bias = weight.t().bfloat16().contiguous(), bias.bfloat16()
    packed = pack(weight, 64)
    kernels = {"float32 (oneDNN packed)": lambda: linear(x, packed, bias, "none", [], ""),
               "bfloat16 addmm": lambda: torch.addmm(low_bias, x.bfloat16(),
                                                     low_kernel).float()}
    low = {p: lowprec.pack(weight, bias, p) for p in ("bfloat16", "int8")}
    kernels[f"bfloat16 ours ({low['bfloat16'].kind})"] = lambda: lowprec.apply(
        x, low["bfloat16"])
    kernels[f"int8 ours ({low['int8'].kind})"] = lambda: lowprec.apply(x, low["int8"])
    return kernels


def kernel_timings(rounds, capped):
    """``{shape: {kernel: microseconds}}``, the kernels interleaved, best of ``rounds``."""
    import warnings

    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    out = {}
    for rows, d_in, d_out in KERNEL_SHAPES:
        kernels = shape_kernels(rows, d_in, d_out)
        if capped:  # the units off: only the slow loop and the emulation matter there
            kernels = {k: v for k, v in kernels.items() if "int8" not in k}
        best = {name: float("inf") for name in kernels}
        calls = 5 if capped else 50
        for kernel in kernels.values():
            kernel()
        for _ in range(rounds):
            for name, kernel in kernels.items():
                started = time.perf_counter()
                for _ in range(calls):
                    kernel()
                best[name] = min(best[name], (time.perf_counter() - started) / calls * 1e6)
        out[f"{rows}x{d_in} . {d_in}x{d_out}"] = {k: round(v, 1) for k, v in best.items()}
    return out


def run_kernels(args):
    timings = kernel_timings(args.repeats, capped=False)
    capped = common.run_worker(HERE, ["--kernel-worker", str(args.repeats)],
                               {"ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"})
    rows = ["| product | kernel | µs (uncapped) | µs (ONEDNN_MAX_CPU_ISA=AVX2) |",
            "|---|---|---|---|"]
    for shape, kernels in timings.items():
        for name, micros in kernels.items():
            under_cap = capped.get(shape, {}) if isinstance(capped, dict) else {}
            capped_name = next((k for k in under_cap if k.split(" (")[0] == name.split(" (")[0]),
                               None)
            cell = "" if capped_name is None else f"{under_cap[capped_name]} ({capped_name})"
            rows.append(f"| {shape} | {name} | {micros} | {cell} |")
    payload = {"machine": dict(common.machine(), threads=1), "uncapped": timings,
               "onednn_max_cpu_isa_avx2": capped}
    common.write_results(args.name + "_kernels", payload, "\n".join(rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="run directory of a trained Multi30k de->en "
                                                    "model")
    parser.add_argument("--sentences", type=int, default=1000,
                        help="test2016 sentences decoded to EOS (all 1000)")
    parser.add_argument("--forced-sentences", type=int, default=256,
                        help="test2016 sentences decoded to 32 forced tokens (256)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds (one process per system each); best is kept")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per process, the same for every system (1)")
    parser.add_argument("--name", default="decode_precision",
                        help="results/NAME.{json,md} (default decode_precision)")
    parser.add_argument("--kernels", action="store_true",
                        help="time the products alone (-> results/NAME_kernels)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--kernel-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kernel_worker:
        print(json.dumps(kernel_timings(int(args.kernel_worker), capped=True)))
        return
    if args.kernels:
        run_kernels(args)
        return
    if args.worker:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.run is None:
        parser.error("the run directory (RUN) is required")
    run_all(args)


if __name__ == "__main__":
    main()
