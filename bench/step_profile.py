"""Where a training step's time goes, kernel by kernel: ours beside its peer, in one process.

    python bench/step_profile.py --pair small                       # ours vs HF Marian
    python bench/step_profile.py --pair gpt --nanogpt /tmp/nanogpt  # ours vs nanoGPT

Pairs (the models of the two step benches):

- ``small``: ``bench/train_step.py``'s small Multi30k Transformer (3+3 layers, 256 wide,
  vocabulary 8000) against its Hugging Face MarianMTModel, on the same 6 length-bucketed
  batches of about 4,096 target tokens;
- ``gpt``: nanoGPT's CPU recipe (4 layers, 4 heads, 128 wide, block 64, batch 12, dropout 0,
  AdamW with clipping): our GPT as ``bench/gpt_vs_nanogpt.py`` builds it against nanoGPT's
  ``model.py`` stepped as its ``train.py`` steps it (forward, backward, ``clip_grad_norm_``,
  ``optimizer.step``, ``zero_grad``), on 40 random tiny-Shakespeare blocks (ours reads the
  same characters shifted by its 4 reserved ids).

Both systems run in this process, on the PyTorch backend, with transformerkit's ``malloc``
setting (``keep_freed_memory()``, the equal-terms row of ``train_step.py``). After a warm-up
pass, ``--rounds`` rounds step through every batch with each system, every other round the
peer first (wall time per step, no profiler running); then ``torch.profiler`` records one
pass of each, and the report lists the kernels' self time per step side by side.

The last lines do the arithmetic of a speed goal ``--goal`` (ours' step time as a fraction of
the peer's: 1/1.2 for ``small``, 0.8 for ``gpt``, as ``bench`` issue goals state them): the
bound it sets in milliseconds, next to the time ours spends in matrix products alone and in
the kernels whose work both systems do alike (``SAME_WORK``: products, activation,
LayerNorm, softmax). Where those kernels alone exceed the bound, no saving of Python,
copies or element-wise passes reaches the goal with these kernels at this speed.
Writes ``bench/results/step_profile_{pair}.FAMILY.{json,md}``.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
            "mkldnn::_linear_pointwise"}
SAME_WORK = PRODUCTS | {
    "aten::gelu", "aten::gelu_backward", "aten::relu", "aten::clamp_min",
    "aten::threshold_backward", "aten::native_layer_norm", "aten::native_layer_norm_backward",
    "aten::_softmax", "aten::_softmax_backward_data", "aten::_log_softmax",
    "aten::_log_softmax_backward_data", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
GOALS = {"small": 1 / 1.2, "gpt": 0.8}


def small_pair():
    """``(ours_step, marian_step, ours_batches, marian_batches)`` of the small model."""
    import torch
    import train_step

    batches = common.multi30k_batches(6)
    _, ours = train_step.keras_model("small")
    _, marian = train_step.marian_model()
    tensors = [tuple(torch.from_numpy(a.astype("int64")) for a in b) for b in batches]
    return ("HF MarianMTModel", ours, marian, batches, tensors)


def gpt_pair(nanogpt, num_batches=40):
    """The mini-GPT pair on ``num_batches`` random blocks (nanoGPT's model from ``nanogpt``)."""
    import gpt_vs_nanogpt as bench
    import keras
    import numpy as np
    import torch

    recipe = bench.RECIPES["cpu"]
    chars, splits = bench.nanogpt_splits()
    ids = splits["train"].astype(np.int64)
    block, batch = recipe["block_size"], recipe["batch_size"]
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(ids) - block - 1, size=(num_batches, batch))
    blocks = [(np.stack([ids[i: i + block] for i in row]),
               np.stack([ids[i + 1: i + 1 + block] for i in row])) for row in starts]

    sys.path.insert(0, os.path.abspath(nanogpt))
    from model import GPT as NanoGPT
    from model import GPTConfig

    torch.manual_seed(1337)
    nano = NanoGPT(GPTConfig(block_size=block, vocab_size=len(chars), n_layer=recipe["n_layer"],
                             n_head=recipe["n_head"], n_embd=recipe["n_embd"],
                             dropout=recipe["dropout"], bias=False))
    optimizer = nano.configure_optimizers(bench.WEIGHT_DECAY, bench.LEARNING_RATE,
                                          (0.9, bench.BETA2), "cpu")

    def nano_step(pair):  # nanoGPT's train.py, one micro-step, float32 (no scaler at work)
        x, y = pair
        _, loss = nano(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(nano.parameters(), bench.GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    keras.utils.set_random_seed(1337)
    reserved = 4  # our character tokenizer's reserved ids come first
    model = bench.ours_model(recipe, len(chars) + reserved, recipe["iters"])

    def ours_step(pair):
        x, y = pair
        model.train_on_batch(x, y)

    ours_blocks = [((x + reserved).astype("int32"), (y + reserved).astype("int32"))
                   for x, y in blocks]
    torch_blocks = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in blocks]
    return ("nanoGPT", ours_step, nano_step, ours_blocks, torch_blocks)


def wall_times(ours, peer, ours_batches, peer_batches, rounds):
    """Seconds per step of each system: medians over ``rounds`` interleaved passes."""
    times = {"ours": [], "peer": []}
    jobs = {"ours": (ours, ours_batches), "peer": (peer, peer_batches)}
    for r in range(rounds):
        for name in (("ours", "peer") if r % 2 == 0 else ("peer", "ours")):
            step, batches = jobs[name]
            start = time.perf_counter()
            for batch in batches:
                step(batch)
            times[name].append((time.perf_counter() - start) / len(batches))
    return {name: statistics.median(values) for name, values in times.items()}, times


def kernel_times(step, batches):
    """Self CPU seconds per step of every operator over one profiled pass."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            step(batch)
    return {e.key: e.self_cpu_time_total / 1e6 / len(batches) for e in prof.key_averages()}


def report(pair, peer_name, walls, rounds, kernels, goal, top):
    ms = 1000
    ours_k, peer_k = kernels["ours"], kernels["peer"]
    names = sorted(set(ours_k) | set(peer_k), key=lambda k: -max(ours_k.get(k, 0),
                                                                  peer_k.get(k, 0)))
    lines = [f"| kernel | transformerkit ms/step | {peer_name} ms/step |", "|---|---:|---:|"]
    for name in names[:top]:
        lines.append(f"| `{name}` | {ms * ours_k.get(name, 0):.2f} | "
                     f"{ms * peer_k.get(name, 0):.2f} |")

    def total(k, subset=None):
        return sum(v for name, v in k.items() if subset is None or name in subset)

    lines += [f"| matrix products | {ms * total(ours_k, PRODUCTS):.2f} | "
              f"{ms * total(peer_k, PRODUCTS):.2f} |",
              f"| the same-work kernels | {ms * total(ours_k, SAME_WORK):.2f} | "
              f"{ms * total(peer_k, SAME_WORK):.2f} |",
              f"| all kernels (profiled) | {ms * total(ours_k):.2f} | {ms * total(peer_k):.2f} |",
              f"| **step, wall (no profiler)** | **{ms * walls['ours']:.2f}** | "
              f"**{ms * walls['peer']:.2f}** |"]
    bound = goal * walls["peer"]
    products, same = total(ours_k, PRODUCTS), total(ours_k, SAME_WORK)
    per_round = ", ".join(f"{o / p:.2f}x"
                          for o, p in zip(rounds["ours"], rounds["peer"], strict=True))
    ratio = statistics.median(o / p for o, p in zip(rounds["ours"], rounds["peer"], strict=True))
    lines.append(
        f"\nOurs takes {ratio:.2f}x the {peer_name} step's time (the median over "
        f"{len(rounds['ours'])} interleaved passes of the ratio in each; pass by pass "
        f"{per_round}). "
        f"A goal of {goal:.2f}x its time bounds our step to {ms * bound:.2f} ms; ours spends "
        f"{ms * products:.2f} ms ({products / bound:.0%} of that bound) in matrix products "
        f"alone and {ms * same:.2f} ms ({same / bound:.0%}) in the kernels whose work both do "
        f"alike (products, activation, LayerNorm, softmax; `SAME_WORK`). Kernel times are "
        f"the profiler's self CPU time per step over one pass, which adds its own overhead "
        f"to every operator; work outside PyTorch's operators (Python, and NumPy drawing "
        f"transformerkit's dropout bits) shows only in the wall time.")
    payload = {"machine": common.machine(), "pair": pair, "peer": peer_name, "goal": goal,
               "ours_over_peer": ratio,
               "wall_seconds_per_step": walls, "passes": rounds,
               "kernel_seconds_per_step": kernels, "bound_seconds": bound,
               "ours_products_seconds": products, "ours_same_work_seconds": same}
    common.write_results(f"step_profile_{pair}", payload, "\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=("small", "gpt"), default="small")
    parser.add_argument("--nanogpt", help="a nanoGPT checkout (for --pair gpt)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--goal", type=float, help="ours / peer step time to test "
                        "(default: 1/1.2 for small, 0.8 for gpt)")
    parser.add_argument("--top", type=int, default=15, help="kernels listed")
    args = parser.parse_args()
    if args.pair == "gpt" and not (args.nanogpt and os.path.isfile(
            os.path.join(args.nanogpt, "model.py"))):
        parser.error("--pair gpt needs --nanogpt DIR, a nanoGPT checkout with its model.py "
                     "(git clone https://github.com/karpathy/nanoGPT)")
    os.environ["KERAS_BACKEND"] = "torch"
    import transformerkit

    transformerkit.keep_freed_memory()  # both systems: the equal-terms setting
    import torch

    torch.set_num_threads(args.threads)
    peer_name, ours, peer, ours_batches, peer_batches = (
        small_pair() if args.pair == "small" else gpt_pair(args.nanogpt))
    for step, batches in ((ours, ours_batches), (peer, peer_batches)):  # warm-up
        for batch in batches:
            step(batch)
    walls, rounds = wall_times(ours, peer, ours_batches, peer_batches, args.rounds)
    kernels = {"ours": kernel_times(ours, ours_batches), "peer": kernel_times(peer, peer_batches)}
    report(args.pair, peer_name, walls, rounds, kernels, args.goal or GOALS[args.pair], args.top)


if __name__ == "__main__":
    main()
