"""Memory and start of ``transformerkit serve --workers N --engine E``: the resident memory
(RSS) of the server process and of each worker process once every worker answers
``/health`` "ready", and the seconds from starting the command to that.

For each engine of ``--engines`` and each N of ``--workers``, starts ``transformerkit
serve RUN --workers N --engine E`` on 127.0.0.1 (a free port), asks ``/health`` on new
connections until each of the N workers has answered "ready" (its ``pid``), reads
``VmRSS`` from ``/proc/PID/status`` (Linux) of the server and of each worker, and stops the
server with SIGTERM. With one worker the server process is the worker. The ctranslate2
engine's export is written first (by a ``translate``), so that its servers start from a
current export, as a deployment's do.

    python bench/serve_memory.py --run runs/multi30k_de_en --workers 1 2 --engines keras ctranslate2

writes ``bench/results/serve_memory.FAMILY.{json,md}``.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HOST = "127.0.0.1"


def rss_mib(pid):
    """The resident memory of process ``pid`` in MiB (``/proc/PID/status``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def ready_workers(url, workers, seconds):
    """The pids of ``workers`` worker processes that answered "ready", within ``seconds``."""
    import httpx

    pids = set()
    deadline = time.monotonic() + seconds
    while len(pids) < workers and time.monotonic() < deadline:
        try:
            answer = httpx.get(url + "/health", timeout=10)  # a new connection each time
            if answer.status_code == 200:
                pids.add(answer.json()["pid"])
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    if len(pids) < workers:
        raise RuntimeError(f"{len(pids)} of {workers} workers ready after {seconds} s")
    return sorted(pids)


def measure(run, workers, engine, timeout):
    """``{"engine", "workers", "ready_seconds", "server_mib", "worker_mib": [...],
    "total_mib"}`` of one server."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "transformerkit.cli", "serve", run,
                               "--host", HOST, "--port", str(port), "--workers", str(workers),
                               "--engine", engine])
    try:
        pids = ready_workers(f"http://{HOST}:{port}", workers, timeout)
        ready = time.perf_counter() - start
        server_mib = rss_mib(server.pid)
        worker_mib = [rss_mib(pid) for pid in pids if pid != server.pid]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    return {"engine": engine, "workers": workers, "ready_seconds": round(ready, 2),
            "server_mib": round(server_mib),
            "worker_mib": [round(m) for m in worker_mib],
            "total_mib": round(server_mib + sum(worker_mib))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the run directory to serve")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--engines", nargs="+", default=["keras"],
                        choices=["keras", "compiled", "ctranslate2"])
    parser.add_argument("--timeout", type=float, default=600, help="seconds to get ready")
    parser.add_argument("--name", default="serve_memory", help="results file name")
    args = parser.parse_args()
    import transformerkit

    run = transformerkit.load(args.run)
    parameters = int(run.count_params())
    if "ctranslate2" in args.engines:
        run.translate("a", engine="ctranslate2")  # the export, current before the servers
    rows = [measure(args.run, n, engine, args.timeout)
            for engine in args.engines for n in args.workers]
    table = "\n".join([
        f"`transformerkit serve` of `{os.path.basename(os.path.normpath(args.run))}` "
        f"({parameters:,} parameters), ready and idle: seconds from the command to ready, "
        "resident memory (MiB)", "",
        "| engine | workers | seconds to ready | server process | each worker | total |",
        "|---|---|---:|---:|---|---:|",
        *(f"| {r['engine']} | {r['workers']} | {r['ready_seconds']:.1f} | {r['server_mib']} | "
          f"{', '.join(map(str, r['worker_mib'])) or '(the server is the worker)'} | "
          f"{r['total_mib']} |" for r in rows)])
    common.write_results(args.name, {"run": args.run, "parameters": parameters,
                                     "rows": rows, "machine": common.machine()}, table)


if __name__ == "__main__":
    main()
