"""Decoding throughput: greedy and beam 4 with the key/value cache vs recomputation, on each
Keras backend, next to Hugging Face ``transformers`` ``generate`` on a Marian model of the
same size, all in one invocation on this machine.

Inputs: the first ``--sentences`` German sentences of Multi30k test2016, encoded with the
run's tokenizer, sorted by length and cut into batches of ``--batch`` (64). Outputs are
forced to exactly 32 (or 64) tokens (``min_new_tokens = max_new_tokens``, the end token
forbidden before), so every system does the same work whatever its weights; the Marian
model (3+3 layers, d_model 256, 8 heads, d_ff 512, the run's vocabulary size, tied
embeddings, like ``configs/multi30k_de_en.yaml``) has random weights. Also measured: the
trained model decoding normally (stop at EOS, at most 64 tokens), with its BLEU.

Each configuration runs in a fresh subprocess per backend, with the same number of CPU
threads (``--threads``, default 1) for every system; untimed warm-up batches come first
(one per distinct batch shape, so JAX/TensorFlow compile times are excluded and reported
separately), then ``--repeats`` timed passes of which the best is kept (the machine is
shared, and other people's load comes and goes). "recompute" reruns the decoder over the
whole prefix every step (the encoder once), as decoders without a cache (and keras-hub's
samplers) do.

    python bench/decode.py --run runs/multi30k_de_en   # -> bench/results/decode.{json,md}
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.abspath(__file__)

# (system, backend, search, tokens, cache, forced, sentences as a fraction of --sentences)
FULL, PART, SMALL = 1.0, 0.5, 0.25


def jobs(backends):
    plan = []
    for backend in backends:
        main = backend == "torch"
        plan += [("transformerkit", backend, "greedy", 32, True, True, FULL),
                 ("transformerkit", backend, "beam4", 32, True, True, PART if main else SMALL)]
        if main:
            plan += [("transformerkit", backend, "greedy", 32, "keras", True, PART),
                     ("transformerkit", backend, "greedy", 32, False, True, SMALL),
                     ("transformerkit", backend, "beam4", 32, False, True, SMALL),
                     ("transformerkit", backend, "greedy", 64, True, True, PART),
                     ("transformerkit", backend, "greedy", 64, False, True, SMALL),
                     ("transformerkit", backend, "greedy", 64, False, False, FULL),
                     ("transformerkit", backend, "beam4", 64, True, False, FULL)]
    plan += [("hf", "torch", "greedy", 32, True, True, FULL),
             ("hf", "torch", "beam4", 32, True, True, PART),
             ("hf", "torch", "greedy", 32, False, True, SMALL),
             ("hf", "torch", "greedy", 64, True, True, PART),
             ("hf", "torch", "greedy", 64, False, True, SMALL)]
    return plan


# -- worker side ------------------------------------------------------------------------------
def load_inputs(run_dir, sentences, batch):
    import numpy as np

    from transformerkit.data.corpora import load_multi30k
    from transformerkit.data.tokenizers import load_tokenizer
    from transformerkit.training.data_setup import tokenizer_paths

    src_path, tgt_path = tokenizer_paths(run_dir, os.path.exists(
        os.path.join(run_dir, "tokenizer.json")))
    source_tok, target_tok = load_tokenizer(src_path), load_tokenizer(tgt_path)
    sources, references = load_multi30k("test2016", "de", "en", data_dir=common.data_dir())
    sources, references = sources[:sentences], references[:sentences]
    encoded = [source_tok.encode(s, add_eos=True)[:64] for s in sources]
    order = np.argsort([len(e) for e in encoded], kind="stable")
    batches = []
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        ids = np.zeros((len(chunk), max(len(encoded[i]) for i in chunk)), "int32")
        for row, i in enumerate(chunk):
            ids[row, : len(encoded[i])] = encoded[i]
        batches.append((chunk, ids))
    return batches, references, target_tok, source_tok.vocab_size


def transformerkit_decoder(run_dir, search, tokens, cache, forced):
    from transformerkit.decoding import beam_translate, greedy_translate
    from transformerkit.saving import load_model

    model = load_model(os.path.join(run_dir, "model.keras"), compile=False)
    extra = dict(max_new_tokens=tokens, min_new_tokens=tokens if forced else 0, use_cache=cache)
    if search == "greedy":
        return lambda ids: greedy_translate(model, ids, **extra)
    return lambda ids: [h[0].ids for h in beam_translate(model, ids, beam_size=4, **extra)]


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
    system, backend, search, tokens, cache, forced, sentences = (
        spec[k] for k in ("system", "backend", "search", "tokens", "cache", "forced",
                          "sentences"))
    import transformerkit  # noqa: F401  (backend choice before keras)

    batches, references, target_tok, vocab = load_inputs(spec["run"], sentences, spec["batch"])
    if system == "hf":
        decode = hf_decoder(vocab, search, tokens, cache, forced)
    else:
        decode = transformerkit_decoder(spec["run"], search, tokens, cache, forced)
    started = time.perf_counter()
    seen = set()
    for _, ids in batches:  # warm-up: one batch per distinct shape (compiles on JAX/TF)
        shape = _bucket_shape(ids, backend)
        if shape not in seen:
            seen.add(shape)
            decode(ids)
    warmup = time.perf_counter() - started
    outputs = [None] * sum(len(c) for c, _ in batches)
    timings = []
    for _ in range(spec["repeats"]):  # best of N: this machine is shared, others' load varies
        started = time.perf_counter()
        for chunk, ids in batches:
            for i, out in zip(chunk, decode(ids), strict=True):
                outputs[i] = out
        timings.append(time.perf_counter() - started)
    seconds = min(timings)
    result = dict(spec, seconds=[round(t, 2) for t in timings],
                  warmup_seconds=round(warmup, 1),
                  sentences_per_second=round(len(outputs) / seconds, 1),
                  mean_output_tokens=round(sum(map(len, outputs)) / len(outputs), 1))
    if system == "transformerkit" and not forced:
        from transformerkit.evaluation import corpus_scores

        hypotheses = [target_tok.decode(o) for o in outputs]
        result["bleu"] = corpus_scores(hypotheses, references)["bleu"]
    return result


def _bucket_shape(ids, backend):
    if backend == "torch":
        return "one"  # eager: one warm-up batch is enough
    return (1 << (len(ids) - 1).bit_length(), -(-ids.shape[1] // 8) * 8)


# -- orchestration ----------------------------------------------------------------------------
def run_all(args):
    import torch

    backends = [b for b in args.backends.split(",") if b]
    results = []
    for system, backend, search, tokens, cache, forced, part in jobs(backends):
        sentences = 1000 if not forced else max(args.batch, int(args.sentences * part))
        spec = dict(system=system, backend=backend, search=search, tokens=tokens, cache=cache,
                    forced=forced, sentences=sentences, batch=args.batch,
                    repeats=args.repeats if forced else 1, run=os.path.abspath(args.run))
        threads = str(args.threads)
        env = {"KERAS_BACKEND": backend, "OMP_NUM_THREADS": threads,
               "TF_NUM_INTRAOP_THREADS": threads, "TF_NUM_INTEROP_THREADS": "1",
               "TF_CPP_MIN_LOG_LEVEL": "2",
               "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false "
                            f"intra_op_parallelism_threads={threads}"}
        print(f"... {system} {backend} {search} {tokens} tokens cache={cache} "
              f"forced={forced}", flush=True)
        out = common.run_worker(HERE, ["--worker", json.dumps(spec)], env, timeout=3600)
        print("    ", out, flush=True)
        results.append(out if "error" not in out else dict(spec, **out))
    payload = {"machine": dict(common.machine(), threads=args.threads,
                               torch_version=torch.__version__),
               "batch": args.batch, "repeats": args.repeats, "results": results}
    common.write_results("decode", payload, table(results))


def _find(results, **match):
    for r in results:
        if all(r.get(k) == v for k, v in match.items()) and "sentences_per_second" in r:
            return r["sentences_per_second"]
    return None


def table(results):
    rows = ["| system | backend | search | output tokens | cache | sentences/s | "
            "vs HF (same search, tokens, cache) | BLEU |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "sentences_per_second" not in r:
            rows.append(f"| {r['system']} | {r['backend']} | {r['search']} | {r['tokens']} | "
                        f"{r['cache']} | failed: {r.get('error', '?')} | | |")
            continue
        hf = _find(results, system="hf", search=r["search"], tokens=r["tokens"],
                   cache=bool(r["cache"]), forced=r["forced"])
        ratio = f"{r['sentences_per_second'] / hf:.2f}x" if hf and r["system"] != "hf" else ""
        tokens = f"{r['tokens']} forced" if r["forced"] else f"<= {r['tokens']} (EOS)"
        cache = {True: "yes", False: "no (recompute)", "keras": "yes (Keras layers)"}[
            r["cache"]]
        system = "transformerkit" if r["system"] == "transformerkit" else "HF Marian generate"
        rows.append(f"| {system} | {r['backend']} | {r['search']} | {tokens} | {cache} | "
                    f"{r['sentences_per_second']} | {ratio} | {r.get('bleu', '')} |")
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
                        help="test2016 sentences for the forced-length runs (the runs that "
                             "stop at EOS use all 1000, for BLEU)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; best is kept")
    parser.add_argument("--backends", default="torch,jax,tensorflow")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per process, the same for every system (1)")
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
