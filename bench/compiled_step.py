"""What the compiled engine (``--engine compiled``) costs to get: the time to build its
packages, and a one-sentence ``transformerkit translate`` from a shell with each engine.

- **build**: each row bucket's package and the encoder's built into an empty cache folder,
  each in a process of its own (``torch.export`` and AOTInductor with the C++ compiler), seconds;
- **one sentence**: ``transformerkit translate RUN TEXT --beam 1`` as a user runs it from a
  shell, wall time and peak memory of the whole process, for ``--engine keras``,
  ``--engine compiled`` with the packages already on disk (the cached load, which answers
  from them without importing Keras: ``transformerkit/decoding/aot_files.py``) and
  ``--engine compiled --precision bfloat16`` and ``--precision int8`` the same way, and
  ``--engine ctranslate2``
  with the run's export current (which answers without importing Keras), alternating them
  for ``--repeats`` rounds (the best kept; the first call of each, which builds the
  packages or writes the export, is reported apart). The run is
  copied first (its config, tokenizers and ``model.keras``), so the first CTranslate2 call
  does export;
- **one generation** (``--gpt GPT_RUN``, e.g. the GPT-2 124M run ``bench/gpt2_generate.py``
  imports into its ``--work``/run): ``transformerkit generate GPT_RUN --prompt TEXT
  --max-new-tokens 64 --temperature 0`` from a shell, the same way, each engine's text
  compared with the keras engine's (a random-weights model's logits have near-ties, so a
  difference is reported, not raised); and a **long prompt** the same way
  (:data:`LONG_PROMPT`, about 180 tokens, :data:`LONG_NEW_TOKENS` new tokens), which the
  compiled engine's stand-in fills with its prompt package (its first call builds that).

    python bench/compiled_step.py RUN [--gpt GPT_RUN]
    # -> bench/results/compiled_step.FAMILY.{json,md}
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.abspath(__file__)
SENTENCE = "Ein Mann mit einem orangefarbenen Hut starrt auf etwas."
PROMPT = "A man in an orange hat starring at something."
NEW_TOKENS = 64
LONG_PROMPT = " ".join([PROMPT] * 16)
LONG_NEW_TOKENS = 8
# (engine, precision): each system timed; float32 ones must give the keras engine's text
SYSTEMS = (("keras", "float32"), ("compiled", "float32"), ("compiled", "bfloat16"),
           ("compiled", "int8"), ("ctranslate2", "float32"))


def build_worker(spec):
    """Build one bucket's package of the run's model; its seconds."""
    import transformerkit
    from transformerkit.decoding import aot_step

    model = transformerkit.load(spec["run"]).model
    path = os.path.join(spec["directory"], f"step-{spec['bucket']}.pt2")
    started = time.perf_counter()
    aot_step.build_package(model, spec["bucket"], path)
    return {"bucket": spec["bucket"], "seconds": round(time.perf_counter() - started, 1)}


# runs the command and reports its wall seconds and peak memory: a fresh small process, so
# the command's peak (ru_maxrss, which a forked child inherits from its parent and keeps
# across exec) does not start from this bench's own memory
LAUNCHER = """import json, resource, subprocess, sys, time
started = time.perf_counter()
child = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps([time.perf_counter() - started, child.returncode, child.stdout, child.stderr,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024]))
"""


def one_sentence(run, system, cache):
    """``(wall seconds, peak resident MB, output)`` of ``transformerkit translate`` with the
    ``(engine, precision)`` ``system`` in a new process."""
    engine, precision = system
    return _command(["translate", run, SENTENCE, "--beam", "1", "--engine", engine,
                     "--precision", precision], cache)


def one_generation(run, system, cache):
    """``(wall seconds, peak resident MB, output)`` of ``transformerkit generate`` (greedy,
    :data:`NEW_TOKENS` new tokens) with the ``(engine, precision)`` ``system`` in a new
    process."""
    engine, precision = system
    return _command(["generate", run, "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS),
                     "--temperature", "0", "--engine", engine, "--precision", precision],
                    cache)


def _command(arguments, cache):
    """``(wall seconds, peak resident MB, stdout)`` of ``transformerkit ARGUMENTS`` run by
    :data:`LAUNCHER` with the packages' cache ``cache``."""
    env = dict(os.environ, TRANSFORMERKIT_CACHE=cache, KERAS_BACKEND="torch")
    launched = subprocess.run(
        [sys.executable, "-c", LAUNCHER,
         os.path.join(os.path.dirname(sys.executable), "transformerkit"), *arguments],
        capture_output=True, text=True, env=env, check=True)
    seconds, code, out, err, megabytes = json.loads(launched.stdout)
    if code != 0:
        raise SystemExit(f"transformerkit {arguments[0]} failed: {err.strip()[-500:]}")
    return seconds, megabytes, out.strip()


def long_generation(run, system, cache):
    """:func:`one_generation` of :data:`LONG_PROMPT` and :data:`LONG_NEW_TOKENS` new tokens."""
    engine, precision = system
    return _command(["generate", run, "--prompt", LONG_PROMPT, "--max-new-tokens",
                     str(LONG_NEW_TOKENS), "--temperature", "0", "--engine", engine,
                     "--precision", precision], cache)


def timed_engines(run, command, repeats, cache, exact=True):
    """Each system's (:data:`SYSTEMS`) first call and best of ``repeats`` interleaved rounds
    of ``command`` (:func:`one_sentence` or :func:`one_generation`) on ``run``: a list of
    dicts. With ``exact``, a float32 output other than the keras engine's stops the bench;
    else, and at bfloat16 and int8, it is reported (``same_as_keras``)."""
    first = {system: command(run, system, cache) for system in SYSTEMS}
    keras_text = first[SYSTEMS[0]][2]
    best = {system: None for system in SYSTEMS}
    for round_index in range(repeats):
        order = SYSTEMS if round_index % 2 == 0 else SYSTEMS[::-1]
        for system in order:
            seconds, megabytes, text = command(run, system, cache)
            if best[system] is None or seconds < best[system][0]:
                best[system] = (seconds, megabytes)
            if exact and system[1] == "float32" and text != keras_text:
                raise SystemExit(f"{system} gave {text!r}, keras {keras_text!r}")
    return [dict(engine=system[0], precision=system[1],
                 first_call_seconds=round(first[system][0], 2),
                 seconds=round(best[system][0], 2), peak_mb=round(best[system][1]),
                 same_as_keras=first[system][2] == keras_text)
            for system in SYSTEMS]


def copy_run(run, folder):
    """The files of ``run`` that translating reads (no checkpoints, no exports) copied into
    ``folder``; its path."""
    copy = os.path.join(folder, "run")
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(
        "checkpoints", "ctranslate2*", "logs", "huggingface"))
    return copy


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="run directory of a translation model")
    parser.add_argument("--gpt", help="run directory of a GPT: also time a generation")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="compiled_step")
    parser.add_argument("--build-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_worker:
        print(json.dumps(build_worker(json.loads(args.build_worker))))
        return
    if args.run is None:
        parser.error("the run directory (RUN) is required")
    import torch

    from transformerkit.decoding import aot_step

    run = os.path.abspath(args.run)
    builds = []
    with tempfile.TemporaryDirectory() as folder:
        for bucket in (*aot_step.BUCKETS, aot_step.ENCODER):
            out = common.run_worker(HERE, ["--build-worker", json.dumps(
                {"run": run, "bucket": bucket, "directory": folder})],
                {"KERAS_BACKEND": "torch"}, timeout=3600)
            builds.append(out)
    with tempfile.TemporaryDirectory() as cache:
        results = timed_engines(copy_run(run, cache), one_sentence, args.repeats, cache)
    generations, long_generations = [], []
    if args.gpt:
        with tempfile.TemporaryDirectory() as cache:
            gpt = copy_run(os.path.abspath(args.gpt), cache)
            generations = timed_engines(gpt, one_generation, args.repeats, cache, exact=False)
            long_generations = timed_engines(gpt, long_generation, args.repeats, cache,
                                             exact=False)
    payload = {"machine": dict(common.machine(), torch_version=torch.__version__),
               "run": run, "sentence": SENTENCE, "repeats": args.repeats,
               "builds": builds, "results": results, "gpt_run": args.gpt, "prompt": PROMPT,
               "new_tokens": NEW_TOKENS, "generations": generations,
               "long_prompt": LONG_PROMPT, "long_new_tokens": LONG_NEW_TOKENS,
               "long_generations": long_generations}
    lines = ["| what | seconds | peak memory, MB |", "|---|---:|---:|"]
    for build in builds:
        bucket = build.get("bucket")
        what = "encoder" if bucket == aot_step.ENCODER else f"{bucket}-rows"
        lines.append(f"| build the {what} package | "
                     f"{build.get('seconds', build.get('error'))} | |")
    long = f"--prompt LONG ({len(LONG_PROMPT.split())} words) --max-new-tokens {LONG_NEW_TOKENS} "
    for rows, command, cached in (
            (results, "translate RUN TEXT", "packages cached: no Keras"),
            (generations, "generate GPT_RUN", "package cached: no Keras"),
            (long_generations, f"generate GPT_RUN {long}".rstrip(), "package cached: no Keras")):
        lines.extend(_engine_lines(rows, command, cached, args.repeats))
    common.write_results(args.name, payload, "\n".join(lines))


def _engine_lines(rows, command, cached, repeats):
    """The table's lines of :func:`timed_engines`' ``rows`` of ``command``: each system's
    first call, and its best of ``repeats`` (the compiled engine's said to be ``cached``)."""
    again = {"keras": "again", "compiled": cached, "ctranslate2": "export current: no Keras"}
    lines = []
    for r in rows:
        shown = f"`{command} --engine {r['engine']}{_precision(r)}`"
        same = "" if r["same_as_keras"] else " (text differs from keras')"
        lines.append(f"| {shown}, first call{same} | {r['first_call_seconds']} | |")
        lines.append(f"| {shown}, {again[r['engine']]} (best of {repeats}) | "
                     f"{r['seconds']} | {r['peak_mb']} |")
    return lines


def _precision(row):
    """`` --precision P`` of a row not in float32 (the default), else nothing."""
    return "" if row["precision"] == "float32" else f" --precision {row['precision']}"


if __name__ == "__main__":
    main()
