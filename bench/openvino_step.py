"""The compiled engine's decoder step against the same step run by OpenVINO: which runtime
should run it.

The step is the one ``--engine compiled`` compiles: the model's own ``decode_step`` as
``torch.export`` captures it (``transformerkit.decoding.aot_step.export_step``, the
small-rows package's graph: one memory per row, the rows, cache length and source length
dynamic; besides the logits it returns greedy search's choice, given a bias row of the
vocabulary's width, here zeros). Here that float32 program is saved (``torch.export.save``)
and converted by ``openvino.convert_model`` in OpenVINO's venv
(``bench/openvino_worker.py``'s ``step-convert``: the IR, and the IR with NNCF's 8-bit
weight compression); OpenVINO then runs it as float32 (``INFERENCE_PRECISION_HINT`` f32),
bfloat16 (the hint bf16: OpenVINO's own bfloat16 inference where the CPU has bfloat16 units)
and with int8 weights. Our side runs the engine's packages at each precision (built into the
engine's cache if missing: the small-rows package up to ``aot_step.SMALL_ROWS`` rows, the
many-rows one above).

Both sides get the same inputs for each row count: ``--rows`` rows of the token at position
``--position`` with caches of ``2 * position + 1`` positions (random keys and values) and
the cross-attention memories of random source ids of ``--source-len`` positions (the eager
encoder pass). One call is the step of all rows; each timing is ``--calls`` calls after one
untimed one, one thread each (``--threads``), the two sides alternating in ``--rounds``
rounds (best kept). Each system's logits are compared with the eager float32 step's on the
same inputs (largest absolute difference).

OpenVINO's graph returns the logits and the choice: where the PyTorch step writes the new key and
value into the caches in place, OpenVINO's conversion writes them into a copy it drops
(a decoder that used it would also have to return or keep the caches: not timed here), so
OpenVINO's times are a lower bound of what an engine on it would take.

    python bench/openvino_step.py RUN [--rows 1,4,16,64]
    # -> bench/results/openvino_step.FAMILY.{json,md}

The OpenVINO venv is made as ``bench/openvino_peer.py`` says.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import openvino_peer  # noqa: E402

PRECISIONS = ("float32", "bfloat16", "int8")


def prepare(run, folder, rows_list, position, source_len, threads):
    """The step program, its OpenVINO IRs and each row count's inputs in ``folder`` (made
    again when the run's weights change); returns the conversion's record and the steps'
    operations (:func:`write_inputs`)."""
    import torch

    from transformerkit.decoding import aot_step

    model = run.model
    openvino_peer.fresh_folder(folder, os.path.join(os.fspath(run.run_dir), "model.keras"))
    record_file = os.path.join(folder, "convert.json")
    if not os.path.isfile(record_file):
        started = time.perf_counter()
        program = aot_step.export_step(model, "small")
        program_file = os.path.join(folder, "step.pt2")
        torch.export.save(program, program_file)
        export_seconds = time.perf_counter() - started
        print("... converting the step to OpenVINO", flush=True)
        found = openvino_peer.run_worker("step-convert", dict(program=program_file,
                                                              out=folder), threads)
        if "error" in found:
            raise SystemExit(f"the OpenVINO conversion failed: {found['error']}")
        found["export_seconds"] = round(export_seconds, 1)
        with open(record_file, "w", encoding="utf-8") as f:
            json.dump(found, f)
    flops = write_inputs(model, folder, rows_list, position, source_len)
    with open(record_file, encoding="utf-8") as f:
        return json.load(f), flops


def write_inputs(model, folder, rows_list, position, source_len):
    """``folder/inputs-ROWS.npz`` for each of ``rows_list``: the step's inputs in
    ``torch.export``'s flattening order (``input_0`` ...: tokens, index, each block's cache
    keys and values, the caches' row table (each row its own), each block's memory ``(keys,
    values, bias, keep)``, the choice's bias row; see the module docstring) and the eager
    float32 step's logits (``reference``, with the unpacked weights, whose products
    PyTorch's ``FlopCounterMode`` counts). Returns ``{rows: the step's floating-point
    operations}`` (its matrix products: the projections, the
    attention, the output layer)."""
    import numpy as np
    import torch
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import FlopCounterMode

    from transformerkit.decoding.eager_steps import source_memories

    seq2seq = hasattr(model, "decoder_blocks")
    weights = model.step_weights("float32", packed=False)
    flops = {}
    layers = model.num_decoder_layers if seq2seq else model.num_layers
    rng = np.random.default_rng(0)
    for rows in rows_list:
        generator = torch.Generator().manual_seed(rows)
        vocab = model.target_vocab_size if seq2seq else model.vocab_size
        tokens = torch.as_tensor(rng.integers(4, vocab, rows)).long()
        index = torch.tensor(position)
        caches = [tuple(torch.randn((2 * position + 1, rows, model.num_heads, dim),
                                    generator=generator)
                        for dim in (model.key_dim, model.value_dim)) for _ in range(layers)]
        table = torch.arange(rows).expand(2 * position + 1, rows).contiguous()
        memories = None
        if seq2seq:
            source = rng.integers(4, model.source_vocab_size, (rows, source_len))
            with torch.no_grad():
                memories = [(*memory[:3], memory[0].new_ones((rows, 1, 1, 1))
                             if memory[3] is None else memory[3])
                            for memory in source_memories(model, torch.as_tensor(source),
                                                          weights)]
        bias = torch.zeros(1, vocab)  # the choice's bias row (every id allowed)
        flat, _ = tree_flatten((tokens, index, caches, table, memories, bias))  # export's order
        # the eager float32 step, on copies of the caches
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            reference = model.decode_step(tokens, position,
                                          [tuple(t.clone() for t in pair) for pair in caches],
                                          weights, memories, 1)
        flops[rows] = counter.get_total_flops()
        np.savez(os.path.join(folder, f"inputs-{rows}.npz"), reference=reference.numpy(),
                 **{f"input_{i}": t.numpy() for i, t in enumerate(flat)})
    return flops


def inputs_of(folder, rows, layers):
    """The step's inputs (tokens, index, caches, the caches' row table, memories, the
    choice's bias row) and reference logits of ``rows`` rows, as ``prepare`` saved them."""
    import numpy as np
    import torch

    with np.load(os.path.join(folder, f"inputs-{rows}.npz")) as found:
        flat = [torch.from_numpy(found[f"input_{i}"]) for i in range(len(found.files) - 1)]
        reference = found["reference"]
    caches = [(flat[2 + 2 * i], flat[3 + 2 * i]) for i in range(layers)]
    rest = flat[3 + 2 * layers:-1]
    memories = [tuple(rest[i:i + 4]) for i in range(0, len(rest), 4)] or None
    return (flat[0], flat[1], caches, flat[2 + 2 * layers], memories, flat[-1]), reference


class OpenVINOSteps:
    """The worker's ``step`` mode, kept running: one request, one answer."""

    def __init__(self, folder, threads):
        openvino_peer.require_venv()
        self.process = subprocess.Popen([openvino_peer.PYTHON, openvino_peer.WORKER, "step"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=openvino_peer.worker_env(threads))
        self._send({"folder": folder, "threads": threads})
        self._answer()  # compiled and ready

    def _send(self, message):
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _answer(self):
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the OpenVINO step worker ended (exit {self.process.wait()})")
        return json.loads(line)

    def time(self, rows, precision, calls):
        self._send({"rows": rows, "precision": precision, "calls": calls})
        return self._answer()

    def close(self):
        """Its closing record (what the models were compiled as)."""
        self.process.stdin.close()
        record = json.loads(self.process.stdout.read().strip().splitlines()[-1])
        self.process.wait()
        return record


def time_ours(step, inputs, reference, calls):
    """``step`` (a package's call) on ``inputs``: milliseconds a call over ``calls`` calls
    after an untimed one, and its logits' largest difference from ``reference``."""
    import numpy as np
    import torch

    with torch.no_grad():
        logits = step(*inputs)[0]
        started = time.perf_counter()
        for _ in range(calls):
            step(*inputs)
        ms = (time.perf_counter() - started) / calls * 1000
    return {"ms": ms, "max_diff": float(np.abs(logits.numpy() - reference).max())}


def table(results, threads, peaks):
    lines = ["| rows | precision | GFLOP a step | compiled step (ms) | OpenVINO (ms) | "
             "OpenVINO's / ours | compiled GFLOP/s | max abs. logit diff., ours / OpenVINO |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['rows']} | {r['precision']} | {r['flops'] / 1e9:.4g} | "
                     f"{r['ours_ms']:.3f} | {r['openvino_ms']:.3f} | "
                     f"{r['openvino_ms'] / r['ours_ms']:.2f} | "
                     f"{r['flops'] / r['ours_ms'] / 1e6:.1f} | "
                     f"{r['ours_max_diff']:.2g} / {r['openvino_max_diff']:.2g} |")
    lines.append("")
    lines.append(f"One decoder step of all rows, {threads} thread(s) each, best of the "
                 "interleaved rounds; the differences are from the eager float32 step's "
                 "logits on the same inputs. OpenVINO runs the same exported graph and "
                 "drops the cache writes (a lower bound of its step). This machine's "
                 "matrix-product peak on as many threads (2048-square products): "
                 + ", ".join(f"{dtype} {value:.1f} GFLOP/s" for dtype, value in peaks.items())
                 + ".")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run folder (its model.keras)")
    parser.add_argument("--rows", default="1,4,16,64")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--position", type=int, default=16)
    parser.add_argument("--source-len", type=int, default=20)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="openvino_step")
    args = parser.parse_args()
    try:
        rows_list = sorted({int(r) for r in args.rows.split(",") if r.strip()})
    except ValueError:
        rows_list = []
    if not rows_list or rows_list[0] < 1 or args.position < 1 or args.source_len < 1 \
            or args.calls < 1 or args.rounds < 1:
        raise SystemExit("--rows takes positive whole numbers separated by commas, e.g. "
                         "1,4,16,64; --position, --source-len, --calls and --rounds are "
                         "positive whole numbers")
    precisions = [p for p in args.precisions.split(",") if p]
    unknown = set(precisions) - set(PRECISIONS)
    if unknown:
        raise SystemExit(f"unknown precisions {sorted(unknown)}; choose from {PRECISIONS}")
    openvino_peer.require_venv()

    import torch

    import transformerkit
    from transformerkit.decoding import aot_step

    torch.set_num_threads(args.threads)
    run = transformerkit.load(args.run)
    model = run.model
    if 2 * args.position > model.max_length or args.source_len > model.max_length:
        raise SystemExit(f"the model takes {model.max_length} positions: --position at most "
                         f"{model.max_length // 2} (its caches hold 2 * position + 1), "
                         f"--source-len at most {model.max_length}")
    # one folder a form of the step's inputs (a new form is converted again)
    folder = os.path.join(os.fspath(run.run_dir), "openvino", f"step-{aot_step.FORMAT}")
    conversion, flops = prepare(run, folder, rows_list, args.position, args.source_len,
                                args.threads)
    peaks = {dtype: common.matmul_peak(3.0, dtype=dtype) for dtype in ("float32", "bfloat16")}
    layers = model.num_decoder_layers if hasattr(model, "decoder_blocks") else model.num_layers
    runners = {p: aot_step.CompiledSteps(model, p).runner() for p in precisions}
    if any(r is None for r in runners.values()):
        raise SystemExit("the compiled step is not available here (see the warning above)")
    openvino = OpenVINOSteps(folder, args.threads)
    best = {}
    for round_ in range(args.rounds):
        for rows in rows_list:
            inputs, reference = inputs_of(folder, rows, layers)
            for precision in precisions:
                runner = runners[precision]
                ours = time_ours(runner.get(runner.bucket(rows)), inputs, reference,
                                 args.calls)
                theirs = openvino.time(rows, precision, args.calls)
                key = (rows, precision)
                kept = best.setdefault(key, {"rows": rows, "precision": precision,
                                             "flops": flops[rows], "ours_ms": ours["ms"],
                                             "openvino_ms": theirs["ms"]})
                kept["ours_ms"] = min(kept["ours_ms"], ours["ms"])
                kept["openvino_ms"] = min(kept["openvino_ms"], theirs["ms"])
                kept["ours_max_diff"] = ours["max_diff"]
                kept["openvino_max_diff"] = theirs["max_diff"]
                print(f"round {round_ + 1}: {rows} rows {precision}: ours {ours['ms']:.3f} "
                      f"ms, OpenVINO {theirs['ms']:.3f} ms", flush=True)
    record = openvino.close()
    results = [dict(r, ours_ms=round(r["ours_ms"], 4), openvino_ms=round(r["openvino_ms"], 4))
               for r in best.values()]
    payload = {"machine": dict(common.machine(), threads_per_system=args.threads),
               "run": os.fspath(run.run_dir), "position": args.position,
               "source_len": args.source_len, "calls": args.calls, "rounds": args.rounds,
               "matmul_peak_gflops": {k: round(v, 1) for k, v in peaks.items()},
               "conversion": conversion, "openvino": record, "results": results}
    common.write_results(args.name, payload, table(results, args.threads, peaks))


if __name__ == "__main__":
    main()
