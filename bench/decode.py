"""Decoding throughput: greedy and beam 4 with the key/value cache vs recomputation, on each
Keras backend, next to Hugging Face ``transformers`` ``generate`` on a Marian model of the
same size and CTranslate2 (float32 and int8) running the same trained weights through
``transformerkit export``, all in one invocation on this machine.

Inputs: the first ``--sentences`` German sentences of Multi30k test2016, encoded with the
run's tokenizer, sorted by length and cut into batches of ``--batch`` (64). Outputs are
forced to exactly 32 (or 64) tokens (``min_new_tokens = max_new_tokens``, the end token
forbidden before), so every system does the same work whatever its weights; the Marian
model (3+3 layers, d_model 256, 8 heads, d_ff 512, the run's vocabulary size, tied
embeddings, like ``configs/multi30k_de_en.yaml``) has random weights. Also measured: the
trained model decoding normally (stop at EOS, at most 64 tokens), with its BLEU.

Every system runs in processes of its own: transformerkit (per backend), Hugging Face and
CTranslate2 (float32 and int8) never share one. (CTranslate2 brings its own OpenMP runtime;
in the process of a PyTorch decoder its thread pool and PyTorch's compete for the same
cores: PyTorch's greedy decoding of 512 sentences took 2.7 s alone and 3.9 s once
CTranslate2 had run in the same process.) The measurement goes in ``--repeats``
rounds: each round starts one process per system, one after the other (in the reverse
order every other round, so that no system always runs first), which measures each
of that system's configurations once (after untimed warm-up batches, one per distinct batch
shape, so JAX/TensorFlow compile times are excluded and reported separately); each
configuration keeps its best round. All use the same number of CPU threads
(``--threads``, default 1). "recompute" reruns the decoder over the whole prefix every step
(the encoder once), as decoders without a cache (and keras-hub's samplers) do.

    python bench/decode.py --run runs/multi30k_de_en   # -> bench/results/decode.FAMILY.{json,md}
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.abspath(__file__)

# (system, search, output tokens, cache, forced length, sentences as a share of --sentences)
FULL, HALF, QUARTER, ONE_BATCH = 1.0, 0.5, 0.25, 0.0


def configs(backend):
    """What one worker measures on ``backend``; on torch also HF, in the same process."""
    plan = [("transformerkit", "greedy", 32, True, True, FULL),
            ("transformerkit", "beam4", 32, True, True, HALF)]
    if backend != "torch":
        return plan
    return plan + [
        ("ct2-float32", "greedy", 32, True, True, FULL),
        ("ct2-float32", "beam4", 32, True, True, HALF),
        ("ct2-int8", "greedy", 32, True, True, FULL),
        ("ct2-int8", "beam4", 32, True, True, HALF),
        ("hf", "greedy", 32, True, True, FULL),
        ("hf", "beam4", 32, True, True, HALF),
        ("transformerkit", "greedy", 32, "keras", True, HALF),
        ("transformerkit", "greedy", 32, False, True, QUARTER),
        ("hf", "greedy", 32, False, True, QUARTER),
        ("transformerkit", "beam4", 32, False, True, ONE_BATCH),
        ("transformerkit", "greedy", 64, True, True, HALF),
        ("hf", "greedy", 64, True, True, HALF),
        ("transformerkit", "greedy", 64, False, True, ONE_BATCH),
        ("hf", "greedy", 64, False, True, ONE_BATCH),
    ]


# the trained model decoding normally (stop at EOS), on all of test2016, with its BLEU
NATURAL = [(system, search, 64, True, False, FULL)
           for search in ("greedy", "beam4")
           for system in ("transformerkit", "ct2-float32", "ct2-int8")]


# -- worker side ------------------------------------------------------------------------------
def load_inputs(run_dir, sentences, batch):
    import numpy as np

    from transformerkit.data.corpora import load_multi30k
    from transformerkit.data.padding import pad_batch
    from transformerkit.data.tokenizers import load_tokenizer
    from transformerkit.run_directory import RunDirectory

    src_path, tgt_path = RunDirectory(run_dir).tokenizer_paths()
    source_tok, target_tok = load_tokenizer(src_path), load_tokenizer(tgt_path)
    sources, references = load_multi30k("test2016", "de", "en", data_dir=common.data_dir())
    sources, references = sources[:sentences], references[:sentences]
    encoded = [source_tok.encode(s, add_eos=True)[:64] for s in sources]
    order = np.argsort([len(e) for e in encoded], kind="stable")
    batches = []
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        batches.append((chunk, pad_batch([encoded[i] for i in chunk])))
    return batches, references, target_tok, source_tok.vocab_size


def transformerkit_decoder(run_dir, search, tokens, cache, forced, precision="float32"):
    """``decode(ids) -> [ids, ...]`` by the run's model: ``cache`` is the step
    (``use_cache``: True, ``"compiled"``, ``"keras"`` or False), ``precision`` its
    products'."""
    import transformerkit
    from transformerkit.decoding import beam_translate, greedy_translate

    model = transformerkit.load(run_dir).model  # as users load it (computes in float32)
    # no length cap relative to the source: forced runs decode exactly `tokens` tokens
    extra = dict(max_new_tokens=tokens, min_new_tokens=tokens if forced else 0, use_cache=cache,
                 max_len_a=None, max_len_b=None, precision=precision)
    if search == "greedy":
        return lambda ids: greedy_translate(model, ids, **extra)
    return lambda ids: [h[0].ids for h in beam_translate(model, ids, beam_size=4, **extra)]


def ctranslate2_decoder(run_dir, system, search, tokens, forced, threads):
    """CTranslate2 on the run's export (``transformerkit.export``; written on first use),
    float32 or int8 (``compute_type``), the same ids in and out as the other systems."""
    import ctranslate2

    import transformerkit
    from transformerkit.export.runtime import ensure_export

    run = transformerkit.load(run_dir)
    source_tok, target_tok = run.source_tokenizer, run.target_tokenizer
    translator = ctranslate2.Translator(ensure_export(run), intra_threads=threads,
                                        compute_type=system.split("-")[1])
    source_vocab = [source_tok.id_to_token(i) for i in range(source_tok.vocab_size)]
    target_ids = {target_tok.id_to_token(i): i for i in range(target_tok.vocab_size)}
    options = dict(beam_size=4 if search == "beam4" else 1, length_penalty=0.6,
                   max_decoding_length=tokens, min_decoding_length=tokens if forced else 1,
                   max_input_length=0, suppress_sequences=[["<pad>"], ["<s>"]])

    def decode(ids):
        # the export adds </s> to the source itself: pieces only (drop EOS and padding)
        source = [[source_vocab[i] for i in row if i not in (0, source_tok.eos_id)]
                  for row in ids.tolist()]
        found = translator.translate_batch(source, **options)
        return [[target_ids[t] for t in r.hypotheses[0]] for r in found]

    return decode


def hf_decoder(vocab, search, tokens, cache, forced):
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=256, encoder_layers=3,
        decoder_layers=3, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=512, decoder_ffn_dim=512, activation_function="relu",
        max_position_embeddings=256, pad_token_id=0, eos_token_id=2, decoder_start_token_id=1,
        forced_eos_token_id=None, scale_embedding=True, share_encoder_decoder_embeddings=True)
    model = MarianMTModel(config).eval()
    options = dict(max_new_tokens=tokens, min_new_tokens=tokens if forced else 0,
                   num_beams=4 if search == "beam4" else 1, do_sample=False, use_cache=cache)

    def decode(ids):
        ids = torch.from_numpy(ids.astype("int64"))
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=ids != 0, **options)
        return [row[1:].tolist() for row in out]

    return decode


def worker(spec):
    """Measure every configuration of ``spec`` once, after its warm-up (the rounds are
    separate processes, see the module docstring)."""
    import transformerkit  # the backend is chosen before keras is imported

    # the CLI's malloc setting, for every system alike
    transformerkit.keep_freed_memory()
    backend, run_dir, batch = spec["backend"], spec["run"], spec["batch"]
    results = []
    for system, search, tokens, cache, forced, share in spec["configs"]:
        count = 1000 if not forced else max(batch, int(spec["sentences"] * share))
        batches, references, target_tok, vocab = load_inputs(run_dir, count, batch)
        if system == "hf":
            decode = hf_decoder(vocab, search, tokens, cache, forced)
        elif system.startswith("ct2"):
            decode = ctranslate2_decoder(run_dir, system, search, tokens, forced,
                                         int(os.environ.get("OMP_NUM_THREADS", "1")))
        else:
            decode = transformerkit_decoder(run_dir, search, tokens, cache, forced)
        job = dict(system=system, backend=backend, search=search, tokens=tokens, cache=cache,
                   forced=forced, sentences=count)
        started, seen = time.perf_counter(), set()
        for _, ids in batches:  # warm-up: one batch per distinct shape (compiles on JAX/TF)
            shape = _bucket_shape(ids, backend)
            if shape not in seen:
                seen.add(shape)
                decode(ids)
        job["warmup_seconds"] = round(time.perf_counter() - started, 1)
        outputs = [None] * count
        started = time.perf_counter()
        for chunk, ids in batches:
            for i, out in zip(chunk, decode(ids), strict=True):
                outputs[i] = out
        job["seconds"] = round(time.perf_counter() - started, 2)
        job["mean_output_tokens"] = round(sum(map(len, outputs)) / len(outputs), 1)
        if not forced:
            from transformerkit.evaluation import corpus_scores

            hypotheses = [target_tok.decode(o) for o in outputs]
            job["bleu"] = corpus_scores(hypotheses, references)["bleu"]
        print(f"    {system} {search} {tokens} cache={cache}: {job['seconds']} s",
              file=sys.stderr, flush=True)
        results.append(job)
    return results


def _bucket_shape(ids, backend):
    if backend == "torch":
        return "one"  # eager: one warm-up batch is enough
    return (1 << (len(ids) - 1).bit_length(), -(-ids.shape[1] // 8) * 8)


# -- orchestration ----------------------------------------------------------------------------
def groups(backend):
    """The configurations of ``backend`` by system: each system measures in its own
    processes (on torch: transformerkit, Hugging Face, CTranslate2 float32 and int8)."""
    plan = configs(backend) + (NATURAL if backend == "torch" else [])
    systems = {}
    for config in plan:
        systems.setdefault(config[0], []).append(list(config))
    return systems


def _plan_position(result):
    """Where ``result``'s configuration stands in the plan (each configuration next to
    the same search of the other systems, as :func:`configs` lists them)."""
    backends = ["torch", "jax", "tensorflow"]
    backend = result["backend"]
    plan = configs(backend) + (NATURAL if backend == "torch" else [])
    key = (result["system"], result["search"], result["tokens"], result["cache"],
           result["forced"])
    index = next((i for i, c in enumerate(plan) if tuple(c[:5]) == key), len(plan))
    return (backends.index(backend) if backend in backends else 3, index)


def run_all(args):
    import torch

    threads = str(args.threads)
    timings, failed = {}, {}
    for round_index in range(args.repeats):
        for backend in [b for b in args.backends.split(",") if b]:
            env = {"KERAS_BACKEND": backend, "OMP_NUM_THREADS": threads,
                   "TF_NUM_INTRAOP_THREADS": threads, "TF_NUM_INTEROP_THREADS": "1",
                   "TF_CPP_MIN_LOG_LEVEL": "2",
                   "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false "
                                f"intra_op_parallelism_threads={threads}"}
            systems = list(groups(backend).items())
            if round_index % 2:  # every other round the other way round: no system always first
                systems.reverse()
            for system, plan in systems:
                spec = dict(backend=backend, configs=plan, batch=args.batch,
                            sentences=args.sentences, run=os.path.abspath(args.run))
                print(f"... round {round_index + 1}/{args.repeats}: {system} on {backend}, "
                      f"{len(plan)} configurations", flush=True)
                out = common.run_worker(HERE, ["--worker", json.dumps(spec)], env,
                                        timeout=7200)
                if isinstance(out, dict):  # {"error": ...}
                    print("    failed:", out, flush=True)
                    for c in plan:
                        failed[(backend, *map(str, c[:5]))] = dict(
                            system=c[0], backend=backend, search=c[1], tokens=c[2],
                            cache=c[3], forced=c[4], **out)
                    continue
                for r in out:
                    key = (backend, r["system"], r["search"], str(r["tokens"]), str(r["cache"]),
                           str(r["forced"]))
                    timings.setdefault(key, []).append(r)
                    print("    ", r, flush=True)
    results = []
    for runs in sorted(timings.values(), key=lambda runs: _plan_position(runs[0])):
        best = min(runs, key=lambda r: r["seconds"])
        results.append(dict(best, timings=[r["seconds"] for r in runs],
                            sentences_per_second=round(best["sentences"] / best["seconds"], 1)))
    results += [r for key, r in failed.items() if key not in timings]
    payload = {"machine": dict(common.machine(), threads=args.threads,
                               torch_version=torch.__version__),
               "batch": args.batch, "repeats": args.repeats, "results": results}
    common.write_results(args.name, payload, table(results))


def _find(results, **match):
    for r in results:
        if all(r.get(k) == v for k, v in match.items()) and "sentences_per_second" in r:
            return r["sentences_per_second"]
    return None


def table(results):
    rows = ["| system | backend | search | output tokens | cache | sentences/s | "
            "vs HF (same search, tokens, cache; measured side by side) | "
            "vs CTranslate2 float32 (same search and tokens) | BLEU |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "sentences_per_second" not in r:
            rows.append(f"| {r['system']} | {r['backend']} | {r['search']} | {r['tokens']} | "
                        f"{r['cache']} | failed: {r.get('error', '?')} | | | |")
            continue
        hf = _find(results, system="hf", search=r["search"], tokens=r["tokens"],
                   cache=bool(r["cache"]), forced=r["forced"])
        side_by_side = r["system"] != "hf" and r["backend"] == "torch"  # same rounds as HF
        ratio = f"{r['sentences_per_second'] / hf:.2f}x" if hf and side_by_side else ""
        ct2 = _find(results, system="ct2-float32", search=r["search"], tokens=r["tokens"],
                    cache=True, forced=r["forced"])
        vs_ct2 = f"{r['sentences_per_second'] / ct2:.2f}x" if ct2 and r["backend"] == \
            "torch" and r["cache"] is True and r["system"] != "ct2-float32" else ""
        tokens = f"{r['tokens']} forced" if r["forced"] else f"<= {r['tokens']} (EOS)"
        cache = {True: "yes", False: "no (recompute)", "keras": "yes (Keras layers)"}[
            r["cache"]]
        system = {"transformerkit": "transformerkit", "hf": "HF Marian generate",
                  "ct2-float32": "CTranslate2 float32", "ct2-int8": "CTranslate2 int8"}[
            r["system"]]
        rows.append(f"| {system} | {r['backend']} | {r['search']} | {tokens} | {cache} | "
                    f"{r['sentences_per_second']} | {ratio} | {vs_ct2} | {r.get('bleu', '')} |")
    cached = _find(results, system="transformerkit", backend="torch", search="greedy",
                   tokens=64, cache=True, forced=True)
    recomputed = _find(results, system="transformerkit", backend="torch", search="greedy",
                       tokens=64, cache=False, forced=True)
    if cached and recomputed:
        rows.append(f"\nCache vs recomputation at 64 output tokens (greedy, torch): "
                    f"{cached / recomputed:.1f}x")
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/multi30k_de_en",
                        help="run directory of a trained Multi30k de->en model")
    parser.add_argument("--sentences", type=int, default=512,
                        help="test2016 sentences for the forced-length runs (slow baselines "
                             "use fewer; the runs that stop at EOS use all 1000, for BLEU)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds (one process per system each); best is kept")
    parser.add_argument("--backends", default="torch,jax,tensorflow")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per process, the same for every system (1)")
    parser.add_argument("--name", default="decode",
                        help="results/NAME.{json,md} (default decode)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        if spec["backend"] == "torch":
            import torch

            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        print(json.dumps(worker(spec)))
        return
    run_all(args)


if __name__ == "__main__":
    main()
