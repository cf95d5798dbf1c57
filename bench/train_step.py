"""Training-step throughput: transformerkit on each Keras backend vs Hugging Face Marian.

Everything runs in one invocation on this machine, on the same length-bucketed Multi30k
de->en batches of about 4096 target tokens (shared BPE vocabulary of 8000):

(a) the classic small Multi30k Transformer (3+3 layers, d_model 256, 8 heads, d_ff 512,
    tied embeddings) on torch, jax and tensorflow, next to ``transformers``' MarianMTModel of
    the same size trained eagerly with torch.optim.Adam;
(b) the paper's base model (6+6, 512, 8 heads, 2048, shared vocabulary 37000) on the default
    backend, next to this machine's float32 matmul peak measured in the same run.

Marian runs twice: as its users run it, and with the glibc ``malloc`` setting that
``transformerkit train`` applies (``transformerkit.keep_freed_memory()``, applied to our
workers here too), to show how much of our lead is that setting, which any PyTorch program
can adopt. With ``mixed_bfloat16`` in ``--precision``, Marian also runs under
``torch.autocast("cpu", dtype=torch.bfloat16)`` with that setting (PyTorch's own mixed
precision: the equal-terms peer of our bfloat16 step), and the base model gets a bfloat16
row, set against the bfloat16 matmul peak measured in the same run.

Reported: real (non-padding) target tokens per second of forward+backward+update, and the
achieved GFLOP/s of the matrix products actually computed (padded shapes, 3x forward; the
output layer of transformerkit's PyTorch step at the real label positions only).

    python bench/train_step.py            # writes bench/results/train_step.FAMILY.{json,md}
    python bench/train_step.py --batches 6 --repeats 1 --rounds 3  # `make bench`: medians
    python bench/train_step.py --precision float32,mixed_bfloat16   # + a bf16 row (small model)
    python bench/train_step.py --backends torch --batches 6 --repeats 2 --rounds 7 \
        --name train_step_torch   # the equal-terms ratio over more rounds

With several rounds the report also prints the equal-terms ratio (ours over Marian with the
same allocator setting) as the ratio of the systems' medians and as the median of the
per-round ratios.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MARIAN_AUTOCAST = "HF Marian + malloc setting, torch.autocast bfloat16"
SMALL = dict(layers=3, d_model=256, heads=8, d_ff=512, vocab=8000)
BASE = dict(layers=6, d_model=512, heads=8, d_ff=2048, vocab=37000)


def keras_model(size, precision="float32"):
    """transformerkit's model of ``size`` (``SMALL``/``BASE``), compiled as the bench trains
    it; ``step(batch)`` trains on one ``(source, decoder_input, labels)`` batch of arrays."""
    import keras

    from transformerkit.models import Transformer
    from transformerkit.training import MaskedCrossEntropy, attach_train_step, paper_optimizer

    spec = SMALL if size == "small" else BASE
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(precision)  # float32 | mixed_bfloat16 (train.precision)
    model = Transformer(spec["vocab"], spec["vocab"], num_layers=spec["layers"],
                        d_model=spec["d_model"], num_heads=spec["heads"], d_ff=spec["d_ff"],
                        max_length=256, tie_embeddings="all")
    model.compile(optimizer=paper_optimizer(spec["d_model"], 4000),
                  loss=MaskedCrossEntropy(label_smoothing=0.1))
    attach_train_step(model)

    def step(batch):
        source, decoder_input, labels = batch
        return model.train_on_batch((source, decoder_input), labels)

    return model, step


def keras_worker(size, num_batches, repeats, precision="float32"):
    import transformerkit

    transformerkit.keep_freed_memory()  # as `transformerkit train` does
    import keras
    import numpy as np

    from transformerkit import fastpath

    spec = SMALL if size == "small" else BASE
    batches = common.multi30k_batches(num_batches)
    model, step = keras_model(size, precision)
    # transformerkit's PyTorch step projects to the vocabulary at the real label positions
    # only (training/step.py: TrainStep.real_label_positions); count the products it computes
    labels_only = fastpath.applies() and model.takes_logit_positions
    return _time_steps(step, batches, repeats, spec, keras.backend.backend(), np,
                       output_on_labels_only=labels_only)


def marian_model(autocast=False):
    """Hugging Face's MarianMTModel of the small size with torch.optim.Adam and the same
    label-smoothed loss, trained eagerly as its users train it; ``step(batch)`` trains on one
    ``(source, decoder_input, labels)`` batch of int64 torch tensors. ``autocast``: forward
    and loss under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (float32 weights and
    Adam state, as PyTorch's mixed-precision recipe)."""
    import contextlib

    import torch
    from transformers import MarianConfig, MarianMTModel

    spec = SMALL
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=spec["vocab"], decoder_vocab_size=spec["vocab"], d_model=spec["d_model"],
        encoder_layers=spec["layers"], decoder_layers=spec["layers"],
        encoder_attention_heads=spec["heads"], decoder_attention_heads=spec["heads"],
        encoder_ffn_dim=spec["d_ff"], decoder_ffn_dim=spec["d_ff"], dropout=0.1,
        attention_dropout=0.0, activation_dropout=0.0, activation_function="relu",
        max_position_embeddings=256, pad_token_id=0, eos_token_id=2, decoder_start_token_id=1,
        scale_embedding=True, share_encoder_decoder_embeddings=True)
    model = MarianMTModel(config)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)

    def step(batch):
        source, decoder_input, labels = batch
        with (torch.autocast("cpu", dtype=torch.bfloat16) if autocast
              else contextlib.nullcontext()):
            logits = model(input_ids=source, attention_mask=source != 0,
                           decoder_input_ids=decoder_input,
                           decoder_attention_mask=decoder_input != 0).logits
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return model, step


def marian_worker(num_batches, repeats, allocator=False, autocast=False):
    import numpy as np
    import torch

    if allocator:  # the same glibc malloc setting transformerkit's CLI applies
        from transformerkit.allocator import keep_freed_memory

        keep_freed_memory()
    batches = common.multi30k_batches(num_batches)
    model, step = marian_model(autocast)
    tensors = [tuple(torch.from_numpy(a.astype("int64")) for a in b) for b in batches]
    result = _time_steps(step, tensors, repeats, SMALL, "torch (eager)", np,
                         numpy_batches=batches)
    result["attention"] = getattr(model.config, "_attn_implementation", "unknown")
    return result


def _time_steps(step, batches, repeats, spec, backend, np, numpy_batches=None,
                output_on_labels_only=False):
    numpy_batches = numpy_batches or batches
    for batch in batches:  # warm-up: every shape once (JAX/TF compile per shape)
        step(batch)
    start = time.perf_counter()
    for _ in range(repeats):
        for batch in batches:
            step(batch)
    seconds = time.perf_counter() - start
    tokens = repeats * sum(common.real_target_tokens(b) for b in numpy_batches)
    flops = repeats * sum(common.transformer_flops(b, spec["layers"], spec["d_model"],
                                                   spec["d_ff"], spec["vocab"],
                                                   output_on_labels_only=output_on_labels_only)
                          for b in numpy_batches)
    return {"backend": backend, "steps": repeats * len(batches), "seconds": round(seconds, 2),
            "target_tokens_per_s": round(tokens / seconds, 1),
            "gflops_per_s": round(flops / seconds / 1e9, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=("keras", "marian"))
    parser.add_argument("--size", choices=("small", "base"), default="small")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--base-batches", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backends", default="torch,jax,tensorflow")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the small-model systems this many times, one after the "
                             "other, and report each one's median (the machine's speed drifts "
                             "between minutes)")
    parser.add_argument("--name", default="train_step",
                        help="results/NAME.{json,md} (default train_step)")
    parser.add_argument("--allocator", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--autocast", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="float32",
                        help="comma-separated dtype policies (float32, mixed_bfloat16); each "
                             "one after the first adds a small-model row on the first backend")
    args = parser.parse_args()
    if args.worker == "keras":
        print(json.dumps(keras_worker(args.size, args.batches, args.repeats, args.precision)))
        return
    if args.worker == "marian":
        print(json.dumps(marian_worker(args.batches, args.repeats, args.allocator,
                                       args.autocast)))
        return

    common.multi30k_batches(args.batches)  # build the shared batches once
    script = os.path.abspath(__file__)
    rounds = [small_model_rows(args, script, reverse=bool(i % 2)) for i in range(args.rounds)]
    rows = [median_row([r[i] for r in rounds]) for i in range(len(rounds[0]))]
    peak = round(common.matmul_peak(), 1)
    bf16 = "mixed_bfloat16" in args.precision.split(",")
    peak_bf16 = round(common.matmul_peak(dtype="bfloat16"), 1) if bf16 else None
    common.multi30k_batches(args.base_batches)
    for precision in ["float32"] + (["mixed_bfloat16"] if bf16 else []):
        r = common.run_worker(script, ["--worker", "keras", "--size", "base", "--batches",
                                       str(args.base_batches), "--repeats", "1",
                                       "--precision", precision],
                              {"KERAS_BACKEND": "torch"})
        rows.append({"system": "transformerkit (torch)" + (
            f", {precision}" if precision != "float32" else ""), "model": "base",
            **({"precision": precision} if precision != "float32" else {}), **r})
        print(rows[-1], flush=True)
    write_report(args, rows, rounds, peak, peak_bf16)


def median_row(runs):
    """The run with the median tokens/s of one system over the rounds (all listed)."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    good.sort(key=lambda r: r["target_tokens_per_s"])
    return {**good[(len(good) - 1) // 2],
            "rounds_tokens_per_s": [r.get("target_tokens_per_s") for r in runs]}


def small_model_rows(args, script, reverse=False):
    """One round: every backend, the extra precisions, Marian and Marian + our malloc, each
    in a process of its own; ``reverse``: in the opposite order (the rounds alternate, so
    that on a machine whose speed drifts no system always runs first). Returns the rows in
    the forward order."""
    sizes = ["--batches", str(args.batches), "--repeats", str(args.repeats)]
    first = args.backends.split(",")[0]
    jobs = [(f"transformerkit ({backend})", ["--worker", "keras", *sizes],
             {"KERAS_BACKEND": backend}, {}) for backend in args.backends.split(",")]
    jobs += [(f"transformerkit ({first}, {precision})",
              ["--worker", "keras", *sizes, "--precision", precision],
              {"KERAS_BACKEND": first}, {"precision": precision})
             for precision in args.precision.split(",")[1:]]
    jobs += [("HF transformers MarianMTModel", ["--worker", "marian", *sizes], None, {}),
             ("HF Marian + transformerkit's malloc setting",
              ["--worker", "marian", "--allocator", *sizes], None, {})]
    if "mixed_bfloat16" in args.precision.split(","):
        jobs.append((MARIAN_AUTOCAST, ["--worker", "marian", "--allocator", "--autocast", *sizes],
                     None, {"precision": "autocast bfloat16"}))
    rows = {}
    for system, arguments, env, extra in (jobs[::-1] if reverse else jobs):
        r = common.run_worker(script, arguments, env)
        rows[system] = {"system": system, "model": "small", **extra, **r}
        print(rows[system], flush=True)
    return [rows[system] for system, *_ in jobs]


def write_report(args, rows, rounds, peak, peak_bf16=None):
    marian = next((r for r in rows if r["system"] == "HF transformers MarianMTModel"
                   and "error" not in r), None)
    lines = ["| model | system | target tokens/s | GFLOP/s | vs Marian | % of matmul peak |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['system']} | error: {r['error']} | | | |")
            continue
        ratio = (f"{r['target_tokens_per_s'] / marian['target_tokens_per_s']:.2f}x"
                 if marian and r["model"] == "small" else "")
        low = r.get("precision") in ("mixed_bfloat16", "autocast bfloat16") and peak_bf16
        share = (f"{100 * r['gflops_per_s'] / peak_bf16:.0f}% (bfloat16)" if low
                 else f"{100 * r['gflops_per_s'] / peak:.0f}%")
        lines.append(f"| {r['model']} | {r['system']} | {r['target_tokens_per_s']:,.0f} | "
                     f"{r['gflops_per_s']:.1f} | {ratio} | {share} |")
    lines.append(bfloat16_summary(rows))
    bf16_peak = (f"; bfloat16 matmul peak (same shape): {peak_bf16} GFLOP/s"
                 if peak_bf16 else "")
    lines.append(f"\nfloat32 matmul peak (torch, 2048x2048): {peak} GFLOP/s{bf16_peak}. "
                 f"small = 3+3 layers, d_model 256, 8 heads, d_ff 512, vocab 8000; "
                 f"base = 6+6, 512, 8 heads, 2048, vocab 37000. Batches: "
                 f"{args.batches} (small) / {args.base_batches} (base) Multi30k batches of "
                 "~4096 tokens, warm-up pass excluded.")
    if args.rounds > 1:
        index = {r["system"]: i for i, r in enumerate(rounds[0])}
        ours, peer = index.get("transformerkit (torch)"), index.get("HF transformers MarianMTModel")
        per_round = [f"{r[ours]['target_tokens_per_s'] / r[peer]['target_tokens_per_s']:.2f}x"
                     for r in rounds if ours is not None and peer is not None
                     and "error" not in r[ours] and "error" not in r[peer]]
        allocator = index.get("HF Marian + transformerkit's malloc setting")
        equal = [r[ours]["target_tokens_per_s"] / r[allocator]["target_tokens_per_s"]
                 for r in rounds if ours is not None and allocator is not None
                 and "error" not in r[ours] and "error" not in r[allocator]]
        per_round_equal = [f"{x:.2f}x" for x in equal]
        lines.append(f"Small model: the median of {args.rounds} rounds per system (each round "
                     "runs every system once, one after the other, every other round in the "
                     "reverse order); transformerkit (torch) against Marian round by round: "
                     f"{', '.join(per_round)}; against Marian with the same malloc setting: "
                     f"{', '.join(per_round_equal)}.")
        if equal:
            by_system = {r["system"]: r for r in rows if r["model"] == "small"}
            ratio = (by_system["transformerkit (torch)"]["target_tokens_per_s"]
                     / by_system["HF Marian + transformerkit's malloc setting"]
                     ["target_tokens_per_s"])
            lines.append(f"Equal terms (transformerkit (torch) over Marian with the same malloc "
                         f"setting): {ratio:.3f}x by the systems' medians; the median of the "
                         f"per-round ratios {statistics.median(equal):.3f}x.")
    common.write_results(args.name, {"machine": common.machine(), "matmul_peak_gflops": peak,
                                     "matmul_peak_bfloat16_gflops": peak_bf16,
                                     "rows": rows}, "\n".join(lines))


def bfloat16_summary(rows):
    """The bfloat16 goals in one line: our small-model bfloat16 step over our float32 step
    and over Marian under autocast (both with the malloc setting); "" without those rows."""
    small = {r["system"]: r for r in rows if r["model"] == "small" and "error" not in r}
    ours_bf16 = next((r for s, r in small.items() if s.endswith("mixed_bfloat16)")), None)
    ours = next((r for s, r in small.items() if s.startswith("transformerkit (")
                 and "precision" not in r), None)
    peer = small.get(MARIAN_AUTOCAST)
    if not (ours_bf16 and ours and peer):
        return ""
    tps = "target_tokens_per_s"
    return (f"\nbfloat16 small step: {ours_bf16[tps] / ours[tps]:.2f}x our float32 step, "
            f"{ours_bf16[tps] / peer[tps]:.2f}x Marian under torch.autocast bfloat16 (same "
            "malloc setting).")


if __name__ == "__main__":
    main()
