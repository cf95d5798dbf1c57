"""Shared benchmark plumbing: Multi30k batches, FLOP counts, result files, matmul peak."""

import json
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


_WORDS = re.compile(r"\w+|[^\w\s]")


def tutorial_bleu(hypotheses, references):
    """BLEU as most Multi30k tutorials report it: lower-cased, split into word and
    punctuation tokens, no further tokenization (``tokenize="none"`` on pre-split text);
    the peer column of bench/multi30k_bleu.py (the product reports sacreBLEU's default)."""
    import sacrebleu

    def split(text):
        return " ".join(_WORDS.findall(text.lower()))

    score = sacrebleu.corpus_bleu([split(h) for h in hypotheses],
                                  [[split(r) for r in references]], tokenize="none")
    return round(score.score, 2)


def data_dir():
    path = os.environ.get("TRANSFORMERKIT_DATA") or os.path.join(HERE, "..", "..", "shared",
                                                                 "data")
    return os.path.abspath(path)


def multi30k_batches(num_batches, tokens_per_batch=4096, vocab_size=8000, seed=0, cache=None):
    """``num_batches`` length-bucketed Multi30k de->en training batches of about
    ``tokens_per_batch`` tokens with a shared BPE vocabulary, cached as ``.npz``.

    Returns a list of ``(source, decoder_input, labels)`` int32 arrays.
    """
    cache = cache or os.path.join(RESULTS, "tmp")
    path = os.path.join(cache, f"batches-{num_batches}-{tokens_per_batch}-{vocab_size}.npz")
    if not os.path.exists(path):
        os.environ.setdefault("KERAS_BACKEND", "torch")
        from transformerkit.data.corpora import load_multi30k
        from transformerkit.data.pipeline import TranslationBatches, encode_pairs
        from transformerkit.data.tokenizers import SubwordTokenizer

        src, tgt = load_multi30k("train", "de", "en", data_dir=data_dir())
        tok = SubwordTokenizer.train(src + tgt, kind="bpe", vocab_size=vocab_size)
        batches = TranslationBatches(encode_pairs(src, tgt, tok, tok, 128),
                                     tokens_per_batch=tokens_per_batch, seed=seed)
        batches.set_epoch(0)
        rng = np.random.default_rng(seed)
        chosen = rng.choice(len(batches), size=num_batches, replace=False)
        arrays = {}
        for k, i in enumerate(chosen):
            (s, d), y = batches[int(i)]
            arrays.update({f"s{k}": s, f"d{k}": d, f"y{k}": y})
        os.makedirs(cache, exist_ok=True)
        np.savez(path, **arrays)
    data = np.load(path)
    return [(data[f"s{k}"], data[f"d{k}"], data[f"y{k}"]) for k in range(num_batches)]


def transformer_flops(batch, layers, d_model, d_ff, vocab, decoder_layers=None,
                      output_on_labels_only=False):
    """Forward+backward FLOPs (3x forward) of an encoder-decoder Transformer on one padded
    batch, counting matrix products only (projections, attention, output layer). The output
    layer runs on every padded target position, or with ``output_on_labels_only`` on the real
    (non-padding) label positions only (transformerkit's PyTorch train step)."""
    source, decoder_input, labels = batch
    b, s = source.shape
    t = decoder_input.shape[1]
    decoder_layers = decoder_layers or layers
    d, f = d_model, d_ff
    ns, nt = b * s, b * t
    encoder = layers * (2 * ns * 4 * d * d + 2 * ns * 2 * d * f + 2 * 2 * b * s * s * d)
    decoder = decoder_layers * (
        2 * nt * 4 * d * d + 2 * nt * 2 * d * d + 2 * ns * 2 * d * d + 2 * nt * 2 * d * f
        + 2 * 2 * b * t * t * d + 2 * 2 * b * t * s * d)
    output_rows = int(np.count_nonzero(labels)) if output_on_labels_only else nt
    output = 2 * output_rows * d * vocab
    return 3 * (encoder + decoder + output)


def real_target_tokens(batch):
    return int(np.count_nonzero(batch[2]))


def matmul_peak(seconds=5.0, n=2048, dtype="float32"):
    """Matrix-product GFLOP/s of this machine in ``dtype`` (float32 or bfloat16: oneDNN's
    AMX/AVX512-BF16 kernels where the CPU has them), PyTorch, all threads."""
    import torch

    a, b = (torch.randn(n, n).to(getattr(torch, dtype)) for _ in range(2))
    for _ in range(3):
        a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * n ** 3 * count / (time.perf_counter() - start) / 1e9


def cpu_model():
    """The CPU's model name and its vector extensions (``/proc/cpuinfo`` on Linux)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    vector = [flag for flag in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16",
                                "amx_int8")
              if flag in flags]
    return name, vector


PACKAGES = ("keras", "keras-transformerkit", "ctranslate2", "transformers", "jax",
            "tensorflow", "openvino")  # ours and the peers' a result may depend on


def package_versions(names=PACKAGES):
    """The installed versions of ``names`` (:data:`PACKAGES`; those present), read from their
    metadata without importing them."""
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def machine():
    """What a result was measured on and when: CPU model and vector flags, cores, threads,
    the date and the command line (every figure the README quotes names them)."""
    import torch

    name, vector = cpu_model()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": name, "cpu_flags": vector, "cores": cores,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "versions": package_versions(),
            "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(["python", os.path.relpath(sys.argv[0], os.path.dirname(HERE)),
                                  *sys.argv[1:]])}


def describe(machine_info, commands=None):
    """One line for a results table: ``CPU (flags), N cores, date, `command```; a file
    that gathers several runs (``commands``) names each."""
    flags = machine_info.get("cpu_flags", [])
    if not flags:
        where = ("a CPU not recorded (the file predates the machine records), "
                 f"{machine_info.get('cores', '?')} cores")
    else:
        where = f"{machine_info['cpu']} ({'/'.join(flags)}), {machine_info['cores']} cores"
    date = machine_info.get("date")
    commands = commands or [machine_info.get("command") or "not recorded"]
    return (f"Measured on {where}{', ' + date if date else ''}: "
            + "; ".join(f"`{c}`" if c != "not recorded" else c for c in commands) + ".")


def train_run(config, run_dir, overrides):
    """Run ``transformerkit train CONFIG --out RUN_DIR --set KEY=VALUE ...`` (the shared
    data folder); return its wall-clock seconds."""
    command = [sys.executable, "-m", "transformerkit.cli", "train", config, "--out", run_dir]
    for override in overrides:
        command += ["--set", override]
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=dict(os.environ, TRANSFORMERKIT_DATA=data_dir()))
    return time.perf_counter() - start


def run_worker(script, args, env_extra=None, timeout=1800, python=None, stdin=None,
               env=None):
    """Run ``script`` in a subprocess and return the JSON it prints on its last line, or
    ``{"error": ...}`` (the last line of its standard error). ``python``: the interpreter
    (this one by default: another venv's for a peer); ``stdin``: text for its standard
    input; ``env``: its whole environment (default: this one), ``env_extra`` added."""
    env = dict(os.environ if env is None else env, **(env_extra or {}))
    result = subprocess.run([python or sys.executable, script, *args], input=stdin,
                            capture_output=True, text=True, env=env, timeout=timeout)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else "failed"}
    return json.loads(result.stdout.strip().splitlines()[-1])


ANSWER = "@answer "  # how a kept worker's answer line starts (any other line is its own)


class KeptWorker:
    """A worker process kept running for a whole measurement, so that systems can take
    turns pass by pass (one process each: two systems' OpenMP runtimes must not share
    one) while the machine's speed drifts: ``ask(message)`` writes ``message`` as one JSON
    line to its standard input and returns the JSON of the first line it prints that
    starts with :data:`ANSWER` (its other output is ignored), or ``{"error": ...}`` (the
    last line of its standard error) once it has ended. ``script args`` run with this
    interpreter and this environment, ``env_extra`` added."""

    def __init__(self, script, args, env_extra=None):
        import tempfile

        self._errors = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen([sys.executable, script, *args],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._errors, text=True,
                                        env=dict(os.environ, **(env_extra or {})))

    def ask(self, message):
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps(message) + "\n")
                self.process.stdin.flush()
                for line in self.process.stdout:
                    if line.startswith(ANSWER):
                        return json.loads(line[len(ANSWER):])
            except BrokenPipeError:
                pass
        self.process.wait()
        self._errors.seek(0)
        lines = self._errors.read().strip().splitlines()
        return {"error": lines[-1] if lines else f"ended (exit {self.process.returncode})"}

    def close(self):
        """End the worker (its standard input closed: it returns) and wait for it."""
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        self.process.wait()
        self._errors.close()


# (flag, label): the widest vector feature names a CPU family, first match wins
_FAMILY_FEATURES = (("amx_bf16", "amx"), ("avx512_bf16", "avx512bf16"),
                    ("avx512_vnni", "avx512vnni"), ("avx512f", "avx512"), ("avx2", "avx2"))


def cpu_family(machine_info):
    """The CPU family a result file is named by: the vendor's line and the widest vector
    feature, e.g. ``xeon-amx``, ``epyc-avx512bf16``, ``xeon-avx512vnni``; ``unrecorded``
    for a file whose machine record has no flags."""
    cpu, flags = machine_info.get("cpu", ""), set(machine_info.get("cpu_flags", []))
    line = "epyc" if "EPYC" in cpu else "xeon" if "Xeon" in cpu else "x86"
    for flag, label in _FAMILY_FEATURES:
        if flag in flags:
            return f"{line}-{label}"
    return "unrecorded"


def result_stem(name, machine_info):
    """``results/NAME.FAMILY`` (no suffix): one file per benchmark and CPU family."""
    if not name or os.path.basename(name) != name or name.startswith(".") or "." in name:
        raise SystemExit(f"--name must be a plain file name without folders or dots, "
                         f"got {name!r}")
    return os.path.join(RESULTS, f"{name}.{cpu_family(machine_info)}")


def write_results(name, payload, table):
    """Write ``results/NAME.FAMILY.json`` and ``.md`` (its table and the machine line),
    each atomically: an interrupted run leaves the previous results whole. ``payload``
    holds ``machine`` (:func:`machine`); ``bench/report.py`` puts the tables in the docs."""
    from transformerkit.files import atomic_write_text

    stem = result_stem(name, payload["machine"])
    atomic_write_text(stem + ".json", json.dumps(payload, indent=2))
    table = table + "\n\n" + describe(payload["machine"], payload.get("commands"))
    atomic_write_text(stem + ".md", table + "\n")
    print(table)
