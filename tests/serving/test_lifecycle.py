"""Readiness, graceful shutdown and worker processes of ``transformerkit serve``.

In process (Starlette's TestClient): an application whose runs load in the background says
"starting" (503) until they are loaded, then "ready" and translates; a loader that raises
leaves it "failed" with the error logged; while draining, new requests get 503 with
``Connection: close``; :class:`Admission` counts a streamed answer until its body ends.

As a process (slow: ``python -m transformerkit.cli serve`` of the tiny ``numbers`` run,
``conftest.py``): /health goes starting -> ready; at SIGTERM the queued requests are all
answered, a new one gets 503, /health says "draining", and the process exits 0 in time;
with ``--workers 2`` two worker processes (children of the server) answer, one killed is
replaced, and SIGTERM drains them all (a queued request is answered) and exits 0. In
threads, the draining server's timeout, a second Ctrl-C and a failed load.
"""

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from near_ties import assert_same_texts_or_near_tie

pytest.importorskip("fastapi")
import httpx  # noqa: E402
import uvicorn  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.responses import StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from transformerkit import cli  # noqa: E402
from transformerkit.serving.app import create_app  # noqa: E402
from transformerkit.serving.lifecycle import Admission, Lifecycle  # noqa: E402
from transformerkit.serving.limits import Limits  # noqa: E402
from transformerkit.serving.server import load_runs  # noqa: E402
from transformerkit.serving.shutdown import CLOSE_GRACE_S, DrainingServer  # noqa: E402
from transformerkit.serving.workers import (  # noqa: E402
    METRICS_VARIABLE,
    SETTINGS_VARIABLE,
    cores_available,
    metrics_folder,
    share_threads,
    worker_settings,
)

SENTENCES = ["ein zwei drei", "vier fuenf", "sechs sieben", "acht neun zehn"]


@pytest.fixture(scope="module")
def runs(run_dirs):
    return load_runs(run_dirs[:1])


def poll(check, seconds, what):
    """``check()`` until it returns a true value (returned), for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"no {what} within {seconds} s")


# -- in process ---------------------------------------------------------------------------------
def test_starting_until_the_loader_returns_then_ready(runs):
    release = threading.Event()

    def loader():
        assert release.wait(60), "the test never released the loader"
        return runs

    with TestClient(create_app(loader)) as client:
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "starting"
        assert client.head("/health").status_code == 503
        refused = client.post("/translate", json={"texts": ["ein zwei"]})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json() == {"error": "the server is starting: its models are loading; "
                                           "try again shortly", "status": 503}
        assert refused.headers.get("connection") != "close"  # come back to this one
        assert client.get("/models").status_code == 503
        assert client.get("/").status_code == 200  # the page needs no model
        release.set()
        ready = poll(lambda: (answer := client.get("/health")).status_code == 200 and answer,
                     30, "ready /health").json()
        assert ready["status"] == "ready" and ready["models"] == ["numbers"]
        assert ready["pid"] == os.getpid() and ready["in_flight"] == 0
        answer = client.post("/translate", json={"texts": SENTENCES, "beam_size": 1})
        assert answer.status_code == 200, answer.text
        expected = runs["numbers"].translate(SENTENCES, beam_size=1)
        assert answer.json()["translations"] == expected  # the same call on the same batch
        assert client.get("/models").json()["default"] == "numbers"


def test_a_loader_that_raises_fails_clearly(caplog):
    def loader():
        raise FileNotFoundError("runs/missing is not a run directory: no config.yaml in it")

    caplog.set_level(logging.ERROR, logger="transformerkit.serve")
    with TestClient(create_app(loader)) as client:
        health = poll(lambda: (answer := client.get("/health")).json()["status"] != "starting"
                      and answer, 30, "failure")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        refused = client.post("/translate", json={"texts": ["ein"]})
        assert refused.status_code == 503 and "could not load" in refused.json()["error"]
        lifecycle = client.app.state.lifecycle
        assert isinstance(lifecycle.failure, FileNotFoundError)
    assert ("could not load the runs: FileNotFoundError: runs/missing is not a run directory"
            in caplog.text)


def test_draining_refuses_new_requests_and_closes_their_connections(runs):
    with TestClient(create_app(runs)) as client:
        assert client.get("/health").json()["status"] == "ready"
        client.app.state.lifecycle.drain()
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        refused = client.post("/translate", json={"texts": ["ein"]})
        assert refused.status_code == 503 and refused.headers["connection"] == "close"
        assert refused.json()["error"].startswith("the server is shutting down")
        assert refused.headers["retry-after"] == "1"


def test_admission_counts_a_streamed_answer_until_its_body_ends():
    """In flight from the request until the last chunk of a streamed body is sent."""
    chunks = asyncio.Queue()

    async def stream(request):
        async def body():
            while (chunk := await chunks.get()) is not None:
                yield chunk

        return StreamingResponse(body(), media_type="text/plain")

    lifecycle = Lifecycle()
    lifecycle.ready()
    app = Admission(Starlette(routes=[Route("/stream", stream)]), lifecycle)

    async def scenario():
        sent, requested, gone = [], [], asyncio.Event()

        async def receive():  # the request once, then a client that stays until the end
            if not requested:
                requested.append(True)
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": "/stream", "raw_path": b"/stream",
                 "root_path": "", "query_string": b"", "headers": [],
                 "server": ("test", 80), "client": ("test", 1)}
        request = asyncio.ensure_future(app(scope, receive, send))
        await chunks.put(b"first")
        while not any(m.get("body") == b"first" for m in sent):
            await asyncio.sleep(0)
        assert lifecycle.in_flight == 1
        assert not await lifecycle.wait_idle(0.05)  # the body has not ended
        await chunks.put(None)
        assert await lifecycle.wait_idle(5)
        await request
        assert lifecycle.in_flight == 0 and sent[0]["status"] == 200

    asyncio.run(scenario())


# -- the draining server, in a thread (handle_exit called as the signal would) -----------------
@contextlib.contextmanager
def draining_server(app, shutdown_timeout):
    """A :class:`DrainingServer` serving ``app`` on a free port in a thread; yields
    ``(server, url, thread)``."""
    server = DrainingServer(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=CLOSE_GRACE_S),
                            shutdown_timeout)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        poll(lambda: server.started or not thread.is_alive(), 60, "server start")
        sockets = server.servers[0].sockets  # none left if it stopped already
        yield server, sockets and f"http://127.0.0.1:{sockets[0].getsockname()[1]}", thread
    finally:
        server.should_exit = True
        thread.join(30)


def test_sigterm_drains_the_queue_then_stops(runs):
    app = create_app(runs, Limits(batch_window_ms=1000))
    with draining_server(app, shutdown_timeout=30) as (server, url, thread):
        with ThreadPoolExecutor(2) as pool:
            queued = [pool.submit(httpx.post, url + "/translate", timeout=30,
                                  json={"texts": [text], "beam_size": 1})
                      for text in SENTENCES[:2]]
            poll(lambda: len(app.state.batcher.waiting) == 2, 10, "queued requests")
            server.handle_exit(signal.SIGTERM, None)
            late = httpx.post(url + "/translate", json={"texts": ["ein"]}, timeout=10)
            assert late.status_code == 503 and late.headers["connection"] == "close"
            answers = [future.result() for future in queued]
        assert [a.status_code for a in answers] == [200, 200]
        thread.join(CLOSE_GRACE_S + 10)
        assert not thread.is_alive() and server.exit_code == 0 and not server.force_exit


def test_past_the_shutdown_timeout_the_server_stops_anyway(runs, caplog):
    caplog.set_level(logging.INFO, logger="transformerkit.serve")
    app = create_app(runs, Limits(batch_window_ms=20_000))  # waits longer than the test
    with draining_server(app, shutdown_timeout=0.5) as (server, url, thread):
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(httpx.post, url + "/translate", json={"texts": ["ein"]},
                                 timeout=30)
            poll(lambda: len(app.state.batcher.waiting) == 1, 10, "a queued request")
            signalled = time.monotonic()
            server.handle_exit(signal.SIGTERM, None)
            thread.join(0.5 + CLOSE_GRACE_S + 10)
            assert not thread.is_alive(), "the server did not stop"
            assert time.monotonic() - signalled >= 0.5  # it waited for the request first
            cut = queued.result()  # cut off, and told so
            assert cut.status_code == 503 and cut.headers["connection"] == "close"
            assert cut.json()["error"].startswith("the server stopped before the request")
    assert "shutdown timeout (0.5 s) passed with 1 request(s) in flight" in caplog.text


def test_a_second_sigint_stops_at_once(runs):
    app = create_app(runs, Limits(batch_window_ms=20_000))
    with draining_server(app, shutdown_timeout=60) as (server, url, thread):
        with ThreadPoolExecutor(1) as pool:
            pool.submit(httpx.post, url + "/translate", json={"texts": ["ein"]}, timeout=30)
            poll(lambda: len(app.state.batcher.waiting) == 1, 10, "a queued request")
            server.handle_exit(signal.SIGINT, None)
            server.handle_exit(signal.SIGTERM, None)  # (the supervisor's) changes nothing
            assert app.state.lifecycle.state == "draining" and not server.should_exit
            server.handle_exit(signal.SIGINT, None)  # Ctrl-C again
            assert server.force_exit
            thread.join(10)
            assert not thread.is_alive()


def test_the_server_stops_with_status_1_when_the_runs_cannot_be_loaded():
    def loader():
        raise ValueError("no such run")

    with draining_server(create_app(loader), shutdown_timeout=30) as (server, url, thread):
        thread.join(30)
        assert not thread.is_alive() and server.exit_code == 1


@pytest.mark.parametrize("arguments, message", [
    (["--workers", "0"], "--workers must be a whole number of at least 1, got 0"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout must be 0 or more seconds"),
])
def test_serve_refuses_bad_process_options(run_dirs, capsys, arguments, message):
    assert cli.main(["serve", str(run_dirs[0]), *arguments]) == 2
    assert message in capsys.readouterr().err


def test_serve_refuses_a_folder_that_is_no_run_before_starting(tmp_path, capsys):
    assert cli.main(["serve", str(tmp_path)]) == 2
    assert "is not a run directory: no config.yaml in it" in capsys.readouterr().err


# -- as a process --------------------------------------------------------------------------------
SHUTDOWN_TIMEOUT = 20
EXIT_MARGIN = 30  # for the interpreter's exit with Keras loaded: seconds on a busy machine


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(run_dir, folder, *options):
    """``transformerkit serve run_dir *options`` on a free port; ``(process, url, log)``."""
    port = free_port()
    log = folder / "serve.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "transformerkit.cli", "serve", str(run_dir), "--port", str(port),
         *options], stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    return process, f"http://127.0.0.1:{port}", log


def health(url):
    """``(status code, JSON)`` of ``GET /health`` on a new connection; None if refused."""
    try:
        answer = httpx.get(url + "/health", timeout=10)
    except httpx.TransportError:
        return None
    return answer.status_code, answer.json()


def queue_depth(url):
    """The requests waiting for the model in every worker of the server at ``url``: its
    ``/metrics`` gauge, which any worker answers with the sum over all (``/health`` tells
    only the waiting of the worker that takes the connection); None if refused."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.TransportError:
        return None
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "transformerkit_queue_depth" for sample in family.samples)


def wait_ready(process, url, log, seconds=180):
    """The states ``/health`` said until "ready" (polled every 50 ms)."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        answer = health(url)
        if answer is not None and (not seen or seen[-1] != answer[1]["status"]):
            assert answer[0] == (200 if answer[1]["status"] == "ready" else 503), answer
            seen.append(answer[1]["status"])
        if seen and seen[-1] == "ready":
            return seen
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"the server did not become ready (seen: {seen}):\n{log.read_text()[-3000:]}")


def stop(process):
    if process.poll() is None:
        process.kill()
        process.wait(10)


def ended_within(process, seconds):
    """The exit status of ``process`` if it ends within ``seconds``, else a failure."""
    try:
        return process.wait(seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server still runs {seconds} s after SIGTERM")


@pytest.mark.slow
def test_serve_is_ready_after_loading_and_drains_at_sigterm(run_dirs, runs, tmp_path):
    """Requests queued in a long batch window when SIGTERM comes are all answered; a new
    one gets 503; the process exits 0 within --shutdown-timeout."""
    process, url, log = start_serve(run_dirs[0], tmp_path, "--batch-window-ms", "1500",
                                    "--shutdown-timeout", str(SHUTDOWN_TIMEOUT))
    try:
        # nothing in between; "starting" is missed when the tiny run loads before the first
        # poll (the in-process tests above hold the loader to see it every time)
        assert wait_ready(process, url, log) in (["starting", "ready"], ["ready"])
        with ThreadPoolExecutor(len(SENTENCES)) as pool:
            queued = [pool.submit(httpx.post, url + "/translate", timeout=60,
                                  json={"texts": [text], "beam_size": 1})
                      for text in SENTENCES]
            poll(lambda: health(url)[1]["waiting"] == len(SENTENCES), 10, "queued requests")
            process.send_signal(signal.SIGTERM)
            late = httpx.post(url + "/translate", json={"texts": ["ein"]}, timeout=10)
            assert late.status_code == 503 and late.headers["connection"] == "close"
            assert health(url) == (503, {"status": "draining", "pid": process.pid})
            answers = [future.result() for future in queued]
        assert [a.status_code for a in answers] == [200] * len(SENTENCES)
        got = [a.json()["translations"][0] for a in answers]
        # the server ran the four in one batch, in an order of its own: near-tie tolerance
        assert_same_texts_or_near_tie(runs["numbers"], SENTENCES, got,
                                      runs["numbers"].translate(SENTENCES, beam_size=1))
        assert ended_within(process, SHUTDOWN_TIMEOUT + EXIT_MARGIN) == 0, log.read_text()
        assert "shutdown timeout" not in log.read_text()  # it stopped once they were done
    finally:
        stop(process)


@pytest.mark.slow
def test_sigterm_while_the_runs_load_ends_the_process_with_status_0(run_dirs, tmp_path):
    """The loading thread cannot be stopped: the process exits without it (PyTorch torn
    down under it would abort the process)."""
    process, url, log = start_serve(run_dirs[0], tmp_path, str(run_dirs[1]))  # both runs
    try:
        poll(lambda: health(url), 180, "an answer")  # the first comes before the runs load
        process.send_signal(signal.SIGTERM)
        assert ended_within(process, SHUTDOWN_TIMEOUT + EXIT_MARGIN) == 0, log.read_text()
    finally:
        stop(process)


def parent_of(pid):
    """The parent process id of ``pid`` (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the process tree in /proc")
def test_two_workers_serve_a_killed_one_is_replaced_all_drain_at_sigterm(run_dirs, runs, tmp_path):
    """Two worker processes of the server answer; one killed is replaced; at SIGTERM to the
    server every worker drains (a queued request is answered) and all exit, status 0."""
    process, url, log = start_serve(run_dirs[0], tmp_path, "--workers", "2",
                                    "--batch-window-ms", "3000",
                                    "--shutdown-timeout", str(SHUTDOWN_TIMEOUT))
    try:
        wait_ready(process, url, log)
        pids = set()

        def workers_answered(count):  # each request on a new connection: any worker may take it
            answer = health(url)
            if answer and answer[0] == 200:
                pids.add(answer[1]["pid"])
            return len(pids) == count

        poll(lambda: workers_answered(2), 120, "answers from two worker processes")
        assert {parent_of(pid) for pid in pids} == {process.pid}
        first = set(pids)
        os.kill(min(first), signal.SIGKILL)  # the server starts another worker
        poll(lambda: workers_answered(3), 180, "an answer from a new worker")
        assert [parent_of(pid) for pid in pids - first] == [process.pid]
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(httpx.post, url + "/translate", timeout=60,
                                 json={"texts": ["ein zwei"], "beam_size": 1})
            poll(lambda: queue_depth(url) == 1, 10, "a queued request")
            process.send_signal(signal.SIGTERM)
            answer = queued.result()
        assert answer.status_code == 200, answer.text
        assert answer.json()["translations"] == runs["numbers"].translate(["ein zwei"],
                                                                          beam_size=1)
        assert ended_within(process, SHUTDOWN_TIMEOUT + EXIT_MARGIN) == 0, log.read_text()
        text = log.read_text()
        assert text.count("draining: ") == 2 and "draining: 1 request(s) in flight" in text
        assert "shutdown timeout" not in text and "Traceback" not in text, text[-3000:]
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or parent_of(pid) != process.pid
    finally:
        stop(process)


# -- the pieces of --workers ------------------------------------------------------------------
def test_the_metrics_folder_is_fresh_and_removed_unless_the_user_set_one(monkeypatch, tmp_path):
    monkeypatch.delenv(METRICS_VARIABLE, raising=False)
    with metrics_folder() as folder:
        assert os.environ[METRICS_VARIABLE] == folder and os.path.isdir(folder)
        assert not os.listdir(folder)
    assert METRICS_VARIABLE not in os.environ and not os.path.exists(folder)
    monkeypatch.setenv(METRICS_VARIABLE, str(tmp_path))
    with metrics_folder() as folder:
        assert folder == str(tmp_path)
    assert os.environ[METRICS_VARIABLE] == str(tmp_path) and tmp_path.is_dir()


def test_each_worker_takes_its_share_of_the_cores(monkeypatch):
    torch = pytest.importorskip("torch")
    import keras

    if keras.backend.backend() != "torch":
        pytest.skip("the threads are PyTorch's")
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert share_threads(1) is None and torch.get_num_threads() == before
        share = max(1, cores_available() // 3)
        assert share_threads(3) == share and torch.get_num_threads() == share
        torch.set_num_threads(before)  # the ctranslate2 engine's: returned, torch's unset
        assert share_threads(3, "ctranslate2") == share and torch.get_num_threads() == before
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's choice stands
        assert share_threads(3) is None and torch.get_num_threads() == before
        assert share_threads(3, "ctranslate2") is None
    finally:
        torch.set_num_threads(before)


def test_the_worker_factory_needs_the_settings_of_serve(monkeypatch):
    monkeypatch.delenv(SETTINGS_VARIABLE, raising=False)
    with pytest.raises(RuntimeError, match="started by transformerkit serve --workers"):
        worker_settings()
