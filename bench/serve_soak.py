"""Soak test of ``transformerkit serve``: minutes of mixed traffic, reported per window.

Starts ``transformerkit serve RUN [GPT_RUN]`` (uvicorn, 127.0.0.1, a free port) and lets
``--clients`` clients (httpx, asyncio, one connection each) send requests for ``--minutes``
minutes, each request drawn at random (seeded) from these classes:

- valid: ``translate`` (1 to 4 texts of varying length: Multi30k test2016 German sentences
  when ``TRANSFORMERKIT_DATA`` has them, else generated German number words; beam 4),
  ``nbest`` (one text, beam 4, n-best 3), ``attention`` (one source, the model's own
  translation as target), ``generate`` and ``generate_stream`` (a GPT run's prompt; the
  streamed form reads the server-sent events to the ``done`` event). Without ``GPT_RUN``
  there is no generation; when the server's OpenAPI schema has no ``stream`` field in the
  ``/generate`` body, no streamed generation (both said in the report's notes);
- invalid, 10% of the requests, each expecting its 4xx: ``bad_json`` (400),
  ``unknown_field``, ``empty_text``, ``too_long`` (422), ``unknown_model`` (404),
  ``wrong_content_type`` (415), ``oversized_body`` (413).

Reported per window of ``--window-s`` seconds (60: per minute): throughput, p50 and p99
latency per class, the answers by outcome (``ok``: the expected status; ``expected_4xx``: an
invalid request refused, ``wrong_4xx`` with a status other than its own; ``unexpected_4xx``:
a valid request refused, 429 queue full included; ``5xx``; ``connection``: no answer) and
the server's resident memory (``VmRSS`` of its process and all its descendants, the workers
of ``--workers``). Goals, printed with pass/fail: no 5xx; RSS growth under 50 MiB from the
end of the first window to the largest reading after it; the p99 latency of the valid
requests of every full window from the second on within 20% of their median.

    python bench/serve_soak.py runs/multi30k_de_en runs/shakespeare_gpt --minutes 10
    # -> bench/results/serve_soak.FAMILY.json, .md; --minutes 0.3 --window-s 6: a short form
"""

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HOST = "127.0.0.1"  # loopback only
MAX_BODY_BYTES = 65536  # the server's --max-body-bytes: an oversized body stays cheap to send
MAX_CHARS = 1000  # the server's --max-chars
VALID_WEIGHTS = {"translate": 0.40, "nbest": 0.12, "attention": 0.08, "generate": 0.15,
                 "generate_stream": 0.15}
INVALID_SHARE = 0.10
INVALID_STATUS = {"bad_json": 400, "unknown_field": 422, "empty_text": 422, "too_long": 422,
                  "unknown_model": 404, "wrong_content_type": 415, "oversized_body": 413}
NUMBER_WORDS = "ein zwei drei vier fuenf sechs sieben acht neun zehn".split()
RSS_EVERY_S = 1.0
GOAL_RSS_MIB = 50.0
GOAL_P99_SPREAD = 0.20


# -- the server -------------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def auth_headers(api_key):
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def get_json(port, path, api_key=None):
    """``(status, body)`` of ``GET path`` (an error status is an answer too)."""
    request = urllib.request.Request(f"http://{HOST}:{port}{path}",
                                     headers=auth_headers(api_key))
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def start_server(args, port, log):
    """``transformerkit serve`` as a subprocess, once ``/health`` says it is ready."""
    command = [sys.executable, "-m", "transformerkit.cli", "serve", *args.runs, "--host", HOST,
               "--port", str(port), "--queue-size", "1024",
               "--max-body-bytes", str(MAX_BODY_BYTES), "--max-chars", str(MAX_CHARS)]
    if args.api_key:
        command += ["--api-key", args.api_key]
    if args.workers > 1:
        command += ["--workers", str(args.workers)]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        try:
            status, body = get_json(port, "/health")
            if status == 200 and body.get("status") in ("ready", "ok"):  # "ok": before readiness
                return process
        except (OSError, ValueError):
            pass
        if process.poll() is not None:
            break
        time.sleep(0.5)
    stop_server(process)
    raise RuntimeError(f"the server did not start; see {log.name}")


def stop_server(process):
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def descendants(pid):
    """``pid`` and every process below it (``/proc/*/stat`` parent ids)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # the command name (2nd field) may hold spaces: split after its ')'
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def rss_mib(pid):
    """Resident memory of ``pid`` and its descendants, MiB (``VmRSS``)."""
    total_kib = 0
    for process in descendants(pid):
        try:
            with open(f"/proc/{process}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total_kib += int(line.split()[1])
                        break
        except OSError:
            continue
    return total_kib / 1024


# -- the traffic ------------------------------------------------------------------------------
def source_sentences(source):
    """German sentences of varying length: Multi30k test2016 when there (``source`` "auto"
    or "multi30k"), else generated number words."""
    path = os.path.join(common.data_dir(), "multi30k", "test2016.de")
    if source != "generated" and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()], "Multi30k test2016 (de)"
    if source == "multi30k":
        raise SystemExit(f"--source multi30k: {path} not found (set TRANSFORMERKIT_DATA)")
    rng = random.Random(0)
    return ([" ".join(rng.choice(NUMBER_WORDS) for _ in range(rng.randint(1, 6)))
             for _ in range(500)], "generated German number words, 1 to 6 words")


def class_weights(has_gpt, streams):
    """The share of each request class (valid ones scaled to 1 - INVALID_SHARE)."""
    valid = dict(VALID_WEIGHTS)
    if not has_gpt:
        valid.pop("generate")
        valid.pop("generate_stream")
    elif not streams:
        valid.pop("generate_stream")
    scale = (1 - INVALID_SHARE) / sum(valid.values())
    weights = {name: share * scale for name, share in valid.items()}
    weights.update({name: INVALID_SHARE / len(INVALID_STATUS) for name in INVALID_STATUS})
    return weights


def build_request(kind, rng, sentences, names, max_new_tokens):
    """``(path, body bytes, content type, expected status)`` of a request of class ``kind``."""
    translator, poet = names
    text = rng.choice(sentences)
    as_json = "application/json"
    if kind == "translate":
        body = {"texts": rng.sample(sentences, rng.randint(1, 4)), "beam_size": 4,
                "max_new_tokens": max_new_tokens}
    elif kind == "nbest":
        body = {"texts": [text], "beam_size": 4, "n_best": 3, "max_new_tokens": max_new_tokens}
    elif kind == "attention":
        body = {"source": text}
    elif kind in ("generate", "generate_stream"):
        body = {"model": poet, "prompt": text.split()[0], "max_new_tokens": max_new_tokens,
                "temperature": 0.8, "top_k": 20, "seed": rng.randrange(1 << 30)}
        if kind == "generate_stream":
            body["stream"] = True
    elif kind == "bad_json":
        return "/translate", b'{"texts": ["' + text.encode() + b'"', as_json, 400
    elif kind == "unknown_field":
        body = {"texts": [text], "beam": 4}
    elif kind == "empty_text":
        body = {"texts": ["   "]}
    elif kind == "too_long":
        body = {"texts": [(text + " ") * (MAX_CHARS // max(len(text), 1) + 2)]}
    elif kind == "unknown_model":
        body = {"texts": [text], "model": "no-such-model"}
    elif kind == "wrong_content_type":
        return "/translate", json.dumps({"texts": [text]}).encode(), "text/plain", 415
    elif kind == "oversized_body":
        body = {"texts": ["x" * (MAX_BODY_BYTES + 1024)]}
    else:
        raise ValueError(f"unknown request class {kind!r}")
    path = {"attention": "/attention", "generate": "/generate",
            "generate_stream": "/generate"}.get(kind, "/translate")
    if path == "/translate":
        body.setdefault("model", translator)
    expected = INVALID_STATUS.get(kind, 200)
    return path, json.dumps(body).encode(), as_json, expected


async def read_stream(answer):
    """Read server-sent events to the end; ``(status, problem)``: problem None when the
    stream ended with ``event: done`` after at least one ``event: token``."""
    events, event = [], None
    async for line in answer.aiter_lines():
        if line.startswith("event:"):
            event = line.partition(":")[2].strip()
        elif line.startswith("data:") and event:
            events.append(event)
            if event == "error":
                return 500, "event: error " + line[5:].strip()[:200]
    if not events or events[-1] != "done":
        return answer.status_code, f"the stream ended without a done event ({events[-3:]})"
    if "token" not in events:
        return answer.status_code, "the stream sent no token event"
    return answer.status_code, None


def outcome_of(kind, status, expected):
    if status >= 500:
        return "5xx"
    if status == expected:
        return "expected_4xx" if expected >= 400 else "ok"
    if kind in INVALID_STATUS and 400 <= status < 500:
        return "wrong_4xx"
    return "unexpected_4xx" if 400 <= status < 500 else "unexpected_status"


async def client(number, session, base, args, plan, records, samples, end):
    """One client: requests one after another until ``end`` (perf_counter)."""
    import httpx

    rng = random.Random(args.seed * 1000 + number)
    kinds, weights = zip(*plan["weights"].items(), strict=True)
    headers = auth_headers(args.api_key)
    while time.perf_counter() < end:
        kind = rng.choices(kinds, weights)[0]
        path, body, content_type, expected = build_request(
            kind, rng, plan["sentences"], plan["names"], args.max_new_tokens)
        request_headers = {**headers, "Content-Type": content_type}
        start = time.perf_counter()
        problem = None
        try:
            if kind == "generate_stream":
                async with session.stream("POST", base + path, content=body,
                                          headers=request_headers) as answer:
                    status, problem = await read_stream(answer)
            else:
                answer = await session.post(base + path, content=body, headers=request_headers)
                status = answer.status_code
                if status != expected:
                    problem = answer.text[:200]
            outcome = outcome_of(kind, status, expected)
            if problem and outcome == "ok":  # a 200 stream that broke off
                outcome = "5xx" if problem.startswith("event: error") else "unexpected_status"
        except httpx.HTTPError as err:
            status, outcome, problem = None, "connection", repr(err)[:200]
        records.append((start, time.perf_counter() - start, kind, outcome, status))
        if outcome not in ("ok", "expected_4xx") and len(samples) < 20:
            samples.append({"class": kind, "status": status, "outcome": outcome,
                            "answer": problem})


async def sample_rss(pid, readings, end):
    while time.perf_counter() < end:
        readings.append((time.perf_counter(), rss_mib(pid)))
        await asyncio.sleep(RSS_EVERY_S)
    readings.append((time.perf_counter(), rss_mib(pid)))


async def soak(port, pid, args, plan):
    """Run the clients and the RSS sampler; returns ``(t0, records, rss readings, samples)``."""
    import httpx

    records, readings, samples = [], [], []
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(limits=limits, timeout=args.request_timeout) as session:
        t0 = time.perf_counter()
        end = t0 + args.minutes * 60
        base = f"http://{HOST}:{port}"
        await asyncio.gather(sample_rss(pid, readings, end),
                             *(client(i, session, base, args, plan, records, samples, end)
                               for i in range(args.clients)))
    return t0, records, readings, samples


# -- the report -------------------------------------------------------------------------------
def percentiles(latencies):
    if not latencies:
        return None, None
    ms = np.array(latencies) * 1000
    return round(float(np.percentile(ms, 50)), 1), round(float(np.percentile(ms, 99)), 1)


def windows_of(t0, records, readings, args):
    """Per window: requests, throughput, latency per class, outcomes and RSS."""
    total_s = args.minutes * 60
    count = max(1, int(np.ceil(total_s / args.window_s - 1e-9)))
    found = []
    for w in range(count):
        start, stop = w * args.window_s, min((w + 1) * args.window_s, total_s)
        inside = [r for r in records if start <= r[0] - t0 < stop]
        by_class = {}
        for kind in sorted({r[2] for r in inside}):
            mine = [r for r in inside if r[2] == kind]
            p50, p99 = percentiles([r[1] for r in mine if r[3] in ("ok", "expected_4xx")])
            by_class[kind] = {"requests": len(mine), "p50_ms": p50, "p99_ms": p99}
        valid = [r[1] for r in inside if r[2] not in INVALID_STATUS and r[3] == "ok"]
        outcomes = {name: 0 for name in ("ok", "expected_4xx", "wrong_4xx", "unexpected_4xx",
                                         "unexpected_status", "5xx", "connection")}
        for r in inside:
            outcomes[r[3]] += 1
        rss = [mib for t, mib in readings if start <= t - t0 <= stop + RSS_EVERY_S]
        found.append({"window": w + 1, "start_s": round(start, 1),
                      "seconds": round(stop - start, 1), "requests": len(inside),
                      "requests_per_s": round(len(inside) / (stop - start), 2),
                      "valid_p50_ms": percentiles(valid)[0],
                      "valid_p99_ms": percentiles(valid)[1], "by_class": by_class,
                      "outcomes": outcomes,
                      "rss_mib_end": round(rss[-1], 1) if rss else None,
                      "rss_mib_max": round(max(rss), 1) if rss else None})
    return found


def goals_of(windows, readings, t0, args):
    """The three goals, each ``{"goal", "value", "pass"}`` (pass None: too short to say)."""
    errors = sum(w["outcomes"]["5xx"] for w in windows)
    goals = [{"goal": "no 5xx answer", "value": errors, "pass": errors == 0}]
    first_end = [mib for t, mib in readings if t - t0 <= args.window_s]
    later = [mib for t, mib in readings if t - t0 > args.window_s]
    if first_end and later:
        growth = max(later) - first_end[-1]
        goals.append({"goal": f"RSS growth after the first window under {GOAL_RSS_MIB:g} MiB",
                      "value": round(growth, 1), "pass": growth < GOAL_RSS_MIB})
    else:
        goals.append({"goal": f"RSS growth after the first window under {GOAL_RSS_MIB:g} MiB",
                      "value": None, "pass": None})
    full = [w["valid_p99_ms"] for w in windows[1:]
            if w["seconds"] >= args.window_s * 0.5 and w["valid_p99_ms"]]
    goal = f"p99 of valid requests within {GOAL_P99_SPREAD:.0%} of the median, window 2 on"
    if len(full) >= 2:
        median = float(np.median(full))
        spread = max(abs(p / median - 1) for p in full)
        goals.append({"goal": goal, "value": round(spread, 3),
                      "pass": spread <= GOAL_P99_SPREAD})
    else:
        goals.append({"goal": goal, "value": None, "pass": None})
    return goals


def verdict(passed):
    return {True: "PASS", False: "FAIL", None: "n/a (too short)"}[passed]


def markdown(payload):
    """The report's tables: per window, per class and window, the goals."""
    windows, unit = payload["windows"], f"{payload['window_s']:g} s"
    lines = [f"`transformerkit serve` soak: {', '.join(payload['run_names'])}, "
             f"{payload['clients']} clients, {payload['minutes']:g} min in windows of {unit}, "
             f"{payload['workers']} worker(s), loopback, {payload['machine']['cores']} cores "
             f"shared by server and clients. Text: {payload['text']}. Classes (share): "
             + ", ".join(f"{k} {v:.0%}" for k, v in payload["class_weights"].items()) + ".",
             *[f"Note: {note}" for note in payload["notes"]], "",
             "| window | requests/s | valid p50 ms | valid p99 ms | ok | expected 4xx | "
             "wrong 4xx | unexpected 4xx | 5xx | connection errors | RSS MiB (end / max) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w in windows:
        o = w["outcomes"]
        lines.append(f"| {w['window']} | {w['requests_per_s']} | {w['valid_p50_ms']} | "
                     f"{w['valid_p99_ms']} | {o['ok']} | {o['expected_4xx']} | "
                     f"{o['wrong_4xx']} | {o['unexpected_4xx'] + o['unexpected_status']} | "
                     f"{o['5xx']} | {o['connection']} | {w['rss_mib_end']} / "
                     f"{w['rss_mib_max']} |")
    kinds = list(payload["class_weights"])
    lines += ["", "p50 / p99 ms per request class and window (invalid classes: time to the "
                  "4xx):", "",
              "| class | " + " | ".join(str(w["window"]) for w in windows) + " |",
              "|---|" + "---:|" * len(windows)]
    for kind in kinds:
        cells = []
        for w in windows:
            found = w["by_class"].get(kind)
            cells.append(f"{found['p50_ms']} / {found['p99_ms']}" if found else "-")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines += ["", "Goals:", ""]
    lines += [f"- {verdict(g['pass'])}: {g['goal']} ({g['value']})" for g in payload["goals"]]
    return "\n".join(lines)


def write_report(out, payload):
    from transformerkit.files import atomic_write_text

    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    atomic_write_text(out + ".json", json.dumps(payload, indent=2))
    table = markdown(payload) + "\n\n" + common.describe(payload["machine"])
    atomic_write_text(out + ".md", table + "\n")
    print(table)


# -- main -------------------------------------------------------------------------------------
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="RUN [GPT_RUN]: a Transformer run, and optionally a GPT run")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window-s", type=float, default=60.0,
                        help="seconds per report window (60: per minute)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--api-key", default=None, help="the server's key, sent as Bearer")
    parser.add_argument("--workers", type=int, default=1, help="the server's --workers")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--source", choices=("auto", "multi30k", "generated"), default="auto",
                        help="texts: Multi30k test2016 when available (auto), or generated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the report (repeatable): how the runs were trained, "
                             "what else ran on the machine")
    parser.add_argument("--out", default=None,
                        help="results path without suffix (.json and .md are written; "
                             "default: bench/results/serve_soak.FAMILY)")
    args = parser.parse_args(argv)
    if len(args.runs) > 2:
        parser.error("give RUN and at most one GPT_RUN")
    args.out = args.out or common.result_stem("serve_soak", common.machine())
    if args.minutes <= 0 or args.window_s <= 0 or args.clients < 1:
        parser.error("--minutes, --window-s and --clients must be positive")
    from transformerkit.serving.server import run_names

    names = run_names(args.runs)
    sentences, text = source_sentences(args.source)
    port = free_port()
    log_path = os.path.join(os.path.dirname(os.path.abspath(args.out)), "tmp",
                            "serve_soak_server.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    notes = list(args.note)
    with open(log_path, "w") as log:
        server = start_server(args, port, log)
        try:
            status, schema = get_json(port, "/openapi.json", args.api_key)
            if status != 200:
                raise SystemExit(f"GET /openapi.json answered {status}: {schema} "
                                 "(--api-key?)")
            body = schema["components"]["schemas"].get("GenerateRequest", {})
            streams = "stream" in body.get("properties", {})
            has_gpt = len(names) == 2
            if not has_gpt:
                notes.append("no GPT_RUN: no /generate traffic")
            elif not streams:
                notes.append("the server's /generate takes no `stream` field (its OpenAPI "
                             "schema): no streamed generation")
            plan = {"weights": class_weights(has_gpt, streams), "sentences": sentences,
                    "names": (names[0], names[1] if has_gpt else None)}
            for note in notes:
                print("note:", note, flush=True)
            t0, records, readings, samples = asyncio.run(soak(port, server.pid, args, plan))
        finally:
            stop_server(server)
    windows = windows_of(t0, records, readings, args)
    goals = goals_of(windows, readings, t0, args)
    payload = {"runs": [os.path.abspath(r) for r in args.runs], "run_names": names,
               "clients": args.clients, "minutes": args.minutes, "window_s": args.window_s,
               "workers": args.workers, "auth": bool(args.api_key),
               "max_new_tokens": args.max_new_tokens, "text": text,
               "streamed_generation": "generate_stream" in plan["weights"],
               "class_weights": {k: round(v, 4) for k, v in plan["weights"].items()},
               "notes": notes, "requests": len(records),
               "load_average_1min": round(os.getloadavg()[0], 2), "windows": windows,
               "goals": goals, "problem_samples": samples, "machine": common.machine()}
    write_report(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
