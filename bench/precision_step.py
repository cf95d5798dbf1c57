"""float32 against mixed_bfloat16 training steps, paired in one process, timed in CPU time.

The small Multi30k Transformer of ``bench/train_step.py`` (3+3 layers, 8 heads, d_ff
2 x d_model, vocab 8000, tied embeddings) is built twice, once per precision, with the same
weights, and the two train alternately on the same length-bucketed Multi30k batches, one
step each in turn. Each step is timed by the CPU time of its thread (one PyTorch thread), so
that other processes on a shared machine, which delay a step's wall-clock time, do not
change the comparison; the report gives real target tokens per CPU-second of each precision
and the median of the per-step ratios (bfloat16 time over float32 time, on the same batch).

    python bench/precision_step.py                        # d_model 256 (the small model)
    python bench/precision_step.py --d-model 64,128,256   # where bfloat16 starts to pay

Writes ``bench/results/precision_step.FAMILY.{json,md}``.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "torch")
import common  # noqa: E402


def build(d_model, precision):
    """The Transformer of width ``d_model`` under ``precision``, compiled as the bench
    trains it; ``step(batch)`` trains on one ``(source, decoder_input, labels)`` batch."""
    import keras

    from transformerkit.models import Transformer
    from transformerkit.training import MaskedCrossEntropy, attach_train_step, paper_optimizer
    from transformerkit.training.precision import precision_policy

    keras.utils.set_random_seed(0)
    with precision_policy(precision):
        model = Transformer(8000, 8000, num_layers=3, d_model=d_model, num_heads=8,
                            d_ff=2 * d_model, max_length=256, tie_embeddings="all")
        model.compile(optimizer=paper_optimizer(d_model, 4000),
                      loss=MaskedCrossEntropy(label_smoothing=0.1))
    attach_train_step(model)

    def step(batch):
        source, decoder_input, labels = batch
        return model.train_on_batch((source, decoder_input), labels)

    return step


def compare(d_model, batches, rounds):
    """``rounds`` passes over ``batches``, alternating the two precisions step by step (the
    order flipped every other step); per-step thread CPU seconds of each."""
    steps = {p: build(d_model, p) for p in ("float32", "mixed_bfloat16")}
    for batch in batches:  # warm-up: every shape once
        for step in steps.values():
            step(batch)
    seconds = {p: [] for p in steps}
    order = list(steps)
    for i in range(rounds * len(batches)):
        batch = batches[i % len(batches)]
        for precision in (order if i % 2 == 0 else order[::-1]):
            start = time.thread_time()
            steps[precision](batch)
            seconds[precision].append(time.thread_time() - start)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d-model", default="256", help="comma-separated widths")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--name", default="precision_step")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    batches = common.multi30k_batches(args.batches)
    tokens = [common.real_target_tokens(b) for b in batches]
    rows = []
    for d_model in (int(d) for d in args.d_model.split(",")):
        seconds = compare(d_model, batches, args.rounds)
        step_tokens = tokens * args.rounds
        row = {"d_model": d_model, "steps": len(step_tokens)}
        for precision, times in seconds.items():
            row[f"{precision}_tokens_per_cpu_s"] = round(sum(step_tokens) / sum(times), 1)
        row["bfloat16_over_float32_time"] = round(statistics.median(
            b / f for b, f in zip(seconds["mixed_bfloat16"], seconds["float32"], strict=True)), 3)
        rows.append(row)
        print(row, flush=True)
    machine = common.machine()
    lines = ["| d_model | float32 tokens/CPU-s | mixed_bfloat16 tokens/CPU-s | speed-up "
             "(median per-step ratio) |", "|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['d_model']} | {r['float32_tokens_per_cpu_s']:,.0f} | "
                     f"{r['mixed_bfloat16_tokens_per_cpu_s']:,.0f} | "
                     f"{1 / r['bfloat16_over_float32_time']:.2f}x |")
    lines.append(f"\nOne PyTorch thread, thread CPU time; {args.batches} Multi30k batches of "
                 f"~4096 tokens x {args.rounds} rounds, warm-up pass excluded; the two "
                 "precisions alternate step by step.")
    common.write_results(args.name, {"machine": machine, "rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()
