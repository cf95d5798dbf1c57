"""Our mini-GPT against nanoGPT on tiny Shakespeare, same recipe, same data, same machine.

Recipes (nanoGPT's ``config/train_shakespeare_char.py`` plus command-line overrides):

- ``cpu``: nanoGPT README's CPU run: 4 layers, 4 heads, 128 wide, block 64, batch 12,
  dropout 0, lr 1e-3 (warmup 100, cosine to 1e-4 at ``--iters``), AdamW betas (0.9, 0.99),
  weight decay 0.1 on matrices, gradient clip 1.0, 2000 iterations, 20 evaluation batches
  every 250 iterations. Both models are nanoGPT's architecture: pre-LayerNorm, GELU,
  learned positions, tied input/output embeddings, no biases (``bias=False``,
  ``use_bias=False`` here), GPT-2 initialisation.
- ``baby``: the config file's "baby GPT": 6 layers, 6 heads, 384 wide, block 256, batch 64,
  dropout 0.2, the same optimizer; a few hundred iterations (it is ~100x the work per step).

Both systems read the same character split (the first 90% of ``input.txt`` for training,
as nanoGPT's ``data/shakespeare_char/prepare.py``), which this script writes itself in
nanoGPT's format (``train.bin``/``val.bin`` uint16, ``meta.pkl``) to a temporary folder, so
nanoGPT runs without internet. Each system runs in its own subprocess, one after the other.

Measured: milliseconds per training iteration (median over iterations without an
evaluation), the training-loop wall time (evaluations included, as nanoGPT's own ``time``
column), train/val loss at each evaluation (the mean over ``--eval-iters`` random batches,
as nanoGPT's ``estimate_loss``), and the loop time each system needs to reach nanoGPT's
final validation loss. Twenty random batches estimate a loss to about +-0.02, so both final
models are also scored on the whole validation split (every non-overlapping block, the same
blocks for both: "full val loss"); for nanoGPT that is its last checkpoint (``ckpt.pt``,
written at each evaluation that improved on the best). With ``--nanogpt``, runs go
nanoGPT, ours, nanoGPT, ..., ours, nanoGPT, and each of ours is compared with the mean of
the two nanoGPT runs around it: this shared machine's speed drifts by 10-30% over minutes
(one earlier 3-run pairing put ours at 0.77x of the nanoGPT run before it while nanoGPT's
own in-process step had become 1.5x faster). Writes
``results/gpt_vs_nanogpt[_RECIPE].FAMILY.{json,md}``.

Usage:
    python bench/gpt_vs_nanogpt.py --nanogpt /tmp/nanogpt              # cpu recipe, 2000 its
    python bench/gpt_vs_nanogpt.py --recipe baby --iters 200 --nanogpt /tmp/nanogpt
    python bench/gpt_vs_nanogpt.py --iters 20                          # ours only, a smoke run

``--nanogpt DIR`` is a nanoGPT checkout (``git clone https://github.com/karpathy/nanoGPT``);
without it only our side runs. ``--jit`` also runs ours with ``jit_compile=True``
(``torch.compile`` on the PyTorch backend; compile time counts in the loop time).

bfloat16 (CPUs with AVX512-BF16 or AMX-BF16): ``--precision float32,mixed_bfloat16`` runs
ours once per precision in each run (``train.precision``), and ``--nanogpt-autocast`` also
runs nanoGPT under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (its ``train.py`` uses
autocast on GPUs only; the bench runs a copy whose ``ctx`` line applies it on the CPU too,
with ``--dtype=bfloat16``: the equal-terms peer). The report then sets the time each
system needs to reach nanoGPT's (float32) validation loss against nanoGPT's, run by run:

    python bench/gpt_vs_nanogpt.py --nanogpt /tmp/nanogpt --nanogpt-autocast \
        --precision float32,mixed_bfloat16 --runs 2 --name gpt_vs_nanogpt_bfloat16
"""

import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import data_dir, machine, write_results  # noqa: E402

RECIPES = {
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, dropout=0.0,
                iters=2000, eval_interval=250),
    "baby": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, dropout=0.2,
                 iters=200, eval_interval=100),
}
# config/train_shakespeare_char.py (the parts the command line does not override)
LEARNING_RATE, MIN_LR, WARMUP, BETA2, WEIGHT_DECAY, GRAD_CLIP = 1e-3, 1e-4, 100, 0.99, 0.1, 1.0


def read_text():
    path = os.path.join(data_dir(), "tinyshakespeare", "input.txt")
    if not os.path.isfile(path):
        sys.exit(f"tiny Shakespeare not found at {path}; set TRANSFORMERKIT_DATA")
    with open(path, encoding="utf-8") as f:
        return f.read()


def nanogpt_splits():
    """nanoGPT's character ids of tiny Shakespeare: ``(chars, {"train": ids, "val": ids})``,
    the first 90% for training (as its data/shakespeare_char/prepare.py)."""
    data = read_text()
    chars = sorted(set(data))
    stoi = {ch: i for i, ch in enumerate(chars)}
    n = len(data)
    return chars, {name: np.array([stoi[c] for c in part], dtype=np.uint16)
                   for name, part in (("train", data[: int(n * 0.9)]),
                                      ("val", data[int(n * 0.9):]))}


def prepare_nanogpt_data(folder):
    """nanoGPT's data/shakespeare_char/prepare.py, without the download."""
    chars, splits = nanogpt_splits()
    stoi = {ch: i for i, ch in enumerate(chars)}
    target = os.path.join(folder, "data", "shakespeare_char")
    os.makedirs(target, exist_ok=True)
    for name, ids in splits.items():
        ids.tofile(os.path.join(target, f"{name}.bin"))
    with open(os.path.join(target, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return target


# -- nanoGPT ----------------------------------------------------------------------------------

_EVAL = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
_ITER = re.compile(r"^iter (\d+): loss ([\d.]+), time ([\d.]+)ms")


def validation_blocks(tokens, block_size):
    """Every non-overlapping block of ``tokens``: ``(x, y)`` int arrays ``(n, block_size)``."""
    n = (len(tokens) - 1) // block_size
    x = np.asarray(tokens[: n * block_size]).reshape(n, block_size)
    y = np.asarray(tokens[1: n * block_size + 1]).reshape(n, block_size)
    return x, y


_NANOGPT_SCORE = """
import json, sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
from model import GPT, GPTConfig
ckpt = torch.load(sys.argv[2], map_location="cpu")
model = GPT(GPTConfig(**ckpt["model_args"]))
model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
model.eval()
tokens = np.fromfile(sys.argv[3], dtype=np.uint16).astype(np.int64)
block = int(sys.argv[4])
n = (len(tokens) - 1) // block
x = torch.from_numpy(tokens[: n * block].reshape(n, block))
y = torch.from_numpy(tokens[1: n * block + 1].reshape(n, block))
total = 0.0
with torch.no_grad():
    for i in range(0, n, 64):
        _, loss = model(x[i: i + 64], y[i: i + 64])
        total += float(loss) * len(x[i: i + 64])
print(json.dumps({"full_val_loss": total / n, "checkpoint_iter": int(ckpt["iter_num"])}))
"""


def score_nanogpt(nanogpt, work, block_size):
    """nanoGPT's last checkpoint on every validation block (its own model code)."""
    command = [sys.executable, "-c", _NANOGPT_SCORE, os.path.abspath(nanogpt),
               os.path.join(work, "out", "ckpt.pt"),
               os.path.join(work, "data", "shakespeare_char", "val.bin"), str(block_size)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return {"full_val_error": result.stderr.strip()[-500:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


NANOGPT_CPU_CONTEXT = "ctx = nullcontext() if device_type == 'cpu' else "
NANOGPT_AUTOCAST = "nanoGPT (autocast bfloat16)"


def autocast_train_script(nanogpt, work):
    """A copy of nanoGPT's ``train.py`` in ``work`` that runs the CPU under autocast too:
    its ``ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(...)`` line
    loses the CPU exception (nothing else changes; ``model.py`` is linked beside it)."""
    with open(os.path.join(nanogpt, "train.py")) as f:
        source = f.read()
    if NANOGPT_CPU_CONTEXT not in source:
        raise SystemExit(f"{nanogpt}/train.py: no line starting {NANOGPT_CPU_CONTEXT!r} to "
                         "patch for --nanogpt-autocast (a different nanoGPT version?)")
    path = os.path.join(work, "train_autocast.py")
    with open(path, "w") as f:
        f.write(source.replace(NANOGPT_CPU_CONTEXT, "ctx = "))
    return path


def run_nanogpt(nanogpt, recipe, args, work, autocast=False):
    """Run nanoGPT's own train.py in ``work`` (which holds data/shakespeare_char);
    ``autocast``: the copy from ``autocast_train_script``, with ``--dtype=bfloat16``."""
    system = NANOGPT_AUTOCAST if autocast else "nanoGPT"
    for name in ("configurator.py", "config", "model.py"):  # read relative to the cwd
        link = os.path.join(work, name)
        if not os.path.exists(link):
            os.symlink(os.path.join(os.path.abspath(nanogpt), name), link)
    flags = ["--device=cpu", "--compile=False", f"--eval_iters={args.eval_iters}",
             "--log_interval=1", f"--block_size={recipe['block_size']}",
             f"--batch_size={recipe['batch_size']}", f"--n_layer={recipe['n_layer']}",
             f"--n_head={recipe['n_head']}", f"--n_embd={recipe['n_embd']}",
             f"--max_iters={args.iters}", f"--lr_decay_iters={args.iters}",
             f"--dropout={recipe['dropout']}", f"--eval_interval={args.eval_interval}",
             f"--out_dir={os.path.join(work, 'out')}", "--dataset=shakespeare_char"]
    script = os.path.join(os.path.abspath(nanogpt), "train.py")
    if autocast:
        script = autocast_train_script(nanogpt, work)
        flags.append("--dtype=bfloat16")
    command = [sys.executable, script, "config/train_shakespeare_char.py", *flags]
    print("nanoGPT:", " ".join(command[1:]), flush=True)
    started = time.perf_counter()
    result = subprocess.run(command, cwd=work, capture_output=True, text=True)
    process_seconds = time.perf_counter() - started
    if result.returncode != 0:
        return {"system": system, "error": result.stderr.strip()[-2000:]}
    times, evals_at = {}, []
    for line in result.stdout.splitlines():
        if m := _ITER.match(line):
            times[int(m.group(1))] = float(m.group(3)) / 1000
        elif m := _EVAL.match(line):
            evals_at.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
    steps = [times[i] for i in sorted(times) if i % args.eval_interval and i > 0]
    per_iter = statistics.median(steps) if steps else float("nan")
    evals = []
    for it, train_loss, val_loss in evals_at:
        # the time of iteration ``it`` includes its evaluation, then one training step
        before = sum(t for i, t in times.items() if i < it)
        evals.append({"iter": it, "seconds": round(before + times.get(it, 0.0) - per_iter, 3),
                      "train_loss": train_loss, "val_loss": val_loss})
    return {"system": system, "ms_per_iter": round(1000 * per_iter, 2),
            "loop_seconds": round(sum(times.values()), 2),
            "process_seconds": round(process_seconds, 2), "iterations": len(times),
            "evals": evals, "final_val_loss": evals[-1]["val_loss"] if evals else None,
            **score_nanogpt(nanogpt, work, recipe["block_size"])}


# -- ours (in a subprocess: --worker) ---------------------------------------------------------

def run_ours(recipe_name, args, jit, precision="float32"):
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--recipe", recipe_name,
               "--iters", str(args.iters), "--eval-interval", str(args.eval_interval),
               "--eval-iters", str(args.eval_iters), *(["--jit"] if jit else []),
               "--precision", precision]
    env = dict(os.environ)
    env.setdefault("KERAS_BACKEND", args.backend)
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    process_seconds = time.perf_counter() - started
    label = (f"transformerkit ({env['KERAS_BACKEND']}{', jit' if jit else ''}"
             f"{'' if precision == 'float32' else ', ' + precision})")
    if result.returncode != 0:
        return {"system": label, "error": result.stderr.strip()[-2000:]}
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    payload.update(system=label, process_seconds=round(process_seconds, 2))
    return payload


def ours_model(recipe, vocab_size, iters, jit=False):
    """Our GPT with nanoGPT's architecture and optimizer for ``recipe``, compiled (the
    schedule spans ``iters`` iterations)."""
    from transformerkit.models import GPT
    from transformerkit.training import MaskedCrossEntropy, attach_train_step
    from transformerkit.training.gpt_recipe import gpt_optimizer

    model = GPT(vocab_size, num_layers=recipe["n_layer"], d_model=recipe["n_embd"],
                num_heads=recipe["n_head"], d_ff=4 * recipe["n_embd"],
                max_length=recipe["block_size"], dropout=recipe["dropout"],
                tie_embeddings="all", use_bias=False)
    model.compile(optimizer=gpt_optimizer(LEARNING_RATE, WARMUP, iters, MIN_LR, beta_2=BETA2,
                                          weight_decay=WEIGHT_DECAY, clip_norm=GRAD_CLIP),
                  loss=MaskedCrossEntropy(0.0), jit_compile=bool(jit))
    attach_train_step(model)
    return model


def worker(recipe, args):
    """Train our GPT with nanoGPT's recipe; print one JSON line."""
    import keras

    import transformerkit  # picks the backend before keras is imported

    transformerkit.keep_freed_memory()  # as `transformerkit train` does
    from transformerkit.data.pipeline import LanguageModelBatches, split_train_val
    from transformerkit.data.tokenizers import CharTokenizer
    from transformerkit.training import masked_cross_entropy

    keras.utils.set_random_seed(1337)
    keras.config.set_dtype_policy(args.precision)  # as train.precision does
    train_text, val_text = split_train_val(read_text(), 0.1)
    tokenizer = CharTokenizer.train([train_text])  # 65 characters + 4 reserved ids
    train_ids = np.asarray(tokenizer.encode(train_text), "int32")
    val_ids = np.asarray(tokenizer.encode(val_text), "int32")
    block, batch = recipe["block_size"], recipe["batch_size"]
    model = ours_model(recipe, tokenizer.vocab_size, args.iters, args.jit)
    interval = args.eval_interval
    train = LanguageModelBatches(train_ids, block, batch, steps_per_epoch=interval, seed=0)
    train_eval = LanguageModelBatches(train_ids, block, batch, args.eval_iters, seed=1)
    val_eval = LanguageModelBatches(val_ids, block, batch, args.eval_iters, seed=2)

    class Clock(keras.callbacks.Callback):
        """Per-step times and, every ``interval`` steps, train/val loss (as estimate_loss)."""

        def __init__(self):
            super().__init__()
            self.steps, self.evals, self.start = [], [], None

        def evaluate(self, iteration):
            losses = [self.model.evaluate(data, verbose=0) for data in (train_eval, val_eval)]
            self.evals.append({"iter": iteration,
                               "seconds": round(time.perf_counter() - self.start, 3),
                               "train_loss": round(float(losses[0]), 4),
                               "val_loss": round(float(losses[1]), 4)})
            print(f"step {iteration}: train loss {losses[0]:.4f}, val loss {losses[1]:.4f}",
                  file=sys.stderr, flush=True)

        def on_train_begin(self, logs=None):
            self.start = time.perf_counter()
            self.evaluate(0)

        def on_train_batch_begin(self, batch, logs=None):
            self.step_start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append(time.perf_counter() - self.step_start)

        def on_epoch_end(self, epoch, logs=None):
            self.evaluate((epoch + 1) * interval)

    clock = Clock()
    epochs = max(1, args.iters // interval)
    model.fit(train, epochs=epochs, callbacks=[clock], shuffle=False, verbose=0)
    loop_seconds = time.perf_counter() - clock.start
    settled = clock.steps[5:] or clock.steps  # the first steps compile / warm up
    x, y = validation_blocks(val_ids, block)
    total = 0.0
    for i in range(0, len(x), 64):
        logits = model.predict_on_batch(x[i: i + 64])
        total += float(masked_cross_entropy(y[i: i + 64], logits)) * len(x[i: i + 64])
    print(json.dumps({
        "ms_per_iter": round(1000 * statistics.median(settled), 2),
        "loop_seconds": round(loop_seconds, 2), "iterations": len(clock.steps),
        "first_step_seconds": round(clock.steps[0], 2), "evals": clock.evals,
        "final_val_loss": clock.evals[-1]["val_loss"], "full_val_loss": total / len(x),
        "parameters": model.count_params(),
        "vocab_size": tokenizer.vocab_size}))


# -- report -----------------------------------------------------------------------------------

def time_to_reach(result, target):
    """Loop seconds at the first evaluation with val loss <= ``target`` (None if never)."""
    for entry in result.get("evals", []):
        if entry["val_loss"] <= target:
            return entry["seconds"]
    return None


def full_validation_verdict(results):
    """Per system, over the runs: its full-validation loss and loop time against the
    nanoGPT runs around it (both after the same iterations); None without nanoGPT's score."""
    lines = []
    for system in dict.fromkeys(r["system"] for r in results
                                if not r["system"].startswith("nanoGPT")):
        pairs = [(r, _nanogpt_of(results, r["run"])) for r in results
                 if r["system"] == system and "error" not in r]
        pairs = [(r, n) for r, n in pairs if n and n.get("full_val_loss") is not None
                 and r.get("full_val_loss") is not None]
        if not pairs:
            continue
        met = [r["full_val_loss"] <= n["full_val_loss"] and r["loop_seconds"] < n["loop_seconds"]
               for r, n in pairs]
        ratios = ", ".join(f"{r['loop_seconds'] / n['loop_seconds']:.2f}x" for r, n in pairs)
        r, n = pairs[0]
        lines.append(
            f"{system}: full validation loss {r['full_val_loss']:.4f} against nanoGPT's "
            f"{n['full_val_loss']:.4f} (both runs are deterministic); loop time against "
            f"nanoGPT's, run by run: {ratios}. The target (nanoGPT's loss in less wall time) "
            f"is met in {sum(met)} of {len(met)} run(s).")
    return "\n".join(lines) or None


def time_to_loss_verdict(results, target):
    """With an autocast nanoGPT in the runs: each system's time to nanoGPT's (float32)
    validation loss over nanoGPT's and over the autocast nanoGPT's of the same run."""
    if target is None or not any(r["system"] == NANOGPT_AUTOCAST for r in results):
        return None
    lines = []
    for system in dict.fromkeys(r["system"] for r in results if r["system"] != "nanoGPT"):
        ratios = {"nanoGPT": [], NANOGPT_AUTOCAST: []}
        for r in results:
            if r["system"] != system or "error" in r:
                continue
            reach = time_to_reach(r, target)
            for peer in ratios:
                if peer == system:
                    continue
                runs = [p for p in results if p["system"] == peer and p["run"] == r["run"]
                        and "error" not in p]
                peer_reach = time_to_reach(runs[0], target) if runs else None
                if peer_reach:
                    ratios[peer].append("not reached" if reach is None
                                        else f"{reach / peer_reach:.2f}x")
        plain, autocast = (", ".join(ratios[p]) or "n/a" for p in ratios)
        lines.append(f"{system}: time to nanoGPT's validation loss {target:.4f} over "
                     f"nanoGPT's (float32), run by run: {plain}; over nanoGPT under "
                     f"autocast: {autocast}.")
    return "\n".join(lines)


def _nanogpt_of(results, run):
    """The nanoGPT reference for our run ``run``: the mean of the nanoGPT runs just before
    (``run``) and just after it (``run + 1``). This machine's speed drifts by 10-30% over
    minutes; an A-B-A order cancels a steady drift, where one neighbour alone would not."""
    runs = [r for r in results if r["system"] == "nanoGPT" and "error" not in r
            and r["run"] in (run, run + 1)]
    if len(runs) < 2:
        return runs[0] if runs else None
    reference = dict(runs[0], ms_per_iter=statistics.mean(r["ms_per_iter"] for r in runs),
                     loop_seconds=statistics.mean(r["loop_seconds"] for r in runs))
    reference["evals"] = [dict(entry, seconds=statistics.mean(r["evals"][i]["seconds"]
                                                               for r in runs))
                          for i, entry in enumerate(runs[0]["evals"])]
    return reference


def report(recipe_name, recipe, args, results):
    first = _nanogpt_of(results, 1)
    target = first["final_val_loss"] if first else None
    rows = ["| system | iterations | ms/iter | loop s | final val loss | full val loss | s to "
            "nanoGPT's val loss | ms/iter vs nanoGPT | time to its loss vs nanoGPT |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        nano = _nanogpt_of(results, r["run"]) if r["system"] != "nanoGPT" else None
        label = r["system"] + (f", run {r['run']}" if args.runs > 1 or r["run"] > 1 else "")
        if "error" in r:
            rows.append(f"| {label} | failed: {r['error'].splitlines()[-1][:80]} "
                        "| | | | | | | |")
            continue
        reach = time_to_reach(r, target) if target is not None else None
        r["seconds_to_nanogpt_val_loss"] = reach
        speed = f"{r['ms_per_iter'] / nano['ms_per_iter']:.2f}x" if nano else ""
        nano_reach = time_to_reach(nano, target) if nano else None
        wall = (f"{reach / nano_reach:.2f}x" if reach is not None and nano_reach else
                ("not reached" if nano else ""))
        full = r.get("full_val_loss")
        full = "" if full is None else f"{full:.4f}"
        if r.get("checkpoint_iter") not in (None, args.iters):
            full += f" (iter {r['checkpoint_iter']})"
        rows.append(f"| {label} | {r['iterations']} | {r['ms_per_iter']:.1f} | "
                    f"{r['loop_seconds']:.1f} | {r['final_val_loss']:.4f} | {full} | "
                    f"{'' if reach is None else f'{reach:.1f}'} | {speed} | {wall} |")
    note = (f"\nRecipe `{recipe_name}`: {recipe['n_layer']} layers, {recipe['n_head']} heads, "
            f"{recipe['n_embd']} wide, block {recipe['block_size']}, batch "
            f"{recipe['batch_size']}, dropout {recipe['dropout']}, {args.iters} iterations, "
            f"lr {LEARNING_RATE} (warmup {WARMUP}, cosine to {MIN_LR}), AdamW (0.9, {BETA2}) "
            f"wd {WEIGHT_DECAY} on matrices, clip {GRAD_CLIP}; loss = mean of "
            f"{args.eval_iters} random batches every {args.eval_interval} iterations. "
            "ms/iter: median over iterations without an evaluation; loop s: the training "
            "loop with its evaluations; full val loss: the final model on every "
            f"non-overlapping {recipe['block_size']}-token block of the validation split. "
            "Ratios (against the mean of the nanoGPT runs just before and just after each of ours: "
            "nanoGPT runs once more at the end) below 1 mean we are faster.")
    verdict = "\n".join(filter(None, [full_validation_verdict(results),
                                      time_to_loss_verdict(results, target)]))
    table = "\n".join(rows) + "\n" + note + (f"\n\n{verdict}" if verdict else "")
    payload = {"recipe": recipe_name, "settings": {**recipe, "iters": args.iters,
                                                   "eval_interval": args.eval_interval,
                                                   "eval_iters": args.eval_iters},
               "machine": machine(), "nanogpt_val_loss_target": target, "results": results}
    name = args.name or ("gpt_vs_nanogpt" if recipe_name == "cpu" else
                         f"gpt_vs_nanogpt_{recipe_name}")
    write_results(name, payload, table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="cpu")
    parser.add_argument("--iters", type=int, help="training iterations (recipe default)")
    parser.add_argument("--eval-interval", type=int, help="iterations between evaluations")
    parser.add_argument("--eval-iters", type=int, default=20, help="batches per evaluation")
    parser.add_argument("--nanogpt", help="a nanoGPT checkout: also run its train.py")
    parser.add_argument("--backend", default="torch", help="Keras backend for ours (torch)")
    parser.add_argument("--jit", action="store_true",
                        help="also run ours with jit_compile=True (torch.compile)")
    parser.add_argument("--runs", type=int, default=1,
                        help="repeat nanoGPT then ours this many times, then nanoGPT once "
                             "more; each of ours is compared with the mean of the nanoGPT runs "
                             "around it (this machine's speed drifts by 10-30%% over minutes)")
    parser.add_argument("--name", help="results file name (default gpt_vs_nanogpt[_RECIPE])")
    parser.add_argument("--precision", default="float32",
                        help="comma-separated train.precision values for ours (float32, "
                             "mixed_bfloat16): one run of ours per precision in each run")
    parser.add_argument("--nanogpt-autocast", action="store_true",
                        help="also run nanoGPT under torch.autocast bfloat16 on the CPU")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    recipe = RECIPES[args.recipe]
    args.iters = args.iters or recipe["iters"]
    args.eval_interval = min(args.eval_interval or recipe["eval_interval"], args.iters)
    if args.iters % args.eval_interval:
        parser.error(f"--iters {args.iters} must be a multiple of --eval-interval "
                     f"{args.eval_interval}")
    if args.worker:
        return worker(recipe, args)
    if args.nanogpt and not os.path.isfile(os.path.join(args.nanogpt, "train.py")):
        parser.error(f"--nanogpt {args.nanogpt}: no train.py there")
    results = []
    for run in range(1, args.runs + 2):  # nanoGPT, ours, ..., nanoGPT: A-B-...-A
        if args.nanogpt:
            with tempfile.TemporaryDirectory(prefix="nanogpt-bench-") as work:
                prepare_nanogpt_data(work)
                results.append(dict(run_nanogpt(args.nanogpt, recipe, args, work), run=run))
        if run > args.runs:
            break
        if args.nanogpt and args.nanogpt_autocast:
            with tempfile.TemporaryDirectory(prefix="nanogpt-bench-") as work:
                prepare_nanogpt_data(work)
                results.append(dict(run_nanogpt(args.nanogpt, recipe, args, work,
                                                autocast=True), run=run))
        for precision in args.precision.split(","):
            results.append(dict(run_ours(args.recipe, args, jit=False, precision=precision),
                                run=run))
        if args.jit:
            results.append(dict(run_ours(args.recipe, args, jit=True), run=run))
    report(args.recipe, recipe, args, results)


if __name__ == "__main__":
    main()
