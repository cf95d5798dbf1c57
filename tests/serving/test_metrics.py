"""``GET /metrics``: the server's Prometheus metrics, scraped in-process (Starlette's
TestClient) from the two tiny runs of ``conftest.py`` and parsed with prometheus_client's
own parser.

After a known sequence of requests every count is exact: answers by route template, method
and status (unknown paths under one label), the latency histograms' counts, refusals by
status, inputs per model call, texts and tokens answered per model (the runs' tokenizers are
character-level: a text's tokens are its characters). Also: a streamed answer is timed to
the end of its body, a fault counts as 500, each application counts on its own registry,
and with ``PROMETHEUS_MULTIPROC_DIR`` (several workers) a scrape sums the workers' counts.
"""

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client import (  # noqa: E402
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from transformerkit.serving.app import create_app  # noqa: E402
from transformerkit.serving.limits import Limits  # noqa: E402
from transformerkit.serving.metrics import RequestMetrics, ServerMetrics, route_of  # noqa: E402
from transformerkit.serving.server import load_runs  # noqa: E402

SENTENCES = ["ein zwei drei", "vier fuenf", "sechs sieben acht neun", "zehn ein",
             "zwei zwei drei vier", "acht"]


@pytest.fixture(scope="module")
def runs(run_dirs):
    return load_runs(run_dirs)


def parse(text):
    """``{sample name: {labels (sorted (name, value) pairs): value}}`` of a scrape."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def scrape(client):
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(response.text)


def by(samples, *names):
    """``samples`` keyed by the values of the labels ``names`` (the others summed over)."""
    found = {}
    for labels, value in samples.items():
        labels = dict(labels)
        key = tuple(labels[name] for name in names)
        found[key] = found.get(key, 0) + value
    return found


def test_a_scrape_counts_every_answer_exactly(runs):
    limits = Limits(max_texts=8, max_chars=60, max_new_tokens=30, max_body_bytes=4096)
    with TestClient(create_app(runs, limits)) as client:
        sent, translations = [SENTENCES[:2], SENTENCES[2:5], SENTENCES[5:]], []
        for texts, width in zip(sent, (1, 1, 2), strict=True):  # the last: the 2 best
            response = client.post("/translate", json={"texts": texts, "beam_size": width,
                                                       "n_best": width, "max_new_tokens": 12})
            assert response.status_code == 200, response.text
            translations += response.json()["translations"]
        prompt = "ein zwei"
        generated = client.post("/generate", json={"model": "poet", "prompt": prompt,
                                                   "max_new_tokens": 8, "seed": 1})
        assert generated.status_code == 200, generated.text
        continuation = generated.json()["text"].removeprefix(prompt)
        refusals = [
            client.post("/translate", json={"texts": ["ein"], "beam": 4}),
            client.post("/translate", json={"texts": ["ein"], "model": "nobody"}),
            client.post("/translate", content=b'{"texts": ["' + b"ein " * 2000 + b'"]}',
                        headers={"content-type": "application/json"}),
            client.get("/translate"),  # a known route, another method
            client.request("BREW", "/models"),  # an unusual method: "other"
        ]
        assert [r.status_code for r in refusals] == [422, 404, 413, 405, 405]
        unknown = ["/no/such/path", "/etc/passwd", "/translate/x", "/%2e%2e/admin", "/a/b/c/d"]
        assert {client.get(path).status_code for path in unknown} == {404}
        assert client.head("/health").status_code == 200
        batches = client.app.state.batcher.batches
        first = scrape(client)
        second = scrape(client)  # counts the first scrape

    answers = {("/translate", "POST", "200"): 3, ("/generate", "POST", "200"): 1,
               ("/translate", "POST", "422"): 1, ("/translate", "POST", "404"): 1,
               ("/translate", "POST", "413"): 1, ("/translate", "GET", "405"): 1,
               ("/models", "other", "405"): 1, ("unmatched", "GET", "404"): len(unknown),
               ("/health", "HEAD", "200"): 1}
    requests = first["transformerkit_requests_total"]
    assert by(requests, "route", "method", "status") == answers
    assert by(second["transformerkit_requests_total"], "route", "method", "status") == {
        **answers, ("/metrics", "GET", "200"): 1}
    per_route = by(requests, "route")
    assert by(first["transformerkit_request_duration_seconds_count"], "route") == per_route
    infinite = {k: v for k, v in first["transformerkit_request_duration_seconds_bucket"].items()
                if dict(k)["le"] == "+Inf"}
    assert by(infinite, "route") == per_route
    assert all(v > 0 for v in first["transformerkit_request_duration_seconds_sum"].values())
    assert by(first["transformerkit_rejected_total"], "status") == {
        ("422",): 1, ("404",): 1 + len(unknown), ("413",): 1, ("405",): 2}

    # one model call per request (one at a time): 6 texts and 1 prompt
    assert batches == 4
    assert first["transformerkit_batch_size_count"][()] == batches
    assert first["transformerkit_batch_size_sum"][()] == len(SENTENCES) + 1
    assert first["transformerkit_model_call_seconds_count"][()] == batches
    assert first["transformerkit_model_call_seconds_sum"][()] > 0
    assert first["transformerkit_queue_depth"][()] == 0

    assert by(first["transformerkit_sentences_total"], "model") == {
        ("numbers",): sum(len(texts) for texts in sent), ("poet",): 1}
    tokens = by(first["transformerkit_tokens_total"], "model")
    # character tokenizers: one token per character of each text answered
    assert tokens == {("numbers",): sum(len(t) for t in translations),
                      ("poet",): len(continuation)}
    assert tokens[("numbers",)] > 0 and tokens[("poet",)] > 0
    assert tokens[("numbers",)] == sum(len(runs["numbers"].target_tokenizer.encode(t))
                                       for t in translations)


def test_a_full_queue_is_counted_as_a_429_and_the_queue_depth_is_seen(runs):
    """The first request waits out a long collection window; the scrape sees it queued
    (polled), so a second request finds the queue (size 1) full."""
    limits = Limits(queue_size=1, batch_window_ms=2000, timeout=20)
    with TestClient(create_app({"numbers": runs["numbers"]}, limits)) as client:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.post, "/translate", json={"texts": ["ein"],
                                                                 "beam_size": 1})
            scrapes, deadline = 0, time.monotonic() + 10
            while True:
                scrapes += 1
                if scrape(client)["transformerkit_queue_depth"][()] == 1:
                    break
                assert time.monotonic() < deadline, "the first request never queued"
            refused = client.post("/translate", json={"texts": ["zwei"], "beam_size": 1})
            assert refused.status_code == 429, refused.text
            assert first.result().status_code == 200
        found = scrape(client)
    assert by(found["transformerkit_requests_total"], "route", "status") == {
        ("/translate", "200"): 1, ("/translate", "429"): 1, ("/metrics", "200"): scrapes}
    assert by(found["transformerkit_rejected_total"], "status") == {("429",): 1}
    assert found["transformerkit_queue_depth"][()] == 0
    assert found["transformerkit_batch_size_sum"][()] == 1


def test_a_streamed_answer_is_timed_to_its_end_and_a_fault_counts_as_500():
    """The middleware on a small Starlette application of its own."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def stream(request):
        async def chunks():
            yield b"first "
            await asyncio.sleep(0.3)  # the work being timed
            yield b"last"
        return StreamingResponse(chunks())

    async def broken(request):
        raise RuntimeError("a fault of the server")

    server_metrics = ServerMetrics()
    app = Starlette(routes=[Route("/stream", stream), Route("/broken", broken)])
    app.add_middleware(RequestMetrics, metrics=server_metrics, routers=(app.router,))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/stream").content == b"first last"
        assert client.get("/broken").status_code == 500
    found = parse(server_metrics.exposition().decode())
    assert by(found["transformerkit_requests_total"], "route", "status") == {
        ("/stream", "200"): 1, ("/broken", "500"): 1}
    buckets = by(found["transformerkit_request_duration_seconds_bucket"], "route", "le")
    assert buckets[("/stream", "0.25")] == 0 and buckets[("/stream", "+Inf")] == 1
    assert found["transformerkit_request_duration_seconds_sum"][(("route", "/stream"),)] >= 0.3
    assert "transformerkit_rejected_total" not in found  # a fault is not a refusal


def test_each_application_counts_on_its_own_registry(runs):
    with TestClient(create_app({"numbers": runs["numbers"]})) as one, \
            TestClient(create_app({"poet": runs["poet"]})) as two:
        for client, times in ((one, 2), (two, 1)):
            for _ in range(times):
                assert client.get("/models").status_code == 200
        for client, times in ((one, 2), (two, 1)):
            assert by(scrape(client)["transformerkit_requests_total"], "route") == {
                ("/models",): times}
    # nothing on the library's process-global registry
    assert not [m.name for m in REGISTRY.collect() if m.name.startswith("transformerkit")]


def test_every_route_is_counted_under_its_own_template(runs):
    """Each path of the schema (and the page), not "unmatched"; ``/metrics`` is in the
    schema, as text."""
    app = create_app(runs)
    middleware = next(m for m in app.user_middleware if m.cls is RequestMetrics)
    schema = app.openapi()
    paths = [*schema["paths"], "/"]
    assert {"/translate", "/generate", "/attention", "/health", "/models", "/metrics",
            "/openapi.json"} <= {*paths, "/openapi.json"}
    for path in [*paths, "/openapi.json"]:
        scope = {"type": "http", "path": path, "method": "GET", "root_path": ""}
        assert route_of(middleware.kwargs["routers"], scope) == path
    operation = schema["paths"]["/metrics"]["get"]
    assert list(operation["responses"]["200"]["content"]) == ["text/plain"]


def test_a_multiprocess_folder_set_too_late_or_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "none"))
    with pytest.raises(ValueError, match="is not a folder"):
        ServerMetrics()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="set after prometheus_client was imported"):
        ServerMetrics()  # this process imported prometheus_client without it


WORKER = """
import sys
from fastapi.testclient import TestClient
from transformerkit.serving.app import create_app
from transformerkit.serving.server import load_runs

run_dir, requests, texts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with TestClient(create_app(load_runs([run_dir]))) as client:
    for _ in range(requests):
        response = client.post("/translate", json={"texts": ["ein zwei"] * texts,
                                                   "beam_size": 1, "max_new_tokens": 4})
        assert response.status_code == 200, response.text
    if sys.argv[4:] == ["scrape"]:
        sys.stdout.write(client.get("/metrics").text)
"""


@pytest.mark.slow  # two processes that each import Keras and load a run
def test_several_workers_sum_into_one_scrape(run_dirs, tmp_path):
    """Two worker processes with ``PROMETHEUS_MULTIPROC_DIR`` set before they start, one
    after the other: the second's scrape sums both; once both ended their queue gauges are
    gone and their counts stay."""
    folder = tmp_path / "prometheus"
    folder.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}

    def worker(*arguments):
        done = subprocess.run([sys.executable, "-c", WORKER, str(run_dirs[0]), *arguments],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    worker("2", "2")  # 2 requests of 2 texts
    found = parse(worker("1", "3", "scrape"))  # 1 request of 3 texts, then the scrape
    assert by(found["transformerkit_requests_total"], "route", "status") == {
        ("/translate", "200"): 3}
    assert found["transformerkit_batch_size_count"][()] == 3
    assert found["transformerkit_batch_size_sum"][()] == 2 * 2 + 3
    assert by(found["transformerkit_sentences_total"], "model") == {("numbers",): 7}
    assert by(found["transformerkit_request_duration_seconds_count"], "route") == {
        ("/translate",): 3}
    assert found["transformerkit_queue_depth"][()] == 0  # the live worker's

    assert list(folder.glob("gauge_livesum_*.db")) == []  # each worker ended: marked dead
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(folder))
    after = parse(generate_latest(registry).decode())
    assert by(after["transformerkit_requests_total"], "route", "status") == {
        ("/translate", "200"): 3, ("/metrics", "200"): 1}
    assert "transformerkit_queue_depth" not in after


def test_a_request_whose_client_left_is_counted_once():
    """Straight through the middleware: cancelled before any answer (499), and an answer
    whose body never ended (its status, timed until the application returned)."""
    import asyncio

    from starlette.routing import Route, Router

    async def gone(scope, receive, send):
        raise asyncio.CancelledError

    async def cut(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})

    async def ignored(send):
        pass

    server_metrics = ServerMetrics()
    router = Router(routes=[Route("/gone", gone), Route("/cut", cut)])

    def request(app, path):
        scope = {"type": "http", "path": path, "method": "POST", "root_path": "", "headers": []}
        return RequestMetrics(app, server_metrics, (router,))(scope, None, ignored)

    async def scenario():
        with pytest.raises(asyncio.CancelledError):  # passed on
            await request(gone, "/gone")
        await request(cut, "/cut")

    asyncio.run(scenario())
    found = parse(server_metrics.exposition().decode())
    assert by(found["transformerkit_requests_total"], "route", "method", "status") == {
        ("/gone", "POST", "499"): 1, ("/cut", "POST", "200"): 1}
    assert "transformerkit_rejected_total" not in found


def test_the_manual_names_every_metric_and_its_scrape_config_is_yaml():
    """``docs/serving.md``, Metrics: its table names exactly the server's metrics; its
    Prometheus scrape job parses and sends the API key as a bearer token from a file."""
    import re

    import yaml
    from manual import DOCS, blocks

    page = DOCS / "serving.md"
    documented = set(re.findall(r"^\| `(transformerkit_\w+)`", page.read_text(), flags=re.M))
    served = {f"{family.name}_total" if family.type == "counter" else family.name
              for family in ServerMetrics().registry.collect()
              if family.name.startswith("transformerkit")}
    assert documented == served
    (config,) = [yaml.safe_load(block) for block in blocks("yaml", page)
                 if "scrape_configs" in block]
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    assert job["authorization"]["credentials_file"].startswith("/")
    assert job["static_configs"][0]["targets"]


def test_refusals_for_a_missing_or_wrong_key_are_counted(runs):
    """The metrics middleware sits outside the key check: a 401 is counted under its route,
    and a scrape itself needs the key."""
    key = "k" * 24
    with TestClient(create_app(runs, api_keys=[key])) as client:
        assert client.post("/translate", json={"texts": ["ein"]}).status_code == 401
        wrong = {"Authorization": "Bearer " + "k" * 23 + "x"}
        assert client.get("/models", headers=wrong).status_code == 401
        assert client.get("/metrics").status_code == 401
        response = client.get("/metrics", headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200
        found = parse(response.text)
    requests = by(found["transformerkit_requests_total"], "route", "status")
    assert requests[("/translate", "401")] == 1
    assert requests[("/models", "401")] == 1
    assert requests[("/metrics", "401")] == 1
    assert by(found["transformerkit_rejected_total"], "status")[("401",)] == 3
