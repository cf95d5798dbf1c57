"""The OpenVINO side of the peer rows (``ov-float32``, ``ov-int8``): run by
``bench/openvino_peer.py`` with ``.venv-openvino/bin/python`` (OpenVINO and optimum-intel
pin their own ``transformers``), never imported by the main venv, and importing nothing
from transformerkit: Hugging Face ids in, Hugging Face ids and timings out, as JSON.

Modes (``python bench/openvino_worker.py MODE``, the spec as JSON on standard input, the
answer as JSON on the last line of standard output):

- ``convert``: a Hugging Face folder (``folder``; ``config.json`` may carry
  ``layer_norm_eps``, which ``MarianMTModel`` does not read: it is set on every
  ``LayerNorm`` before the export) as OpenVINO IR in ``out``, through optimum-intel's
  ``export_from_model`` (stateful key/value cache, float32 weights); ``weights: int8``:
  that float32 IR with NNCF's 8-bit weight compression
  (``OVWeightQuantizationConfig(bits=8)``, through ``from_pretrained``);
- ``seq2seq``: ``OVModelForSeq2SeqLM`` decodes the batches of each workload with
  ``generate`` (greedy or beam 4, ``max_new_tokens``, ``min_new_tokens`` when forced) after
  a warm-up call on the last batch; the outputs are cut before the first end token;
- ``causal``: ``OVModelForCausalLM`` generates ``new_tokens`` greedy tokens for each batch
  of prompts: a warm-up call, then ``calls`` timed calls;
- ``step-convert``: the compiled engine's step as ``torch.export`` captured it (``program``,
  saved by ``torch.export.save`` in the main venv: ``bench/openvino_step.py``) converted by
  ``openvino.convert_model`` to IR in ``out`` (``step.xml``), and that IR with NNCF's 8-bit
  weight compression (``compress_weights``, asymmetric, per output channel:
  ``step-int8.xml``); the seconds each took;
- ``step``: serves timings of those IRs, a request a line: the first line of standard input
  is the spec (``folder``, ``threads``), each further one ``{"rows", "precision", "calls"}``
  (``float32`` and ``bfloat16``: ``step.xml`` compiled with ``INFERENCE_PRECISION_HINT`` f32
  / bf16; ``int8``: ``step-int8.xml``, f32), answered by one line: the inputs of
  ``folder/inputs-ROWS.npz`` run ``calls`` times (after one untimed call), milliseconds a
  call, and the largest difference of its logits from the file's ``reference`` ones.

Every model compiles for the CPU with ``INFERENCE_NUM_THREADS`` = ``threads``, one stream,
the latency hint and ``INFERENCE_PRECISION_HINT`` ``f32`` (OpenVINO would otherwise pick
bfloat16 on CPUs with bfloat16 units); PyTorch, which runs ``generate``'s search around the
model calls, gets the same thread count.
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402 (plain Python and NumPy: the OpenVINO venv has both)


def keep_freed_memory():
    """glibc ``malloc`` as ``transformerkit.keep_freed_memory()`` sets it for the other
    systems' workers (no ``mmap`` for large blocks, no trimming; not imported: this venv has
    no transformerkit)."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux") or os.environ.get("TRANSFORMERKIT_MALLOC") == \
            "system":
        return
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(-4, 0)  # M_MMAP_MAX
    mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD


PACKAGES = ("openvino", "optimum-intel", "optimum", "nncf", "transformers", "torch")


def versions():
    """The installed versions of :data:`PACKAGES`, from their metadata."""
    return common.package_versions(PACKAGES)


def ov_config(threads):
    """The CPU plugin's settings: ``threads`` threads, one stream, float32 inference."""
    return {"INFERENCE_NUM_THREADS": str(threads), "NUM_STREAMS": "1",
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "CACHE_DIR": ""}


def device_info(parts):
    """The CPU as OpenVINO names it and what the compiled ``parts`` (optimum's submodels)
    run with."""
    import openvino as ov

    info = {"device": ov.Core().get_property("CPU", "FULL_DEVICE_NAME")}
    for part in parts:
        request = getattr(part, "request", None)
        compiled = request.get_compiled_model() if hasattr(request, "get_compiled_model") \
            else request
        if compiled is None:
            continue
        for key in ("INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT", "NUM_STREAMS",
                    "DYNAMIC_QUANTIZATION_GROUP_SIZE"):
            try:
                value = compiled.get_property(key)
                info[key] = value.to_string() if hasattr(value, "to_string") else str(value)
            except Exception:  # noqa: BLE001 - a property this plugin does not report
                pass
        break
    return info


def convert(spec):
    """Export ``spec["folder"]`` to OpenVINO IR in ``spec["out"]`` (see the module
    docstring); with ``weights: int8``, ``folder`` is the float32 IR, compressed by NNCF
    through optimum-intel. Returns what was written."""
    if spec["weights"] == "int8":
        return compress(spec)
    import torch
    import transformers
    from optimum.exporters.openvino import export_from_model
    from optimum.intel import OVConfig

    config = transformers.AutoConfig.from_pretrained(spec["folder"])
    auto = (transformers.AutoModelForSeq2SeqLM if spec["task"].startswith("text2text")
            else transformers.AutoModelForCausalLM)
    model = auto.from_pretrained(spec["folder"], dtype=torch.float32).eval()
    eps = getattr(config, "layer_norm_eps", None)
    if eps is not None and config.model_type == "marian":  # Marian's LayerNorms: 1e-5
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.eps = float(eps)
    export_from_model(model, spec["out"], task=spec["task"], stateful=True,
                      ov_config=OVConfig(dtype="fp32"))
    return {"out": spec["out"], "files": sorted(os.listdir(spec["out"]))}


def compress(spec):
    """The float32 IR ``spec["folder"]`` with its weights compressed to 8 bits
    (``OVWeightQuantizationConfig(bits=8)``: NNCF's INT8_ASYM, per output channel), saved
    in ``spec["out"]``."""
    from optimum.intel import OVModelForCausalLM, OVModelForSeq2SeqLM, OVWeightQuantizationConfig

    kind = OVModelForSeq2SeqLM if spec["task"].startswith("text2text") else OVModelForCausalLM
    model = kind.from_pretrained(spec["folder"], compile=False,
                                 quantization_config=OVWeightQuantizationConfig(bits=8))
    model.save_pretrained(spec["out"])
    return {"out": spec["out"], "files": sorted(os.listdir(spec["out"]))}


def cut(row, eos_id):
    """``row`` up to its first ``eos_id`` (excluded)."""
    return row[:row.index(eos_id)] if eos_id in row else row


def seq2seq(spec):
    """Every workload of ``spec`` once, after a warm-up call on its last batch."""
    import torch
    from optimum.intel import OVModelForSeq2SeqLM

    threads = spec["threads"]
    torch.set_num_threads(threads)
    model = OVModelForSeq2SeqLM.from_pretrained(spec["model"], ov_config=ov_config(threads),
                                                device="CPU", compile=True)
    pad_id, eos_id = spec["pad_id"], spec["eos_id"]
    results = []
    for workload in spec["workloads"]:
        options = dict(max_new_tokens=workload["tokens"],
                       min_new_tokens=workload["tokens"] if workload["forced"] else 0,
                       num_beams=4 if workload["search"] == "beam4" else 1, do_sample=False,
                       length_penalty=spec["length_penalty"], early_stopping=True,
                       num_return_sequences=1)

        def decode(rows, options=options):
            ids = torch.tensor(rows, dtype=torch.int64)
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=(ids != pad_id).long(),
                                     **options)
            return [cut(row[1:], eos_id) for row in out.tolist()]  # no decoder start

        batches = workload["batches"]
        decode(batches[-1])  # warm-up
        started = time.perf_counter()
        outputs = [decode(rows) for rows in batches]
        seconds = time.perf_counter() - started
        results.append(dict(search=workload["search"], tokens=workload["tokens"],
                            forced=workload["forced"], seconds=round(seconds, 3),
                            outputs=outputs))
        print(f"    {spec['system']} {workload['search']} {workload['tokens']}"
              f"{' forced' if workload['forced'] else ''}: {results[-1]['seconds']} s",
              file=sys.stderr, flush=True)
    return dict(results=results, versions=versions(),
                **device_info([model.encoder, model.decoder]))


def causal(spec):
    """Each batch of prompts: a warm-up call (timed: the first call), then ``calls`` timed
    calls, their median kept; ``new_tokens`` greedy tokens, the end token forbidden
    before."""
    import torch
    from optimum.intel import OVModelForCausalLM

    threads = spec["threads"]
    torch.set_num_threads(threads)
    started = time.perf_counter()
    model = OVModelForCausalLM.from_pretrained(spec["model"], ov_config=ov_config(threads),
                                               device="CPU", compile=True)
    load_seconds = time.perf_counter() - started
    new_tokens, results = spec["new_tokens"], []
    for batch in spec["batches"]:
        ids = torch.tensor(batch, dtype=torch.int64)

        def generate(ids=ids):
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                     do_sample=False, num_beams=1, max_new_tokens=new_tokens,
                                     min_new_tokens=new_tokens,
                                     pad_token_id=model.config.eos_token_id)
            return out[:, ids.shape[1]:].tolist()

        started = time.perf_counter()
        outputs = generate()
        first = time.perf_counter() - started
        times = []
        for _ in range(spec["calls"]):
            started = time.perf_counter()
            outputs = generate()
            times.append(time.perf_counter() - started)
        results.append(dict(batch=len(batch), seconds=round(statistics.median(times), 4),
                            calls=times, first_call_seconds=round(first, 3),
                            load_seconds=round(load_seconds, 3), outputs=outputs))
        load_seconds = 0.0
    return dict(results=results, versions=versions(), **device_info([model]))


def step_convert(spec):
    """The step program ``spec["program"]`` as IR in ``spec["out"]``, float32 and int8
    weights (see the module docstring)."""
    import nncf
    import openvino as ov
    import torch

    started = time.perf_counter()
    model = ov.convert_model(torch.export.load(spec["program"]))
    ov.save_model(model, os.path.join(spec["out"], "step.xml"), compress_to_fp16=False)
    convert_seconds = time.perf_counter() - started
    started = time.perf_counter()
    compressed = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    ov.save_model(compressed, os.path.join(spec["out"], "step-int8.xml"),
                  compress_to_fp16=False)
    return {"convert_seconds": round(convert_seconds, 1),
            "int8_seconds": round(time.perf_counter() - started, 1)}


STEP_MODELS = {"float32": ("step.xml", "f32"), "bfloat16": ("step.xml", "bf16"),
               "int8": ("step-int8.xml", "f32")}


def step(spec):
    """Answer timing requests of the step IRs in ``spec["folder"]`` (see the module
    docstring) until standard input ends; returns what the models were compiled as."""
    import numpy as np
    import openvino as ov

    core = ov.Core()
    compiled, requests = {}, {}
    for precision, (file, hint) in STEP_MODELS.items():
        config = dict(ov_config(spec["threads"]), INFERENCE_PRECISION_HINT=hint)
        compiled[precision] = core.compile_model(
            core.read_model(os.path.join(spec["folder"], file)), "CPU", config)
        requests[precision] = compiled[precision].create_infer_request()
    print(json.dumps({"ready": True}), flush=True)
    inputs = {}
    for line in sys.stdin:
        request = json.loads(line)
        rows = request["rows"]
        if rows not in inputs:
            with np.load(os.path.join(spec["folder"], f"inputs-{rows}.npz")) as found:
                inputs[rows] = ([found[f"input_{i}"] for i in range(len(found.files) - 1)],
                                found["reference"])
        tensors, reference = inputs[rows]
        infer = requests[request["precision"]]
        logits = infer.infer(tensors, share_inputs=True)[0]
        started = time.perf_counter()
        for _ in range(request["calls"]):
            infer.infer(tensors, share_inputs=True)
        ms = (time.perf_counter() - started) / request["calls"] * 1000
        print(json.dumps({"ms": ms, "max_diff": float(np.abs(logits - reference).max())}),
              flush=True)
    return {"precision_hints": {p: str(c.get_property("INFERENCE_PRECISION_HINT"))
                                for p, c in compiled.items()},
            "device": core.get_property("CPU", "FULL_DEVICE_NAME"),
            "capabilities": list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")),
            "versions": versions()}


MODES = {"convert": convert, "seq2seq": seq2seq, "causal": causal,
         "step-convert": step_convert, "step": step}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in MODES:
        raise SystemExit(f"usage: openvino_worker.py {{{','.join(MODES)}}} < spec.json")
    # ``step`` reads its requests after the spec's line
    spec = json.loads(sys.stdin.readline()) if sys.argv[1] == "step" else json.load(sys.stdin)
    if sys.argv[1] != "convert":
        keep_freed_memory()  # as the other systems' workers
    print(json.dumps(MODES[sys.argv[1]](spec)))


if __name__ == "__main__":
    main()
