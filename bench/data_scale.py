"""Data at scale: a 4.5-million-pair corpus (WMT14 en-de's size) through the token cache.

Builds a synthetic parallel corpus deterministically by recombining Multi30k de-en pairs
(1 to 3 consecutive-in-rng pairs joined, so sentences are about WMT-long; no download),
then, each step in its own process (peak RSS from ``getrusage``):

1. **prepare**: stream the corpus, train the BPE tokenizer on a ``data.tokenizer_sample``
   sample, encode everything into the token cache (times, pairs/s, cache size, peak RSS);
2. **train, second run**: a new run on the cached corpus, a few steps: seconds from process
   start to the datasets being ready (imports included) and peak RSS;
3. **train, Multi30k**: the same model on Multi30k (29,000 pairs), for the RSS comparison.

Targets on 2 cores: prepared <= 10 min, second run ready <= 30 s, training RSS within 2 GB
of Multi30k's.

    python bench/data_scale.py --pairs 200000 --name data_scale_small   # development
    python bench/data_scale.py                                          # 4.5M pairs
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MODEL = {"num_layers": 2, "d_model": 64, "num_heads": 4, "d_ff": 128, "dropout": 0.1,
         "max_length": 256}


def build_corpus(folder, pairs, seed=0):
    """Write ``folder/train.{de,en}``: ``pairs`` lines, each 1-3 Multi30k train pairs joined
    (the same choice on both sides), drawn from ``seed``. Returns the two paths."""
    import numpy as np

    from transformerkit.data.corpora import load_multi30k

    de, en = load_multi30k("train", "de", "en", data_dir=common.data_dir(), download=False)
    rng = np.random.default_rng(seed)
    paths = [os.path.join(folder, f"train.{lang}") for lang in ("de", "en")]
    with open(paths[0], "w", encoding="utf-8") as fde, \
            open(paths[1], "w", encoding="utf-8") as fen:
        for start in range(0, pairs, 100_000):
            n = min(100_000, pairs - start)
            counts = rng.integers(1, 4, n)
            picks = rng.integers(0, len(de), (n, 3))
            fde.write("".join(" ".join(de[j] for j in row[:c]) + "\n"
                              for row, c in zip(picks.tolist(), counts.tolist(), strict=True)))
            fen.write("".join(" ".join(en[j] for j in row[:c]) + "\n"
                              for row, c in zip(picks.tolist(), counts.tolist(), strict=True)))
    return paths


def config_for(source, target, cache_dir, steps, sample):
    data = {"tokenizer": "bpe", "vocab_size": 8000, "tokens_per_batch": 4096,
            "cache_dir": cache_dir, "tokenizer_sample": sample}
    if source:
        data.update(dataset="files", train_files=[{"source": source, "target": target}])
    else:
        data.update(dataset="multi30k", data_dir=common.data_dir())
    return {"model": MODEL, "data": data,
            "train": {"epochs": 1, "max_steps": steps, "verbose": 0, "samples": 0,
                      "eval_max_sentences": 1}}


def worker(mode, config_path, run_dir):
    """In a fresh process: ``prepare`` (prepare_data only) or ``train`` (a few steps);
    prints one JSON line."""
    started = time.monotonic()
    import logging

    from transformerkit.config import resolve

    with open(config_path) as f:
        config = resolve(json.load(f))
    out = {}
    if mode == "prepare":
        from transformerkit.training.data_setup import prepare_data

        data = prepare_data(config, run_dir)
        out.update({k: data.info[k] for k in ("train_pairs", "tokenizer_seconds",
                                               "token_cache_seconds", "token_cache")})
        out["batches"] = len(data.train)
    else:
        from transformerkit.training.trainer import train

        class DataReady(logging.Handler):  # the trainer logs "train_pairs" once data is ready
            def emit(self, record):
                if record.args and record.args[0] == "train_pairs" and "ready_s" not in out:
                    out["ready_s"] = round(time.monotonic() - started, 2)

        logger = logging.getLogger("transformerkit")
        logger.setLevel(logging.INFO)
        logger.addHandler(DataReady())
        metrics = train(config, run_dir)
        out.update(steps=metrics["steps"], train_pairs=metrics["train_pairs"],
                   token_cache=metrics.get("token_cache"))
    out["seconds"] = round(time.monotonic() - started, 2)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out))


def run_step(mode, config, work, name):
    config_path = os.path.join(work, f"{name}.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    run_dir = os.path.join(work, f"run-{name}")
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "torch"))
    started = time.monotonic()
    result = subprocess.run([sys.executable, __file__, "--worker", mode, config_path, run_dir],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{result.stderr[-3000:]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["wall_s"] = round(time.monotonic() - started, 2)
    print(name, out, flush=True)
    return out


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder)
               for f in files)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--sample", type=int, default=1_000_000,
                        help="data.tokenizer_sample (pairs)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--work", default="/tmp/transformerkit-data-scale")
    parser.add_argument("--name", default="data_scale")
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "CONFIG", "RUN"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker)

    os.makedirs(args.work, exist_ok=True)
    cache = os.path.join(args.work, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    started = time.monotonic()
    source, target = build_corpus(args.work, args.pairs)
    corpus = {"pairs": args.pairs, "seconds_to_write": round(time.monotonic() - started, 1),
              "bytes": os.path.getsize(source) + os.path.getsize(target)}
    print("corpus", corpus, flush=True)
    big = config_for(source, target, cache, args.steps, args.sample)
    prepare = run_step("prepare", big, args.work, "prepare")
    second = run_step("train", big, args.work, "second-run")
    small_cache = os.path.join(args.work, "cache-multi30k")
    shutil.rmtree(small_cache, ignore_errors=True)
    multi30k = run_step("train", config_for(None, None, small_cache, args.steps, args.sample),
                        args.work, "multi30k")
    cache_bytes = folder_bytes(cache)
    payload = {"machine": common.machine(), "corpus": corpus, "model": MODEL,
               "tokenizer_sample": args.sample, "prepare": prepare, "second_run": second,
               "multi30k": multi30k, "cache_bytes": cache_bytes,
               "encode_pairs_per_s": round(prepare["train_pairs"]
                                           / max(prepare["token_cache_seconds"], 1e-9))}
    rss_gap = second["peak_rss_mb"] - multi30k["peak_rss_mb"]
    rows = [
        ("corpus", f"{args.pairs:,} pairs, {corpus['bytes'] / 2**20:,.0f} MiB of text"),
        ("tokenizer (sample of "
         f"{min(args.sample, args.pairs):,} pairs, BPE 8000)", f"{prepare['tokenizer_seconds']} s"),
        ("encoding into the cache", f"{prepare['token_cache_seconds']} s "
                                    f"({payload['encode_pairs_per_s']:,} pairs/s)"),
        ("prepared in (process wall, target <= 600 s)", f"{prepare['wall_s']} s"),
        ("cache size", f"{cache_bytes / 2**20:,.0f} MiB"),
        ("peak RSS, preparing", f"{prepare['peak_rss_mb']:,.0f} MiB"),
        ("second run: data ready (from process start, target <= 30 s)",
         f"{second['ready_s']} s"),
        (f"peak RSS, training {args.steps} steps", f"{second['peak_rss_mb']:,.0f} MiB"),
        (f"peak RSS, same model on Multi30k, {args.steps} steps",
         f"{multi30k['peak_rss_mb']:,.0f} MiB (gap {rss_gap:,.0f} MiB, target <= 2048)"),
    ]
    table = "\n".join(["| measure | value |", "|---|---|", *[f"| {a} | {b} |" for a, b in rows]])
    common.write_results(args.name, payload, table)


if __name__ == "__main__":
    main()
