"""Streamed ``POST /generate`` (``"stream": true``, server-sent events) over real HTTP.

uvicorn serves the app in-process on 127.0.0.1 and a free port, on a thread of its own;
httpx reads the stream as a client does, event by event. The runs are the tiny ones of
``conftest.py``. Claims: the events parse, ``done`` comes last and its text is the
unstreamed answer (a seeded draw: exact, the same model call), the pieces join to it; a
client that closes its connection mid-stream stops the decoding (the model's steps, counted
by wrapping the decoders' step adapter, stop growing, and the next request is answered at
once); a stream that lasts longer than the server's timeout is not cut; bad requests get
their JSON errors before any stream begins.
"""

import asyncio
import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from step_counter import StepCounter  # noqa: E402

from transformerkit.decoding.compiled import is_eager_loop  # noqa: E402
from transformerkit.serving.app import create_app  # noqa: E402
from transformerkit.serving.batching import Batcher  # noqa: E402
from transformerkit.serving.limits import Limits  # noqa: E402
from transformerkit.serving.server import load_runs  # noqa: E402

SEEDED = {"prompt": "ein zwei", "model": "poet", "temperature": 0.8, "top_k": 5, "seed": 3,
          "max_new_tokens": 40}


@pytest.fixture(scope="module")
def runs(run_dirs):
    return load_runs(run_dirs)


def serve(app):
    """``(url, server, thread)``: ``app`` under uvicorn on a free port, started."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture(scope="module")
def url(runs):
    address, server, thread = serve(create_app(runs, Limits(max_new_tokens=100_000,
                                                            timeout=20)))
    yield address
    server.should_exit = True
    thread.join(timeout=30)


def events(response):
    """The ``(event, data)`` pairs of a server-sent event stream, as they arrive."""
    name, data = None, []
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data.append(line[len("data: "):])
        elif line == "" and name is not None:
            yield name, json.loads("\n".join(data))
            name, data = None, []


def stream(url, body, timeout=60):
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True},
                      timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        return list(events(response))


def test_pieces_join_to_the_unstreamed_answer(url, runs):
    found = stream(url, SEEDED)
    names = [name for name, _ in found]
    assert names[-1] == "done" and set(names[:-1]) == {"token"} and len(names) > 5
    expected = httpx.post(url + "/generate", json=SEEDED, timeout=60).json()["text"]
    assert expected == runs["poet"].generate("ein zwei", temperature=0.8, top_k=5, seed=3,
                                             max_new_tokens=40)
    assert found[-1][1] == {"model": "poet", "text": expected}
    assert SEEDED["prompt"] + "".join(data["text"] for _, data in found[:-1]) == expected


def test_greedy_beyond_the_context_streams_every_token(url, runs):
    body = {"prompt": "drei", "model": "poet", "temperature": 0, "max_new_tokens": 70,
            "stop_at_eos": False}  # the poet's context is 32 tokens: several windows
    found = stream(url, body)
    assert len(found) == 71  # a token event per token, then done
    assert found[-1][1]["text"] == "drei" + "".join(d["text"] for _, d in found[:-1]) == \
        runs["poet"].generate("drei", temperature=0, max_new_tokens=70, stop_at_eos=False)


def test_a_client_that_goes_away_stops_the_decoding(url, monkeypatch):
    counter = StepCounter(monkeypatch)
    body = {"prompt": "ein", "model": "poet", "max_new_tokens": 100_000, "seed": 1,
            "stop_at_eos": False}
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True},
                      timeout=60) as response:
        assert next(events(response))[0] == "token"
    # closed after the first token: the decoding stops within a few steps
    deadline = time.monotonic() + 20
    while True:
        before = counter.count
        time.sleep(0.5)  # a step takes about a millisecond: 0.5 s without one is stopped
        if counter.count == before:
            break
        assert time.monotonic() < deadline, "the decoding went on after the client left"
    assert counter.count < 20_000  # far from the 100000 asked for
    started = time.monotonic()
    answer = httpx.post(url + "/generate", json={"prompt": "ein", "model": "poet",
                                                 "max_new_tokens": 5, "stop_at_eos": False},
                        timeout=60)
    assert answer.status_code == 200 and time.monotonic() - started < 10
    # the worker was free: only the new request ran (5 steps, or one compiled call)
    assert counter.count == before + (5 if is_eager_loop() else 1)


def test_the_timeout_does_not_cut_a_stream_under_way(runs, monkeypatch):
    StepCounter(monkeypatch, delay=0.02)  # 100 steps: at least 2 s, the timeout is 1 s
    address, server, thread = serve(create_app(runs, Limits(timeout=1.0)))
    try:
        found = stream(address, {"prompt": "ein", "model": "poet", "temperature": 0,
                                 "max_new_tokens": 100, "stop_at_eos": False})
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert [name for name, _ in found] == ["token"] * 100 + ["done"]


def test_no_first_piece_within_the_timeout_is_a_json_503_and_stops_the_job(runs,
                                                                          monkeypatch):
    counter = StepCounter(monkeypatch, delay=0.5)  # the first piece needs 1 s or more
    address, server, thread = serve(create_app(runs, Limits(timeout=0.3)))
    try:
        answer = httpx.post(address + "/generate", timeout=60, json={
            "prompt": "ein", "model": "poet", "max_new_tokens": 60, "stop_at_eos": False,
            "stream": True})
        assert answer.status_code == 503 and "--timeout" in answer.json()["error"]
        deadline = time.monotonic() + 20  # the job stops after the step under way
        while True:
            before = counter.count
            time.sleep(1.5)  # three steps' time
            if counter.count == before:
                break
            assert time.monotonic() < deadline, "the job went on after its 503"
        assert counter.count < 10
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_the_batcher_times_a_stream_until_it_starts_and_then_moves_on():
    """A job that says it has started outlives the timeout; the job that waited behind it
    runs as soon as it ends (no waiting for its client to return, as after a batch)."""
    times = {}

    async def scenario(timeout_s, stream_s):
        loop = asyncio.get_running_loop()
        batcher = Batcher(window_s=0.01, max_batch=4, queue_size=4, timeout_s=timeout_s)
        batcher.start()
        started = asyncio.Event()

        def streaming(inputs):
            loop.call_soon_threadsafe(started.set)
            time.sleep(stream_s)  # the stream under way
            times["stream_ended"] = time.monotonic()
            return [x * 2 for x in inputs]

        def translating(inputs):
            times["next_began"] = time.monotonic()
            return inputs

        stream = asyncio.ensure_future(batcher.submit(["ab"], streaming, None, started))
        await started.wait()
        behind = asyncio.ensure_future(batcher.submit(["c"], translating, "k"))
        results = await asyncio.gather(stream, behind, return_exceptions=True)
        await batcher.stop()
        return results

    stream, behind = asyncio.run(scenario(timeout_s=0.3, stream_s=1.0))
    assert stream == ["abab"]  # not cut by the timeout
    assert isinstance(behind, TimeoutError)  # a job waiting behind it still has one
    assert asyncio.run(scenario(timeout_s=10, stream_s=2.0)) == [["abab"], ["c"]]
    # after a 2 s batch it would wait up to 0.5 s (RETURN_PATIENCE) for returning clients
    assert times["next_began"] - times["stream_ended"] < 0.3


@pytest.mark.parametrize("body, status, message", [
    ({"prompt": "", "model": "poet"}, 422, "prompt"),
    ({"prompt": "ein", "model": "poet", "top_p": 2.0}, 422, "top_p"),
    ({"prompt": "ein", "model": "poet", "stream": "yes"}, 422, "stream"),
    ({"prompt": "ein", "model": "numbers"}, 422, "is a transformer run"),
    ({"prompt": "ein", "model": "nobody"}, 404, "no model named"),
])
def test_bad_streamed_requests_get_json_errors(url, body, status, message):
    answer = httpx.post(url + "/generate", json={"stream": True, **body}, timeout=60)
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/json"
    assert message in answer.json()["error"] and answer.json()["status"] == status
    assert stream(url, {"prompt": "ein", "model": "poet", "max_new_tokens": 3,
                        "stop_at_eos": False})[-1][0] == "done"  # still serving


def test_the_schema_documents_the_stream(url):
    schema = httpx.get(url + "/openapi.json", timeout=60).json()
    generate = schema["paths"]["/generate"]["post"]
    content = generate["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/event-stream"}
    assert "event: done" in content["text/event-stream"]["example"]
    event = content["text/event-stream"]["schema"]  # one event, as a client parses it
    assert event["properties"]["event"]["enum"] == ["token", "done", "error"]
    body = generate["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request = schema["components"]["schemas"][body.rsplit("/", 1)[-1]]
    assert request["properties"]["stream"]["default"] is False
