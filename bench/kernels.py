"""The kernel choices of the PyTorch shortcuts, each measured against its alternative.

Three choices in ``transformerkit.layers`` are made by measurement on CPU, and this script
makes them again on the machine it runs on, both sides interleaved in one process (every
repeat times A then B, or B then A, alternating; medians of the repeats):

- attention core (``layers/attention.py: EXPLICIT_MAX_KEYS``): PyTorch's fused
  ``scaled_dot_product_attention`` against the explicit formula (``return_scores``: the
  same code path the library takes for short keys), forward+backward and forward only, on
  padded (masked) and causal self-attention at 8 heads of 32, at the key lengths of
  Multi30k-sized batches (about 4,000 tokens) and beyond;
- softmax over short rows (``kernels/softmax.py``): ``torch.softmax`` against the
  same rows padded with -inf to 16 entries, forward and forward+backward;
- dropout masks (``layers/dropout.py: keep_mask``): ``rand_like(x) >= rate`` scaled,
  against the SFC64 mask, per million elements.

    python bench/kernels.py            # -> bench/results/kernels.FAMILY.{json,md}
"""

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def paired(a, b, repeats, inner=3):
    """Median seconds of ``a`` and of ``b`` over ``repeats`` interleaved timings (each the
    mean of ``inner`` calls), after one warm-up call each."""
    a(), b()
    times = {0: [], 1: []}
    for r in range(repeats):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            f = (a, b)[which]
            start = time.perf_counter()
            for _ in range(inner):
                f()
            times[which].append((time.perf_counter() - start) / inner)
    return statistics.median(times[0]), statistics.median(times[1])


def attention_rows(repeats):
    import torch

    from transformerkit.layers import attention

    rows = []
    tokens, heads, dim = 4096, 8, 32
    for keys in (8, 11, 16, 21, 31, 48, 64, 96, 128, 256):
        batch = max(1, tokens // keys)
        for kind in ("padded", "causal"):
            for backward in (True, False):
                x = [torch.randn(batch, keys, heads, dim, requires_grad=backward)
                     for _ in range(3)]
                mask = None
                if kind == "padded":
                    mask = torch.ones(batch, keys, keys, dtype=torch.bool)
                    mask[::3, :, keys - max(1, keys // 5):] = False
                upstream = torch.randn(batch, keys, heads, dim)

                def run(explicit, x=x, mask=mask, upstream=upstream, backward=backward):
                    def step():
                        with torch.set_grad_enabled(backward):
                            if explicit:
                                out = attention.scaled_dot_product_attention(
                                    *x, mask=mask, is_causal=mask is None,
                                    return_scores=True)[0]
                            else:
                                out = attention._fused_attention(
                                    *x, _open_rows(mask), 1 / math.sqrt(dim), mask is None)
                            if backward:
                                out.backward(upstream)
                                for t in x:
                                    t.grad = None
                    return step

                fused, explicit = paired(run(False), run(True), repeats)
                rows.append(dict(keys=keys, batch=batch, kind=kind, backward=backward,
                                 fused_ms=round(fused * 1e3, 3),
                                 explicit_ms=round(explicit * 1e3, 3),
                                 ratio=round(explicit / fused, 3)))
                print(rows[-1], flush=True)
    return rows


def _open_rows(mask):
    """The mask as ``scaled_dot_product_attention`` passes it to the kernel (b, 1, q, k)."""
    if mask is None:
        return None
    return mask.unsqueeze(1)


def softmax_rows(repeats):
    import torch
    import torch.nn.functional as F

    def plain(t):
        return t.softmax(-1)

    def padded(t):
        length = t.shape[-1]
        return F.pad(t, (0, 16 - length), value=float("-inf")).softmax(-1)[..., :length]

    rows = []
    for length in (2, 3, 4, 8, 11, 15):
        count = max(1, (1 << 22) // (length * length))
        x = torch.randn(count, length, length)
        xg = x.clone().requires_grad_()

        def forward(fn, x=x):
            return lambda: fn(x)

        def both(fn, xg=xg):
            def step():
                fn(xg).sum().backward()
                xg.grad = None
            return step

        plain_fwd, padded_fwd = paired(forward(plain), forward(padded), repeats)
        plain_both, padded_both = paired(both(plain), both(padded), repeats)
        rows.append(dict(length=length, rows=count * length,
                         plain_ms=round(plain_fwd * 1e3, 3), padded_ms=round(padded_fwd * 1e3, 3),
                         plain_backward_ms=round(plain_both * 1e3, 3),
                         padded_backward_ms=round(padded_both * 1e3, 3)))
        print(rows[-1], flush=True)
    return rows


def dropout_rows(repeats):
    import torch

    from transformerkit.layers.dropout import keep_mask

    rows = []
    for rate in (0.1, 0.3):
        x = torch.randn(4096, 256)
        old, new = paired(lambda x=x, r=rate: torch.rand_like(x).ge_(r).mul_(1 / (1 - r)),
                          lambda x=x, r=rate: keep_mask(x, r), repeats)
        per_million = 1e6 / x.numel()
        rows.append(dict(rate=rate, elements=x.numel(),
                         rand_like_ms_per_million=round(old * 1e3 * per_million, 3),
                         keep_mask_ms_per_million=round(new * 1e3 * per_million, 3)))
        print(rows[-1], flush=True)
    return rows


def report(args, attention_results, softmax_results, dropout_results):
    lines = ["### Attention core: explicit formula / fused kernel (time ratio; < 1: explicit "
             "faster)", "",
             "| keys | batch | padded, fwd+bwd | causal, fwd+bwd | padded, fwd | causal, fwd |",
             "|---:|---:|---:|---:|---:|---:|"]
    by_keys = {}
    for r in attention_results:
        by_keys.setdefault((r["keys"], r["batch"]), {})[(r["kind"], r["backward"])] = r
    for (keys, batch), cells in by_keys.items():
        values = [cells[c] for c in (("padded", True), ("causal", True), ("padded", False),
                                     ("causal", False))]
        lines.append(f"| {keys} | {batch} | " + " | ".join(
            f"{v['ratio']:.2f} ({v['explicit_ms']:.1f} / {v['fused_ms']:.1f} ms)"
            for v in values) + " |")
    lines += ["", "8 heads of 32, about 4,096 query positions per batch. The library takes "
              "the explicit formula up to `EXPLICIT_MAX_KEYS` keys on eager PyTorch.", "",
              "### Softmax over rows of `length` entries: torch.softmax vs padded to 16", "",
              "| length | rows | plain, fwd | padded, fwd | plain, fwd+bwd | padded, fwd+bwd |",
              "|---:|---:|---:|---:|---:|---:|"]
    for r in softmax_results:
        cells = [r["plain_ms"], r["padded_ms"], r["plain_backward_ms"], r["padded_backward_ms"]]
        lines.append(f"| {r['length']} | {r['rows']:,} | " + " | ".join(
            f"{c:.3f} ms" for c in cells) + " |")
    lines += ["", "### Dropout masks, ms per million elements", "",
              "| rate | rand_like >= rate | keep_mask (SFC64) |", "|---:|---:|---:|"]
    for r in dropout_results:
        lines.append(f"| {r['rate']} | {r['rand_like_ms_per_million']:.2f} | "
                     f"{r['keep_mask_ms_per_million']:.2f} |")
    lines.append(f"\nMedians of {args.repeats} interleaved repeats, {args.threads} threads.")
    common.write_results("kernels", {"machine": common.machine(), "threads": args.threads,
                                     "repeats": args.repeats,
                                     "attention": attention_results,
                                     "softmax": softmax_results, "dropout": dropout_results},
                         "\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import torch

    import transformerkit

    transformerkit.keep_freed_memory()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    report(args, attention_rows(args.repeats), softmax_rows(args.repeats),
           dropout_rows(args.repeats))


if __name__ == "__main__":
    main()
