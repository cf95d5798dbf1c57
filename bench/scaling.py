"""Data-parallel scaling on one host: ``transformerkit train configs/multi30k_de_en.yaml`` as
1 process x 2 threads against ``torchrun --nproc_per_node 2`` x 1 thread each (PyTorch, gloo
on CPU), interleaved, ``--steps`` optimizer steps each (checkpoints, BLEU and samples off).

Tokens/s = steps x data.tokens_per_batch (a batch's token budget, per process) x processes /
``train_seconds`` of ``metrics.json`` (the ``fit`` time: data preparation and the start of
the processes are not in it). Bytes all-reduced per step = the float32 gradient of every
trainable weight (what ``training/step.py: GradientAllReduce`` sums once per step). The
machine may be shared: the JSON records the load average before each run.

    python bench/scaling.py --steps 40 --rounds 1
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

import common
from common import data_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "multi30k_de_en.yaml")


def run(processes, threads, steps, out):
    settings = [f"train.max_steps={steps}", "train.bleu_every=null", "train.sample_every=null",
                "train.samples=0", "train.eval_max_sentences=1", "train.verbose=0",
                "train.checkpoint_every=null"]
    train = ["-m", "transformerkit", "train", CONFIG, "--out", out, "--data-dir", data_dir(),
             *[a for s in settings for a in ("--set", s)]]
    if processes > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                   str(processes), "--master_port", str(port), *train]
    else:
        command = [sys.executable, *train]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "KERAS_BACKEND": "torch"}
    load = os.getloadavg()[0]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=1800)
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    with open(os.path.join(out, "config.yaml")) as f:
        import yaml

        config = yaml.safe_load(f)
    tokens = metrics["steps"] * config["data"]["tokens_per_batch"] * processes
    return {"processes": processes, "threads": threads, "steps": metrics["steps"],
            "train_seconds": metrics["train_seconds"], "load_before": round(load, 2),
            "tokens_per_second": round(tokens / metrics["train_seconds"], 1), "run": out}


def gradient_bytes(out):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import math

    from transformerkit.saving import load_model

    model = load_model(os.path.join(out, "model.keras"), compile=False)
    return 4 * sum(math.prod(w.shape) for w in model.trainable_weights)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for processes, threads in ((1, 2), (2, 1)):  # interleaved
                out = os.path.join(tmp, f"r{i}-{processes}x{threads}")
                rows.append(run(processes, threads, args.steps, out))
                print(rows[-1], flush=True)
        grad = gradient_bytes(rows[-1]["run"])
    for row in rows:
        row.pop("run")
    result = {"machine": common.machine(), "config": "configs/multi30k_de_en.yaml",
              "steps": args.steps, "rows": rows, "gradient_bytes_all_reduced_per_step": grad}
    lines = ["| processes x threads | steps | train s | tokens/s | load before |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['processes']} x {r['threads']} | {r['steps']} | {r['train_seconds']} | "
              f"{r['tokens_per_second']:,.0f} | {r['load_before']} |" for r in rows]
    lines += ["", f"Gradient all-reduced per step (2 processes): {grad / 2**20:.1f} MiB "
              "(float32). `load before`: the 1-minute load average when the run started."]
    common.write_results("scaling", result, "\n".join(lines))

if __name__ == "__main__":
    main()
