"""Load on ``transformerkit serve``: 1, 8 and 32 concurrent clients on loopback.

Starts ``transformerkit serve RUN`` (uvicorn, 127.0.0.1, a free port) and, for each number
of clients, first translates the benchmark sentences offline in this process with
``Run.translate`` (the same run, search options and batch size; the server sits idle), then
lets that many clients (httpx, asyncio, one connection each) send one sentence per request
to ``POST /translate`` for ``--duration`` seconds or ``--max-requests`` requests, whichever
comes first. The sentences are the first ``--sentences`` of Multi30k test2016 (German),
cycled. Reported per level: requests/s, sentences/s, p50/p95/p99 latency, errors (any
answer but 200, or a failed connection), sentences per model call, and the ratio of the
server's sentences/s to the offline sentences/s (the mean of the offline passes just before
and just after the level, with the machine's load average: other processes on the machine
change both).

``--workers 1 2`` serves with one, then two worker processes (each level again per server;
sentences per model call counted from ``GET /metrics``, which sums the workers).

    python bench/serve_load.py --run runs/multi30k_de_en   # -> results/serve_load.FAMILY.*
    python bench/serve_load.py --run runs/multi30k_de_en --workers 1 2 --clients 32
                                                           # -> serve_load_workers.FAMILY.*
"""

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HOST = "127.0.0.1"  # loopback only


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(args, port, log, workers=1):
    command = [sys.executable, "-m", "transformerkit.cli", "serve", args.run, "--host", HOST,
               "--port", str(port), "--engine", args.engine,
               "--max-batch-texts", str(args.batch), "--queue-size", "1024",
               "--batch-window-ms", str(args.window_ms), "--workers", str(workers)]
    if args.engine != "ctranslate2":
        command += ["--precision", args.precision]
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if health(port)["status"] == "ready":
                return process
        except OSError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError(f"the server did not start; see {log.name}")


def health(port):
    with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=30) as answer:
        return json.loads(answer.read())


def model_calls(port):
    """The server's model calls so far, every worker's (``GET /metrics``:
    ``transformerkit_model_call_seconds_count``, summed over the workers' files)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == "transformerkit_model_call_seconds_count")


async def load(url, sentences, clients, duration, max_requests, options):
    """Run ``clients`` concurrent clients; returns latencies (s) of successes, errors and
    the wall time."""
    import httpx

    latencies, errors = [], []
    sent = 0
    end = time.perf_counter() + duration

    async def client(number, session):
        nonlocal sent
        k = number
        while time.perf_counter() < end and sent < max_requests:
            sent += 1
            body = {"texts": [sentences[k % len(sentences)]], **options}
            k += clients
            start = time.perf_counter()
            try:
                answer = await session.post(url, json=body)
                if answer.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors.append(f"{answer.status_code}: {answer.text[:200]}")
            except httpx.HTTPError as error:
                errors.append(repr(error))

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=120) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(i, session) for i in range(clients)))
        wall = time.perf_counter() - start
    return latencies, errors, wall


def offline(run, sentences, args):
    start = time.perf_counter()
    run.translate(sentences, beam_size=args.beam, max_new_tokens=args.max_new_tokens,
                  batch_size=args.batch, engine=args.engine,
                  precision=None if args.engine == "ctranslate2" else args.precision)
    return len(sentences) / (time.perf_counter() - start)


def measure_level(args, run, sentences, port, url, clients, workers, options):
    """One level: ``clients`` clients for ``--duration`` s, between two offline passes."""
    before = offline(run, sentences, args)
    calls = model_calls(port)
    latencies, errors, wall = asyncio.run(load(
        url, sentences, clients, args.duration, args.max_requests, options))
    calls = model_calls(port) - calls
    after = offline(run, sentences, args)
    offline_rate = (before + after) / 2
    ms = np.array(latencies) * 1000
    rate = len(latencies) / wall
    return {"workers": workers, "clients": clients, "requests": len(latencies) + len(errors),
            "seconds": round(wall, 2), "requests_per_s": round(rate, 2),
            "sentences_per_s": round(rate, 2),
            "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p95_ms": round(float(np.percentile(ms, 95)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1),
            "errors": len(errors), "error_samples": errors[:3],
            "mean_batch": round((len(latencies) + len(errors)) / max(calls, 1), 1),
            "offline_sentences_per_s": round(offline_rate, 2),
            "offline_before_after": [round(before, 2), round(after, 2)],
            "load_average_1min": round(os.getloadavg()[0], 2),
            "ratio_to_offline": round(rate / offline_rate, 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/multi30k_de_en")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per level")
    parser.add_argument("--max-requests", type=int, default=2000, help="per level")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64, help="sentences per model call")
    parser.add_argument("--engine", choices=("keras", "compiled", "ctranslate2"),
                        default="keras")
    parser.add_argument("--precision", choices=("float32", "bfloat16", "int8", "auto"),
                        default="float32", help="the keras and compiled engines' products")
    parser.add_argument("--threads", type=int, default=0,
                        help="PyTorch threads of the server and of the offline pass "
                             "(0: PyTorch's default)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1],
                        help="the server's --workers: one server per value, each through "
                             "every level (results named serve_load_workers if any is > 1)")
    parser.add_argument("--window-ms", type=float, default=10.0,
                        help="the server's --batch-window-ms (10, its default)")
    parser.add_argument("--name", default=None,
                        help="results/NAME.{json,md} (default: serve_load[_ENGINE]"
                             "[_PRECISION][_workers])")
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import transformerkit
    from transformerkit.data.corpora import load_multi30k

    sources, _ = load_multi30k("test2016", "de", "en", data_dir=common.data_dir())
    sentences = sources[:args.sentences]
    run = transformerkit.load(args.run)
    offline(run, sentences, args)  # warm-up
    options = {"beam_size": args.beam, "max_new_tokens": args.max_new_tokens}
    os.makedirs(common.RESULTS, exist_ok=True)
    log_path = os.path.join(common.RESULTS, "tmp", "serve_load_server.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    levels = []
    with open(log_path, "w") as log:
        for workers in args.workers:
            port = free_port()
            url = f"http://{HOST}:{port}/translate"
            server = start_server(args, port, log, workers)
            try:
                asyncio.run(load(url, sentences, 1, 5.0, 4, options))  # warm-up
                for clients in args.clients:
                    levels.append(measure_level(args, run, sentences, port, url, clients,
                                                workers, options))
                    print(json.dumps(levels[-1]), flush=True)
            finally:
                server.terminate()
                server.wait(timeout=60)
    payload = {"run": os.path.abspath(args.run), "engine": args.engine,
               "precision": args.precision, "beam_size": args.beam,
               "batch_window_ms": args.window_ms, "threads": args.threads,
               "max_new_tokens": args.max_new_tokens, "batch": args.batch,
               "sentences": len(sentences), "duration_s": args.duration,
               "max_requests": args.max_requests, "machine": common.machine(),
               "date": time.strftime("%Y-%m-%d"), "levels": levels}
    rows = [f"| {x['workers']} | {x['clients']} | {x['requests_per_s']} | {x['sentences_per_s']} | "
            f"{x['p50_ms']} | {x['p95_ms']} | {x['p99_ms']} | {x['errors']} | {x['mean_batch']} | "
            f"{x['offline_sentences_per_s']} | **{x['ratio_to_offline']}** |" for x in levels]
    table = "\n".join([
        f"`transformerkit serve` under load: {os.path.basename(os.path.normpath(args.run))}, "
        f"engine {args.engine} ({args.precision}), beam {args.beam}, one test2016 sentence "
        "per request, "
        f"{args.duration:g} s per level, loopback, {common.machine()['cores']} cores shared by "
        "server and clients.",
        "",
        "| workers | clients | requests/s | sentences/s | p50 ms | p95 ms | p99 ms | errors | "
        "sentences per model call | offline sentences/s | server / offline |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows])
    name = "serve_load" if args.engine == "keras" else f"serve_load_{args.engine}"
    if args.precision != "float32":
        name += f"_{args.precision}"
    if max(args.workers) > 1:
        name += "_workers"
    common.write_results(args.name or name, payload, table)


if __name__ == "__main__":
    main()
