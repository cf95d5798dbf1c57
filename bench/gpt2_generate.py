"""GPT-2 124M generating: transformerkit (the keras engine and the compiled step) against
``transformers`` generate and CTranslate2 on the same weights, batch 1 and 8.

The model: a random ``GPT2LMHeadModel`` of GPT-2's smallest size (12 layers, d_model 768,
12 heads, 1,024 positions, a vocabulary of 50,257 ids; ``transformers``' own initialisation,
seeded), written with ``save_pretrained`` beside a byte-level BPE vocabulary of the same
size (``tokenizers``, trained on Multi30k English and filled up to 50,256 entries, then
``<|endoftext|>``), and imported as a run with ``transformerkit import``, once, into
``--work``. Random weights decide nothing about speed: every system does the work of the
real model's shapes.

Workload: ``--batch`` prompts (``1,8``) of the first Multi30k test2016 English sentences,
each cut to its first ``--prompt-tokens`` (16) ids (equal lengths: no padding, so every
system does the same work), greedy, exactly ``--new-tokens`` (64) new tokens each (the end
token forbidden before: ``min_new_tokens``, CTranslate2's ``min_length``). Ids in, ids out:
tokenization is outside the timings. Systems:

- ``tk-keras`` / ``tk-keras-bfloat16``: ``transformerkit.load(RUN)`` and ``generate_ids``
  (the eager cached step, float32 / bfloat16 products; our ids are GPT-2's shifted past
  ``<pad>`` and ``<s>``, and back);
  ``tk-compiled``, ``tk-compiled-bfloat16`` and ``tk-compiled-int8``: the same with
  ``use_cache="compiled"`` (the step compiled ahead of time, its packages kept in
  ``--work``; int8: int8 weights, ``docs/decoding.md``);
- ``hf``: ``GPT2LMHeadModel.generate`` under ``torch.no_grad()`` (``do_sample=False``);
- ``ct2-float32`` / ``ct2-int8``: the folder converted by CTranslate2's own
  ``TransformersConverter``, ``Generator.generate_batch`` (``sampling_topk=1``,
  ``compute_type``, ``intra_threads``);
- ``ov-float32`` / ``ov-int8``: the folder converted to OpenVINO IR by optimum-intel
  (``--work``/openvino; int8: NNCF's 8-bit weight compression), ``OVModelForCausalLM``'s
  ``generate`` (``do_sample=False``, ``INFERENCE_NUM_THREADS``, float32 inference
  precision), run by ``bench/openvino_worker.py`` in the OpenVINO venv ``.venv-openvino``
  (see ``bench/decode_precision.py``'s docstring for how to make it; named in
  ``--systems``, the default leaves them out): the same prompt ids in, new ids out, the
  same calls and medians.

Every system runs in processes of its own, one per system and round, in the reverse order
every other round; a round times ``--calls`` (3) calls of each batch size after a warm-up
call and keeps the median; each configuration keeps its best round. The first call of the
first round of a compiled system builds its packages into ``--work``/cache, emptied at the
start of a run (its time is reported as the compile time); its later rounds load them (the
cached load time: the first call's time less a timed call's). Every system uses
``--threads`` threads (1). Output agreement: the share of rows whose new ids equal
``transformers``'.

    python bench/gpt2_generate.py   # -> bench/results/gpt2_generate.FAMILY.{json,md}
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import openvino_peer  # noqa: E402

HERE = os.path.abspath(__file__)
SYSTEMS = ("tk-keras", "tk-keras-bfloat16", "tk-compiled", "tk-compiled-bfloat16",
           "tk-compiled-int8", "hf",
           "ct2-float32", "ct2-int8", "ov-float32", "ov-int8")
DEFAULT_SYSTEMS = [s for s in SYSTEMS if not s.startswith("ov-")]  # ov-*: a venv of its own
END = "<|endoftext|>"
GPT2_SMALL = dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)


def write_vocabulary(folder, vocab_size, texts):
    """A byte-level BPE of exactly ``vocab_size`` ids saved as ``GPT2TokenizerFast`` in
    ``folder``: trained on ``texts``, filled with unused entries up to ``vocab_size - 1``,
    ``<|endoftext|>`` last (GPT-2's layout)."""
    import tempfile

    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    with tempfile.TemporaryDirectory() as scratch:
        vocab_file, merges_file = tokenizer.model.save(scratch)
        with open(vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
        with open(merges_file, encoding="utf-8") as f:
            merges = [tuple(line.split()) for line in f if line.strip()
                      and not line.startswith("#")]
    for i in range(len(vocab), vocab_size - 1):
        vocab[f"<|unused{i}|>"] = i
    vocab[END] = vocab_size - 1
    filled = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    filled.pre_tokenizer, filled.decoder = tokenizer.pre_tokenizer, tokenizer.decoder
    gpt2 = transformers.GPT2TokenizerFast(tokenizer_object=filled, bos_token=END,
                                          eos_token=END, unk_token=END)
    if len(gpt2) != vocab_size:
        raise SystemExit(f"the vocabulary has {len(gpt2)} ids, not {vocab_size}")
    gpt2.save_pretrained(folder)
    return gpt2


def english(split):
    from transformerkit.data.corpora import load_multi30k

    return load_multi30k(split, "de", "en", data_dir=common.data_dir())[1]


def setup(work, seed=0):
    """The Hugging Face folder, CTranslate2's conversion of it and the imported run, made
    once in ``work``; returns their paths."""
    import torch
    import transformers

    folder, run, ct2 = (os.path.join(work, name) for name in ("hf", "run", "ct2"))
    if not os.path.isfile(os.path.join(folder, "model.safetensors")):
        tokenizer = write_vocabulary(folder, GPT2_SMALL["vocab_size"], english("train"))
        end = tokenizer.convert_tokens_to_ids(END)
        torch.manual_seed(seed)
        config = transformers.GPT2Config(**GPT2_SMALL, bos_token_id=end, eos_token_id=end)
        transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder)
    if not os.path.isfile(os.path.join(ct2, "model.bin")):
        import ctranslate2

        ctranslate2.converters.TransformersConverter(folder).convert(ct2, force=True)
    if not os.path.isfile(os.path.join(run, "model.keras")):
        from transformerkit.importing import import_checkpoint

        import_checkpoint(folder, run, force=True)
    return folder, run, ct2


def prompts(folder, count, length):
    """The first ``count`` test2016 English sentences of at least ``length`` ids, cut to
    ``length`` ids."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    found = []
    for text in english("test2016"):
        ids = tokenizer.encode(text)
        if len(ids) >= length:
            found.append(ids[:length])
        if len(found) == count:
            return found
    raise SystemExit(f"fewer than {count} test sentences have {length} ids")


def generator(system, paths, new_tokens, threads):
    """``generate(prompts) -> [new ids, ...]`` for ``system``."""
    folder, run_dir, ct2 = paths
    if system.startswith("tk-"):
        import transformerkit
        from transformerkit.converters.gpt2 import folder_offset
        from transformerkit.decoding.sampling import generate_ids

        model = transformerkit.load(run_dir).model
        cache = "compiled" if system.startswith("tk-compiled") else True
        precision = next((p for p in ("bfloat16", "int8") if system.endswith(p)), "float32")
        offset = folder_offset(folder)  # our ids: GPT-2's after <pad> and <s>

        def generate(batch):
            found = generate_ids(model, [[i + offset for i in ids] for ids in batch],
                                 new_tokens, min_new_tokens=new_tokens, temperature=0.0,
                                 use_cache=cache, precision=precision)
            return [[i - offset for i in ids] for ids in found]

        return generate
    if system == "hf":
        import torch
        import transformers

        model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()

        def generate(batch):
            ids = torch.tensor(batch)
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                     do_sample=False, max_new_tokens=new_tokens,
                                     min_new_tokens=new_tokens,
                                     pad_token_id=model.config.eos_token_id)
            return out[:, ids.shape[1]:].tolist()

        return generate
    import ctranslate2
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = ctranslate2.Generator(ct2, compute_type=system.split("-")[1], intra_threads=threads)

    def generate(batch):
        tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in batch]
        found = model.generate_batch(tokens, max_length=new_tokens, min_length=new_tokens,
                                     sampling_topk=1, beam_size=1,
                                     include_prompt_in_result=False)
        return [r.sequences_ids[0] for r in found]

    return generate


def worker(spec):
    """Every batch size of one system: a warm-up call (timed: the first call), then
    ``calls`` timed calls."""
    import torch

    import transformerkit

    transformerkit.keep_freed_memory()  # the CLI's malloc setting, for every system alike
    torch.set_num_threads(spec["threads"])
    os.environ["TRANSFORMERKIT_CACHE"] = os.path.join(spec["work"], "cache")
    paths = tuple(spec["paths"])
    started = time.perf_counter()
    generate = generator(spec["system"], paths, spec["new_tokens"], spec["threads"])
    load_seconds = time.perf_counter() - started
    results = []
    for batch_size in spec["batches"]:
        batch = prompts(paths[0], batch_size, spec["prompt_tokens"])
        started = time.perf_counter()
        outputs = generate(batch)
        first = time.perf_counter() - started
        times = []
        for _ in range(spec["calls"]):
            started = time.perf_counter()
            outputs = generate(batch)
            times.append(time.perf_counter() - started)
        if any(len(o) != spec["new_tokens"] for o in outputs):
            raise SystemExit(f"{spec['system']}: not {spec['new_tokens']} new tokens per row")
        results.append(dict(system=spec["system"], batch=batch_size,
                            seconds=round(statistics.median(times), 4), calls=times,
                            first_call_seconds=round(first, 3),
                            load_seconds=round(load_seconds, 3), outputs=outputs))
        load_seconds = 0.0
    return results


def openvino_worker(spec):
    """One round of an ``ov-*`` system: :func:`worker`'s results, measured by
    ``bench/openvino_worker.py`` in the OpenVINO venv (the IR converted once, untimed), or
    ``{"error": ...}``."""
    folder = spec["paths"][0]
    try:
        ir = openvino_peer.converted(folder, os.path.join(spec["work"], "openvino"),
                                     spec["system"].split("-", 1)[1],
                                     "text-generation-with-past", spec["threads"])
    except RuntimeError as error:
        return {"error": str(error)}
    batches = [prompts(folder, size, spec["prompt_tokens"]) for size in spec["batches"]]
    found = openvino_peer.run_worker("causal", dict(model=ir, threads=spec["threads"],
                                                    new_tokens=spec["new_tokens"],
                                                    calls=spec["calls"], batches=batches),
                                     spec["threads"])
    if "error" in found:
        return found
    record = dict({k: v for k, v in found.items() if k != "results"}, ir=ir)
    for r in found["results"]:
        if any(len(o) != spec["new_tokens"] for o in r["outputs"]):
            return {"error": f"{spec['system']}: not {spec['new_tokens']} new tokens per row"}
        r.update(system=spec["system"], openvino=record)
    return found["results"]


def run_all(args, paths):
    """``(results, failed, openvino)``: :func:`summarize`'s rows, the failed rounds and each
    ``ov-*`` system's record (its IR, the OpenVINO venv's packages, CPU name, settings)."""
    timings, failed, openvino = {}, [], {}
    env = {"KERAS_BACKEND": "torch", "OMP_NUM_THREADS": str(args.threads)}
    for round_index in range(args.repeats):
        order = list(args.systems) if round_index % 2 == 0 else list(reversed(args.systems))
        for system in order:
            spec = dict(system=system, paths=paths, work=os.path.abspath(args.work),
                        threads=args.threads, batches=args.batches, calls=args.calls,
                        new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens)
            print(f"... round {round_index + 1}/{args.repeats}: {system}", flush=True)
            if system.startswith("ov-"):
                out = openvino_worker(spec)
            else:
                out = common.run_worker(HERE, ["--worker", json.dumps(spec)], env,
                                        timeout=3600)
            if isinstance(out, dict) and "error" in out:
                print("    failed:", out, flush=True)
                failed.append(dict(system=system, **out))
                continue
            for r in out:
                r["round"] = round_index
                if "openvino" in r:
                    openvino[r["system"]] = r.pop("openvino")
                timings.setdefault((r["system"], r["batch"]), []).append(r)
    return summarize(timings, args.new_tokens), failed, openvino


def summarize(timings, new_tokens):
    """Each (system, batch)'s best round, its tokens per second and its agreement with
    ``transformers``' outputs; a compiled system's compile time (its first round's first
    call) and cached load time (a later round's first call less its timed call)."""
    results = []
    for (system, batch), runs in timings.items():
        best = min(runs, key=lambda r: r["seconds"])
        row = dict(system=system, batch=batch, seconds=best["seconds"],
                   rounds=[r["seconds"] for r in runs],
                   ms_per_token=round(1000 * best["seconds"] / new_tokens, 2),
                   tokens_per_second=round(batch * new_tokens / best["seconds"], 1),
                   load_seconds=max(r["load_seconds"] for r in runs), outputs=best["outputs"])
        if system.startswith("tk-compiled"):
            first = min(runs, key=lambda r: r["round"])
            row["compile_seconds"] = round(first["first_call_seconds"] - first["seconds"], 1)
            later = [r["first_call_seconds"] - r["seconds"] for r in runs if r is not first]
            row["cached_load_seconds"] = round(min(later), 2) if later else None
        results.append(row)
    for row in results:
        peer = next((r for r in results if r["system"] == "hf" and r["batch"] == row["batch"]),
                    None)
        if peer is not None:
            same = sum(a == b for a, b in zip(row["outputs"], peer["outputs"], strict=True))
            row["same_as_hf"] = round(same / len(row["outputs"]), 3)
    order = {name: i for i, name in enumerate(SYSTEMS)}
    return sorted(results, key=lambda r: (r["batch"], order.get(r["system"], len(order))))


def table(results, threads):
    lines = ["| batch | system | ms per new token | new tokens/s | vs transformers | vs CT2 "
             "float32 | vs CT2 int8 | rows equal to transformers' | compile / cached load, s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in results:
        def ratio(peer, row=row):
            other = next((r for r in results if r["system"] == peer
                          and r["batch"] == row["batch"]), None)
            return f"{other['seconds'] / row['seconds']:.2f}x" if other else "-"

        built = (f"{row['compile_seconds']} / {row['cached_load_seconds']}"
                 if "compile_seconds" in row else "")
        same = f"{100 * row['same_as_hf']:.0f}%" if "same_as_hf" in row else "-"
        lines.append(f"| {row['batch']} | {row['system']} | {row['ms_per_token']} | "
                     f"{row['tokens_per_second']} | {ratio('hf')} | {ratio('ct2-float32')} | "
                     f"{ratio('ct2-int8')} | {same} | {built} |")
    lines.append("")
    lines.append(f"{threads} thread(s) per system; \"vs X\": X's time over this row's (above 1: "
                 "faster than X).")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help="comma-separated, of " + ", ".join(SYSTEMS) + " (default: all "
                             "but the ov-* ones, which need .venv-openvino)")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", default="/tmp/gpt2_generate",
                        help="folder of the model, its conversions and compiled packages")
    parser.add_argument("--name", default="gpt2_generate")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
    if any(s.startswith("ov-") for s in args.systems):
        openvino_peer.require_venv()
    args.batches = [int(b) for b in args.batches.split(",")]
    paths = setup(args.work)
    # the compile time is the first call's: no package of an earlier run may be found
    shutil.rmtree(os.path.join(args.work, "cache"), ignore_errors=True)
    results, failed, openvino = run_all(args, paths)
    payload = {"machine": dict(common.machine(), threads_per_system=args.threads),
               "model": GPT2_SMALL, "new_tokens": args.new_tokens,
               "prompt_tokens": args.prompt_tokens, "results": results, "failed": failed}
    if openvino:
        payload["openvino"] = openvino
    common.write_results(args.name, payload, table(results, args.threads))


if __name__ == "__main__":
    main()
