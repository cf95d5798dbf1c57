"""Decoding precision: transformerkit in float32, bfloat16 and int8 (``--precision``) next
to CTranslate2 float32 and int8 on the same weights (``transformerkit export``) and
OpenVINO float32 and int8 weights (optimum-intel), greedy and beam 4, with BLEU, the share
of sentences identical to our float32 output, and sentences/s.

Two workloads on Multi30k test2016 (German -> English), sorted by length, batches of
``--batch`` (64):

- **to EOS**: the first ``--sentences`` sentences decoded as users decode (stop at the end
  token, at most 64 tokens, no length cap relative to the source); BLEU against the
  references and the share of outputs identical to transformerkit float32's come from
  these.
- **32 forced**: outputs forced to exactly 32 tokens (the end token forbidden before), so
  that every system does the same work whatever the weights (a briefly trained run may end
  its sentences at once).

Every system runs in a process of its own (CTranslate2's OpenMP pool and PyTorch's must not
share one), kept running for the whole measurement; the systems take turns pass by pass:
for each workload, ``--repeats`` rounds of one timed pass per system, in the reverse order
every other round (a workload's first pass in each process follows an untimed warm-up
batch). A system's passes are thus seconds, not minutes, apart from its peers', and a
drift of the machine's speed reaches them alike. Each configuration keeps its best pass;
every system uses ``--threads`` CPU threads (1). The ``ov-*`` systems run a process a round
(all workloads), after the others.

    python bench/decode_precision.py RUN   # -> bench/results/decode_precision.FAMILY.{json,md}

The OpenVINO systems (``ov-float32``, ``ov-int8``: optimum-intel's ``OVModelForSeq2SeqLM``
and its ``generate``; named in ``--systems``, the default leaves them out) run in a venv of
their own, ``.venv-openvino`` (OpenVINO and optimum-intel pin their own ``transformers``:
the Marian export needs 4.57; PyPI's ``torchvision``, which optimum-intel requires, is
built against CUDA's torch and breaks ``transformers``' imports beside the CPU one, and
nothing here uses it), made once with:

    python3.11 -m venv .venv-openvino
    .venv-openvino/bin/pip install torch==2.13.0
    .venv-openvino/bin/pip install "optimum-intel[openvino]==2.2.0" openvino==2026.4.1 \\
        transformers==4.57.6 torch==2.13.0
    .venv-openvino/bin/pip uninstall -y torchvision

Their worker, ``bench/openvino_worker.py``, runs with that venv's Python and imports nothing
from transformerkit (``bench/openvino_peer.py`` writes the run's ``MarianMTModel`` folder in
``RUN/openvino``, has it converted to OpenVINO IR once, float32 and with NNCF's 8-bit weight
compression, and maps our ids to Marian's and back): the same source ids in, ids out, the
same warm-up batch, rounds and ``--threads`` (OpenVINO's ``INFERENCE_NUM_THREADS``, float32
inference precision). What differs from our search: beam 4 ranks finished hypotheses by
``log p / len^0.6`` (``transformers``' ``length_penalty``, as the CTranslate2 rows; ours is
GNMT's ``((5+len)/6)^0.6``), both stop a sentence once 4 hypotheses have finished
(``early_stopping=True``), and ``generate`` keeps finished sentences in the batch (and
computes them) until the whole batch has finished, where ours drops them.

``--kernels`` times the products alone instead, on the Multi30k model's shapes (one
thread, interleaved, best of ``--repeats`` rounds): float32 packed for oneDNN, bfloat16
packed for oneDNN (ours) against ``addmm`` on a bfloat16 weight copy, int8 (ours); and in a
process under ``ONEDNN_MAX_CPU_ISA=AVX2`` (no bfloat16 units for oneDNN) PyTorch's own
bfloat16 ``addmm`` against our emulation and float32 (-> ``decode_precision_kernels``).

``--rows`` measures what a decoding step costs by the number of rows still being decoded,
for every system (each in processes of its own, interleaved rounds, one thread): greedy
forced to ``--row-tokens`` (32) tokens on the first 1, 4, 16 and 64 sentences of the sorted
test set, milliseconds per output position (the encoder included, spread over the
positions; best of ``--repeats`` rounds of 5 timed calls, the median call), and how the
steps of greedy decoding to EOS (every sentence, batches of ``--batch``) spread over those
row counts, from each system's own output lengths (-> ``decode_precision_rows``). A search
to EOS drops finished sentences, so a batch ends on steps with few rows, where a step's
fixed cost (the calls a step makes whatever its rows) decides the speed.
"""

import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode  # noqa: E402
import openvino_peer  # noqa: E402

HERE = os.path.abspath(__file__)
SYSTEMS = ("tk-float32", "tk-bfloat16", "tk-int8", "tk-compiled", "tk-compiled-bfloat16",
           "tk-compiled-int8", "ct2-float32", "ct2-int8", "ov-float32", "ov-int8")
DEFAULT_SYSTEMS = [s for s in SYSTEMS if not s.startswith("ov-")]  # ov-*: a venv of its own
PAUSE = 0.25  # seconds between two systems' passes: an OpenMP pool that has just
# finished spins its threads a moment before it sleeps
# (search, output tokens, forced)
WORKLOADS = [("greedy", 64, False), ("beam4", 64, False), ("greedy", 32, True),
             ("beam4", 32, True)]


def decoder(run_dir, system, search, tokens, forced, threads):
    """``decode(ids) -> [ids, ...]`` for ``system`` (``tk-PRECISION``; ``tk-compiled``,
    ``tk-compiled-bfloat16``, ``tk-compiled-int8``: the step compiled ahead of time, float32,
    bfloat16 or int8 weights; or ``ct2-TYPE``)."""
    if system.startswith("ct2"):
        return decode.ctranslate2_decoder(run_dir, system, search, tokens, forced, threads)
    if system.startswith("tk-compiled"):
        precision = system.split("-")[2] if system.count("-") == 2 else "float32"
        return decode.transformerkit_decoder(run_dir, search, tokens, "compiled", forced,
                                             precision)
    return decode.transformerkit_decoder(run_dir, search, tokens, True, forced,
                                         system.split("-")[1])


def job_result(system, workload, count, seconds, outputs, references, target_tok):
    """One workload's measurement of ``system``: its time, mean output length and, to
    EOS, BLEU and the outputs (for the share identical to tk-float32's)."""
    from transformerkit.evaluation import corpus_scores

    search, tokens, forced = workload
    job = dict(system=system, search=search, tokens=tokens, forced=forced, sentences=count,
               seconds=round(seconds, 3),
               mean_output_tokens=round(sum(map(len, outputs)) / count, 1))
    if not forced:
        job["bleu"] = corpus_scores([target_tok.decode(o) for o in outputs],
                                    references[:count])["bleu"]
        job["outputs"] = outputs
    return job


def workload_inputs(spec, forced):
    """``(batches, references, target tokenizer, count)`` of a workload of ``spec``."""
    count = spec["forced_sentences"] if forced else spec["sentences"]
    batches, references, target_tok, _ = decode.load_inputs(spec["run"], count, spec["batch"])
    return batches, references, target_tok, sum(len(chunk) for chunk, _ in batches)


def timed_pass(system, workload, prepared):
    """One timed pass of ``workload`` by ``system`` over its batches (``prepared``:
    ``(decode, batches, references, target tokenizer, count)``): its :func:`job_result`."""
    run, batches, references, target_tok, count = prepared
    outputs = [None] * count
    started = time.perf_counter()
    for chunk, ids in batches:
        for i, out in zip(chunk, run(ids), strict=True):
            outputs[i] = [int(t) for t in out]
    return job_result(system, workload, count, time.perf_counter() - started, outputs,
                      references, target_tok)


def pass_worker(spec):
    """A system's worker, kept running for the whole measurement (``--pass-worker``): each
    line on its standard input names a workload (its index in :data:`WORKLOADS`), and it
    answers with one timed pass of it (:func:`timed_pass`, on a line starting with
    ``common.ANSWER``), or ``{"error": ...}``. A workload's first request makes its decoder
    and runs the warm-up batch (packs the weights, loads or builds the kernels) untimed."""
    import transformerkit

    transformerkit.keep_freed_memory()  # the CLI's malloc setting, for every system alike
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    prepared = {}
    for line in sys.stdin:
        workload = WORKLOADS[json.loads(line)]
        try:
            if workload not in prepared:
                search, tokens, forced = workload
                batches, references, target_tok, count = workload_inputs(spec, forced)
                run = decoder(spec["run"], spec["system"], search, tokens, forced, threads)
                run(batches[-1][1])
                prepared[workload] = (run, batches, references, target_tok, count)
            answer = timed_pass(spec["system"], workload, prepared[workload])
        except Exception as error:  # noqa: BLE001 - reported to the controller, which goes on
            answer = {"error": f"{type(error).__name__}: {error}"}
        print(common.ANSWER + json.dumps(answer), flush=True)


def openvino_round(spec, threads):
    """One round of an ``ov-*`` system: every workload decoded by
    ``bench/openvino_worker.py`` in the OpenVINO venv (a process of its own: the warm-up
    batch, then the timed batches, as :func:`worker`), scored here; the same list as
    :func:`worker`, each result with the OpenVINO side's record, or ``{"error": ...}``."""
    ir, ids, how = openvino_peer.translation_model(spec["run"], spec["system"], threads)
    inputs = [workload_inputs(spec, forced) for _, _, forced in WORKLOADS]
    workloads = [dict(search=search, tokens=tokens, forced=forced,
                      batches=[batch for _, batch in inputs_of[0]])
                 for (search, tokens, forced), inputs_of in zip(WORKLOADS, inputs, strict=True)]
    found = openvino_peer.translate(spec["system"], ir, ids, workloads, threads)
    if "error" in found:
        return found
    record = dict(export=how, ir=ir, versions=found["versions"],
                  length_penalty=openvino_peer.LENGTH_PENALTY,
                  **{k: v for k, v in found.items() if k not in ("results", "versions")})
    results = []
    for workload, (batches, references, target_tok, count), out in zip(
            WORKLOADS, inputs, found["results"], strict=True):
        outputs = [None] * count
        for (chunk, _), decoded in zip(batches, out["outputs"], strict=True):
            for i, row in zip(chunk, decoded, strict=True):
                outputs[i] = row
        results.append(dict(job_result(spec["system"], workload, count, out["seconds"],
                                       outputs, references, target_tok), openvino=record))
    return results


def worker_rounds(args, flag, spec, failed, systems=None):
    """Yield what each system's worker (``flag``) prints, every system (``systems``, default
    ``args.systems``) in a process of its own, ``args.repeats`` rounds in alternating order;
    a failed worker goes to ``failed``."""
    env = {"KERAS_BACKEND": "torch", "OMP_NUM_THREADS": str(args.threads)}
    chosen = list(args.systems if systems is None else systems)
    for round_index in range(args.repeats):
        systems = chosen if round_index % 2 == 0 else chosen[::-1]
        for system in systems:
            job = dict(spec, system=system, run=os.path.abspath(args.run), batch=args.batch)
            print(f"... round {round_index + 1}/{args.repeats}: {system}", flush=True)
            if system.startswith("ov-"):
                try:
                    out = openvino_round(job, args.threads)
                except (RuntimeError, ValueError) as error:  # a conversion that failed
                    out = {"error": f"{type(error).__name__}: {error}"}
            else:
                out = common.run_worker(HERE, [flag, json.dumps(job)], env, timeout=3600)
            if isinstance(out, dict) and "error" in out:
                print("    failed:", out, flush=True)
                failed.append(dict(system=system, **out))
                continue
            yield out


def interleaved_passes(args, systems, spec, failed):
    """Yield each timed pass of ``systems`` (no ``ov-*`` one) as a one-result list: every
    system in a :class:`common.KeptWorker` of its own (:func:`pass_worker`), kept running
    for the whole measurement; for each workload, ``args.repeats`` rounds of one pass per
    system, in reverse order every other round, :data:`PAUSE` seconds apart. So the systems
    take turns every few seconds, and a drift of the machine's speed reaches them alike. A
    system whose pass fails goes to ``failed`` and takes no further turn."""
    env = {"KERAS_BACKEND": "torch", "OMP_NUM_THREADS": str(args.threads)}
    workers = {system: common.KeptWorker(HERE, ["--pass-worker", json.dumps(
        dict(spec, system=system, run=os.path.abspath(args.run), batch=args.batch))], env)
        for system in systems}
    try:
        for index, (search, tokens, forced) in enumerate(WORKLOADS):
            for round_index in range(args.repeats):
                order = systems if round_index % 2 == 0 else systems[::-1]
                for system in (s for s in order if s in workers):
                    time.sleep(PAUSE)
                    out = workers[system].ask(index)
                    label = f"{system} {search} {tokens}{' forced' if forced else ''}"
                    if "error" in out:
                        print(f"    {label} failed: {out['error']}", flush=True)
                        failed.append(dict(system=system, **out))
                        workers.pop(system).close()
                        continue
                    print(f"... round {round_index + 1}/{args.repeats}: {label}: "
                          f"{out['seconds']} s", flush=True)
                    yield [out]
    finally:
        for worker in workers.values():
            worker.close()


def run_all(args):
    import torch

    timings, failed, openvino = {}, [], {}
    spec = dict(sentences=args.sentences, forced_sentences=args.forced_sentences)
    kept = [s for s in args.systems if not s.startswith("ov-")]
    passes = interleaved_passes(args, kept, spec, failed)
    rounds = worker_rounds(args, None, spec, failed,
                           [s for s in args.systems if s.startswith("ov-")])
    for out in itertools.chain(passes, rounds):
        for r in out:
            if "openvino" in r:  # per ov-* system: its IR, packages, CPU name, settings
                openvino[r["system"]] = r.pop("openvino")
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
               "protocol": "passes interleaved across kept worker processes",
               "results": results, "failed": failed}
    if openvino:
        payload["openvino"] = openvino
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
    if any(r["system"].startswith("ov-") for r in results):
        rows.append("\nov-*: optimum-intel's `generate` on the OpenVINO IR (ov-int8: NNCF's "
                    "8-bit weights, the CPU plugin's default dynamic quantization): beam 4 "
                    "ranks by log p / len^0.6 as CTranslate2 (ours: GNMT's ((5+len)/6)^0.6), "
                    "and finished sentences stay in the batch until it ends.")
    return "\n".join(rows)


# (rows, d_in, d_out): the fused query/key/value, the feed-forward's two, the output
# projection by the tied 8000-word table; 64 rows (greedy) and 256 (beam 4 of 64)
KERNEL_SHAPES = [(64, 256, 768), (64, 256, 512), (64, 512, 256), (64, 256, 8000),
                 (256, 256, 768), (256, 256, 8000)]


def shape_kernels(rows, d_in, d_out):
    """``{name: call}``: the kernels compared on one product shape."""
    import torch

    from transformerkit import internals
    from transformerkit.kernels import lowprec

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


ROW_COUNTS = (1, 4, 16, 64)
ROW_BUCKETS = ((1, 1), (2, 4), (5, 16), (17, 63), (64, 64))


def live_row_steps(lengths, batch):
    """``{"a-b": steps}``: how many decoding steps run with a live-row count in each bucket
    of :data:`ROW_BUCKETS`, when the sentences of each batch of ``batch`` leave it after their
    last token (``lengths``: output tokens per sentence, EOS included, in batch order)."""
    counts = {f"{a}-{b}": 0 for a, b in ROW_BUCKETS}
    for start in range(0, len(lengths), batch):
        chunk = lengths[start:start + batch]
        for step in range(max(chunk)):
            live = sum(length > step for length in chunk)
            a, b = next(bucket for bucket in ROW_BUCKETS if bucket[0] <= live <= bucket[1])
            counts[f"{a}-{b}"] += 1
    return counts


def rows_worker(spec):
    """One system: ms per output position at each of :data:`ROW_COUNTS` rows (forced
    tokens), and the live-row spread of its greedy decoding to EOS."""
    import transformerkit

    transformerkit.keep_freed_memory()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    batches, _, _, _ = decode.load_inputs(spec["run"], spec["sentences"], spec["batch"])
    tokens = spec["tokens"]
    forced = decoder(spec["run"], spec["system"], "greedy", tokens, True, threads)
    first = batches[0][1]
    per_position = {}
    for rows in ROW_COUNTS:
        ids = first[:rows]
        forced(ids)  # warm-up: packs the weights, builds the kernels
        times = []
        for _ in range(5):
            started = time.perf_counter()
            forced(ids)
            times.append(time.perf_counter() - started)
        per_position[rows] = 1000 * sorted(times)[2] / tokens
    to_eos = decoder(spec["run"], spec["system"], "greedy", 64, False, threads)
    to_eos(batches[-1][1])
    lengths, started = [], time.perf_counter()
    for _, ids in batches:
        lengths.extend(len(out) for out in to_eos(ids))
    seconds = time.perf_counter() - started
    eos_lengths = [min(length + 1, 64) for length in lengths]  # + its EOS, as decoded
    return dict(system=spec["system"], ms_per_position=per_position,
                to_eos_seconds=round(seconds, 3), sentences=len(lengths),
                live_row_steps=live_row_steps(eos_lengths, spec["batch"]))


def run_rows(args):
    import torch

    best, failed = {}, []
    spec = dict(sentences=args.sentences, tokens=args.row_tokens)
    for out in worker_rounds(args, "--rows-worker", spec, failed):
        kept = best.setdefault(out["system"], out)
        for rows, ms in out["ms_per_position"].items():
            kept["ms_per_position"][rows] = min(kept["ms_per_position"][rows], ms)
        kept["to_eos_seconds"] = min(kept["to_eos_seconds"], out["to_eos_seconds"])
    results = [best[s] for s in SYSTEMS if s in best]
    for r in results:
        r["ms_per_position"] = {k: round(v, 3) for k, v in r["ms_per_position"].items()}
    payload = {"machine": dict(common.machine(), threads=args.threads,
                               torch_version=torch.__version__),
               "run": os.path.abspath(args.run), "batch": args.batch,
               "tokens": args.row_tokens, "repeats": args.repeats, "results": results,
               "failed": failed}
    common.write_results(args.name + "_rows", payload, rows_table(results))


def rows_table(results):
    counts = [str(rows) for rows in ROW_COUNTS]
    buckets = [f"{a}-{b}" for a, b in ROW_BUCKETS]
    lines = ["| system | " + " | ".join(f"ms/position, {c} row{'' if c == '1' else 's'}"
                                        for c in counts)
             + " | greedy to EOS: s | steps by live rows (" + ", ".join(buckets) + ") |",
             "|---|" + "---:|" * (len(counts) + 1) + "---|"]
    for r in results:
        per = r["ms_per_position"]
        lines.append(f"| {r['system']} | " + " | ".join(str(per[c]) for c in counts)
                     + f" | {r['to_eos_seconds']} | "
                     + ", ".join(str(r["live_row_steps"][b]) for b in buckets) + " |")
    return "\n".join(lines)


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
                        help="rounds: timed passes of each system per workload, "
                             "interleaved (--rows: a process per system each); best kept")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per process, the same for every system (1)")
    parser.add_argument("--name", default="decode_precision",
                        help="results/NAME.{json,md} (default decode_precision)")
    parser.add_argument("--kernels", action="store_true",
                        help="time the products alone (-> results/NAME_kernels)")
    parser.add_argument("--rows", action="store_true",
                        help="the step's cost by live rows (-> results/NAME_rows)")
    parser.add_argument("--row-tokens", type=int, default=32,
                        help="forced output tokens of the --rows timings (32)")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help="comma-separated systems to run, of " + ", ".join(SYSTEMS)
                             + " (default: all but the ov-* ones, which need .venv-openvino)")
    parser.add_argument("--pass-worker", help=argparse.SUPPRESS)
    parser.add_argument("--rows-worker", help=argparse.SUPPRESS)
    parser.add_argument("--kernel-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; the systems are "
                     f"{', '.join(SYSTEMS)}")
    openvino = [s for s in args.systems if s.startswith("ov-")]
    if openvino and (args.rows or args.kernels):
        parser.error(f"--rows and --kernels do not cover {', '.join(openvino)}")
    if openvino and not (args.pass_worker or args.rows_worker or args.kernel_worker):
        openvino_peer.require_venv()
    if args.kernel_worker:
        print(json.dumps(kernel_timings(int(args.kernel_worker), capped=True)))
        return
    if args.kernels:
        run_kernels(args)
        return
    if args.pass_worker or args.rows_worker:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        if args.rows_worker:
            print(json.dumps(rows_worker(json.loads(args.rows_worker))))
        else:
            pass_worker(json.loads(args.pass_worker))
        return
    if args.run is None:
        parser.error("the run directory (RUN) is required")
    if args.rows:
        run_rows(args)
    else:
        run_all(args)


if __name__ == "__main__":
    main()
