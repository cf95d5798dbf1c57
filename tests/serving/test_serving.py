"""``transformerkit serve``: the HTTP API in-process (Starlette's TestClient over httpx) on
the two tiny runs of ``conftest.py`` (a character de->en Transformer and a character GPT,
trained once for the whole test run).

Every answer is checked against the Python API (``Run.translate`` / ``generate`` /
``attention``) on the same run; every kind of bad input gets its 4xx JSON error and the next
request is served; requests that arrive together share one model call; the queue bound (429),
the timeout (503) and the body limit (413) hold. The batcher is also tested on its own.

Kinds of claims: an answer computed by the same call on the same batch as the API's is
exact (text, scores); attention is exact up to the server's rounding to 4 decimals; where
the server batches requests in another order (other rows), outputs are the same except at
a near-tie (``near_ties.assert_same_texts_or_near_tie``).
"""

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tolerances as tol
from near_ties import assert_same_texts_or_near_tie

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import transformerkit  # noqa: E402
from transformerkit import cli  # noqa: E402
from transformerkit.serving.app import create_app  # noqa: E402
from transformerkit.serving.batching import Batcher, QueueFull  # noqa: E402
from transformerkit.serving.limits import Limits  # noqa: E402
from transformerkit.serving.server import load_runs, run_names  # noqa: E402

SENTENCES = ["ein zwei drei", "vier fuenf", "sechs sieben acht neun", "zehn ein",
             "zwei zwei drei vier", "acht"]


@pytest.fixture(scope="module")
def runs(run_dirs):
    return load_runs(run_dirs)


@pytest.fixture(scope="module")
def client(runs):
    with TestClient(create_app(runs, Limits(max_texts=8, max_chars=60, max_new_tokens=30,
                                            max_body_bytes=4096))) as client:
        yield client


def served(client):
    """The server still answers a good request correctly."""
    response = client.post("/translate", json={"texts": ["ein zwei"], "beam_size": 1})
    assert response.status_code == 200, response.text
    return response.json()


# -- answers equal the Python API -------------------------------------------------------------
def attention_atol(expected):
    """New bound helper: the server sends attention rounded to 4 decimals (``np.round`` in
    float32: half a unit of the 4th decimal, plus the scaling and the division by 10^4,
    each rounded once) of weights computed by the same call as the API's (exact)."""
    return 0.5e-4 + tol.chain_atol(2, expected)


def test_translate_equals_run_translate(client, runs):
    """Exact: the server's call is the API's, on the same batch (one request)."""
    run = runs["numbers"]
    greedy = client.post("/translate", json={"texts": SENTENCES, "beam_size": 1,
                                             "max_new_tokens": 12}).json()
    assert greedy["model"] == "numbers" and greedy.get("n_best") is None
    assert greedy["translations"] == run.translate(SENTENCES, beam_size=1, max_new_tokens=12)
    beam = client.post("/translate", json={"texts": SENTENCES[:3], "beam_size": 3,
                                           "n_best": 2, "max_new_tokens": 12}).json()
    expected = run.translate(SENTENCES[:3], beam_size=3, n_best=2, max_new_tokens=12)
    assert beam["translations"] == [found[0][0] for found in expected]
    for got, want in zip(beam["n_best"], expected, strict=True):
        assert [h["text"] for h in got] == [t for t, _ in want]
        assert [h["score"] for h in got] == [float(s) for _, s in want]  # JSON keeps a float


def test_sampling_with_a_seed_is_reproducible_and_equals_the_api(client, runs):
    """Exact: a seeded draw runs alone, the same call as the API's."""
    body = {"texts": SENTENCES[:2], "temperature": 1.0, "top_k": 5, "seed": 7,
            "max_new_tokens": 10}
    first = client.post("/translate", json=body).json()["translations"]
    assert first == client.post("/translate", json=body).json()["translations"]
    assert first == runs["numbers"].translate(SENTENCES[:2], temperature=1.0, top_k=5, seed=7,
                                              max_new_tokens=10, beam_size=4)


def test_generate_equals_run_generate(client, runs):
    """Exact: the same call as the API's."""
    body = {"prompt": "ein zwei", "model": "poet", "max_new_tokens": 12, "temperature": 0.8,
            "top_k": 4, "seed": 3}
    answer = client.post("/generate", json=body).json()
    assert answer == {"model": "poet", "text": runs["poet"].generate(
        "ein zwei", max_new_tokens=12, temperature=0.8, top_k=4, seed=3)}
    del body["model"]  # the first run that generates, though "numbers" comes first
    assert client.post("/generate", json=body).json() == answer
    assert client.post("/translate", json={"texts": ["ein"]}).json()["model"] == "numbers"


def test_attention_equals_run_attention(client, runs):
    """The same call as the API's, rounded to 4 decimals by the server."""
    run = runs["numbers"]
    answer = client.post("/attention", json={"source": "ein zwei drei", "target": "one two",
                                             "kinds": ["cross", "encoder"]}).json()
    expected = run.attention("ein zwei drei", "one two")
    for key in ("source_tokens", "target_input_tokens", "target_output_tokens"):
        assert answer[key] == expected[key]
    for kind in ("cross", "encoder"):
        tol.assert_within(answer["attention"][kind], expected[kind],
                          attention_atol(expected[kind]), kind)
    assert set(answer["attention"]) == {"cross", "encoder"}
    assert (answer["layers"], answer["heads"]) == expected["cross"].shape[:2]
    # no target: the model's greedy translation, which the answer names
    default = client.post("/attention", json={"source": "vier fuenf"}).json()
    assert default["target"] == run.translate("vier fuenf", beam_size=1,
                                              max_new_tokens=run.model.max_length - 1)
    assert list(default["attention"]) == ["cross"]
    gpt = client.post("/attention", json={"source": "ein zwei", "model": "poet"}).json()
    expected = runs["poet"].attention("ein zwei")["self"]
    tol.assert_within(gpt["attention"]["self"], expected, attention_atol(expected), "self")
    assert gpt["tokens"] == runs["poet"].attention("ein zwei")["tokens"]


def test_tolerances_still_catch_attention_rounded_to_3_decimals(client, runs, monkeypatch):
    """Planted bug: the server rounds attention weights to 3 decimals instead of 4."""
    from types import SimpleNamespace

    from transformerkit.serving import model_routes

    monkeypatch.setattr(model_routes, "np", SimpleNamespace(
        round=lambda weights, decimals: np.round(weights, decimals - 1)))
    tol.assert_caught(test_attention_equals_run_attention, client, runs)


def test_models_health_openapi_and_page(client, runs, run_dirs):
    models = client.get("/models").json()
    assert models["default"] == "numbers"
    assert [m["name"] for m in models["models"]] == ["numbers", "poet"]
    numbers, poet = models["models"]
    assert (numbers["kind"], poet["kind"]) == ("transformer", "gpt")
    assert numbers["parameters"] == runs["numbers"].model.count_params()
    assert numbers["model"]["num_layers"] == 1 and numbers["data"]["tokenizer"] == "char"
    saved = json.loads((run_dirs[0] / "metrics.json").read_text())
    assert numbers["metrics"] == saved and "loss" in saved
    health = client.get("/health").json()
    assert health["status"] == "ready" and health["models"] == ["numbers", "poet"]
    schema = client.get("/openapi.json").json()
    assert {"/translate", "/generate", "/attention", "/health", "/models"} <= set(schema["paths"])
    request = schema["components"]["schemas"]["TranslateRequest"]
    assert request["additionalProperties"] is False and "texts" in request["required"]
    assert client.get("/docs").status_code == 404  # its viewer would load from a CDN
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    html = page.text
    assert "<canvas" in html or "createElement(\"canvas\")" in html
    assert "http://" not in html and "https://" not in html and " src=" not in html


# -- bad input: a clear 4xx, and the next request is served -----------------------------------
BAD_BODIES = [
    (b'{"texts": ["ein"', 400, "not valid JSON"),
    (b'{"texts": ["ein \xff zwei"]}', 400, "not valid UTF-8"),
    (b'{"texts": "ein zwei"}', 422, "texts: Input should be a valid list"),
    (b'{"texts": [3]}', 422, "texts.0: Input should be a valid string"),
    (b'{"texts": ["ein"], "beam_size": "4"}', 422, "beam_size"),
    (b'{"texts": ["ein"], "beam_size": 0}', 422, "beam_size"),
    (b'{"texts": ["ein"], "beam": 4}', 422, "beam: Extra inputs are not permitted"),
    (b'{"texts": []}', 422, "texts"),
    (b'{"texts": [""]}', 422, "text 0 is empty"),
    (b'{"texts": ["ein", "   "]}', 422, "text 1 is empty"),
    (b'{"texts": ["\\ud800"]}', 422, "lone surrogate"),
    (b'{"texts": ["' + b"x" * 61 + b'"]}', 422, "61 characters"),
    (b'{"texts": [' + b", ".join([b'"ein"'] * 9) + b"]}", 422, "9 texts"),
    (b'{"texts": ["ein"], "max_new_tokens": 31}', 422, "max_new_tokens=31"),
    (b'{"texts": ["ein"], "n_best": 17}', 422, "beam_size / n_best 17"),
    (b'{"texts": ["ein"], "model": "nobody"}', 404, "no model named 'nobody'"),
    (b'{"texts": ["ein"], "model": "/etc/passwd"}', 404, "no model named"),
    (b'{"texts": ["ein"], "model": "poet"}', 422, "use /generate"),
    (b"[]", 422, "the body must be a JSON object"),
    (b"null", 422, "the body must be a JSON object"),
    (b"", 422, "the body must be a JSON object"),
    (b'{"texts": ["ein"], "alpha": NaN}', 422, "alpha: Input should be a finite number"),
    (b'{"texts": ["ein"], "temperature": Infinity}', 422, "temperature: Input should be a "
                                                          "finite number"),
]


@pytest.mark.parametrize("content_type", [None, "text/plain",
                                          "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_415(client, content_type):
    """FastAPI reads a body as JSON only when the request says it is JSON (a browser form of
    another site cannot post to the API): the client is told which header to send."""
    headers = {} if content_type is None else {"content-type": content_type}
    response = client.post("/translate", content=b'{"texts": ["ein zwei"]}', headers=headers)
    assert response.status_code == 415, response.text
    assert response.json()["error"] == ("send the body as JSON with the header Content-Type: "
                                        f"application/json (got {content_type or 'none'})")
    response = client.post("/translate", content=b'{"texts": ["ein zwei"], "beam_size": 1}',
                           headers={"content-type": "application/vnd.api+json; charset=utf-8"})
    assert response.status_code == 200 and response.json() == served(client)
    assert client.head("/health").status_code == 200


@pytest.mark.parametrize("body, status, message", BAD_BODIES,
                         ids=[f"{i}-{b[:24]!r}" for i, (b, _, _) in enumerate(BAD_BODIES)])
def test_bad_translate_request_is_a_clear_error(client, body, status, message):
    response = client.post("/translate", content=body,
                           headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    answer = response.json()
    assert answer["status"] == status and message in answer["error"], answer
    served(client)


@pytest.mark.parametrize("path, body, status, message", [
    ("/generate", {"prompt": ""}, 422, "prompt"),
    ("/generate", {"prompt": "ein", "model": "poet", "temperature": -1}, 422, "temperature"),
    ("/generate", {"prompt": "ein", "model": "poet", "top_p": 1.5}, 422, "top_p"),
    ("/generate", {"prompt": "ein", "model": "numbers"}, 422, "use /translate"),
    ("/generate", {"prompt": "x" * 61, "model": "poet"}, 422, "61 characters"),
    ("/attention", {"source": "ein", "kinds": ["self"]}, 422, "attention kinds"),
    ("/attention", {"source": "ein", "model": "poet", "target": "x"}, 422, "no target"),
    ("/attention", {"source": "ein", "kinds": ["all"]}, 422, "kinds.0"),
    ("/attention", {"source": "ein zwei " * 6}, 422, "the model takes at most 40"),
])
def test_bad_generate_and_attention_requests(client, path, body, status, message):
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    served(client)


def test_a_body_over_the_limit_is_413_declared_or_chunked(client):
    big = json.dumps({"texts": ["ein"] * 2000}).encode()  # over max_body_bytes=4096
    response = client.post("/translate", content=big, headers={"content-type":
                                                                "application/json"})
    assert response.status_code == 413 and "4096 bytes" in response.json()["error"]
    served(client)

    def chunks():  # no Content-Length: the middleware counts what arrives
        for start in range(0, len(big), 1000):
            yield big[start:start + 1000]

    response = client.post("/translate", content=chunks(),
                           headers={"content-type": "application/json"})
    assert response.status_code == 413 and "4096 bytes" in response.json()["error"]
    served(client)


@pytest.mark.parametrize("raised, status, message", [
    (ValueError("the tokenizer refused it"), 422, "the tokenizer refused it"),
    (RuntimeError("out of memory"), 500, "internal error: RuntimeError: out of memory")])
def test_a_failing_model_call_is_an_error_and_the_server_goes_on(runs, monkeypatch, raised,
                                                                 status, message):
    run = runs["numbers"]
    app = create_app({"numbers": run})
    with TestClient(app, raise_server_exceptions=False) as client:
        def broken(*args, **kwargs):
            raise raised

        monkeypatch.setattr(run, "translate", broken)
        response = client.post("/translate", json={"texts": ["ein"]})
        assert response.status_code == status
        assert response.json()["error"] == message
        monkeypatch.undo()
        served(client)


def test_two_apps_in_one_process_keep_their_own_runs_limits_and_batcher(runs):
    """The routes are module-level (``serving/model_routes.py``, ``info_routes.py``); each
    application's runs, limits and batcher come from its own state, set by ``create_app``."""
    with TestClient(create_app({"numbers": runs["numbers"]}, Limits(max_texts=1))) as one, \
            TestClient(create_app({"poet": runs["poet"]})) as two:
        assert one.get("/health").json()["models"] == ["numbers"]
        assert two.get("/models").json()["default"] == "poet"
        refused = one.post("/translate", json={"texts": ["ein", "zwei"], "beam_size": 1})
        assert refused.status_code == 422 and "at most 1 per request" in refused.json()["error"]
        generated = two.post("/generate", json={"prompt": "ein", "max_new_tokens": 2,
                                                "seed": 1})
        assert generated.status_code == 200 and generated.json()["model"] == "poet"
        assert one.get("/health").json()["batches"] == 0
        assert two.get("/health").json()["batches"] == 1


# -- batching, queue bound, timeout --------------------------------------------------------------
def post_together(client, bodies, path="/translate"):
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: client.post(path, json=body), bodies))


def test_requests_that_arrive_together_share_one_call(runs):
    """One call for six requests; its rows come in arrival order, not the API call's (another
    row may take another code path in a product), so near-ties allowed."""
    run = runs["numbers"]
    limits = Limits(batch_window_ms=400)  # everyone arrives within the window
    with TestClient(create_app({"numbers": run}, limits)) as client:
        before = client.get("/health").json()["batches"]
        bodies = [{"texts": [s], "beam_size": 1, "max_new_tokens": 12} for s in SENTENCES]
        answers = post_together(client, bodies)
        assert [a.status_code for a in answers] == [200] * len(bodies)
        assert_same_texts_or_near_tie(run, SENTENCES,
                                      [a.json()["translations"][0] for a in answers],
                                      run.translate(SENTENCES, beam_size=1, max_new_tokens=12))
        assert client.get("/health").json()["batches"] - before == 1
        # other search options do not share a call
        mixed = post_together(client, [{"texts": ["ein"], "beam_size": 1},
                                       {"texts": ["ein"], "beam_size": 2}])
        assert [a.status_code for a in mixed] == [200, 200]
        assert client.get("/health").json()["batches"] - before == 3


def test_a_full_queue_answers_429_and_a_slow_one_503(runs):
    run = runs["numbers"]
    # a long collection window keeps the first request waiting in the queue
    with TestClient(create_app({"numbers": run}, Limits(queue_size=1, batch_window_ms=800,
                                                         timeout=5))) as client:
        answers = post_together(client, [{"texts": ["ein"], "beam_size": 1}] * 2)
        assert sorted(a.status_code for a in answers) == [200, 429]
        refused = next(a for a in answers if a.status_code == 429)
        assert "--queue-size" in refused.json()["error"] and refused.headers["retry-after"]
    with TestClient(create_app({"numbers": run}, Limits(batch_window_ms=2000,
                                                         timeout=0.2))) as client:
        response = client.post("/translate", json={"texts": ["ein"]})
        assert response.status_code == 503 and "--timeout" in response.json()["error"]
        assert client.get("/health").json()["waiting"] == 0  # dropped from the queue


def test_batcher_groups_by_key_within_max_batch_on_a_worker_thread():
    calls = []

    def call(inputs):
        calls.append((list(inputs), threading.current_thread().name))
        if "bad" in inputs:
            raise ValueError("bad input")
        if "fault" in inputs:
            raise RuntimeError("a fault of the server")
        return [x.upper() for x in inputs]

    async def scenario():
        batcher = Batcher(window_s=0.05, max_batch=4, queue_size=10, timeout_s=5)
        batcher.start()
        jobs = [batcher.submit(["a", "b"], call, "k"), batcher.submit(["c"], call, "k"),
                batcher.submit(["d"], call, "other"), batcher.submit(["e", "f"], call, "k"),
                batcher.submit(["g"], call, None), batcher.submit(["bad"], call, "j"),
                batcher.submit(["h"], call, "j"), batcher.submit(["fault"], call, "m"),
                batcher.submit(["i"], call, "m")]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        await batcher.stop()
        return results

    results = asyncio.run(scenario())
    assert results[:5] == [["A", "B"], ["C"], ["D"], ["E", "F"], ["G"]]
    assert isinstance(results[5], ValueError) and results[6] == ["H"]
    assert [type(r) for r in results[7:]] == [RuntimeError, RuntimeError]  # not input: shared
    batches = [inputs for inputs, _ in calls]
    # oldest first; "k" jobs fill max_batch=4 (a, b, c) + (e, f would make 5: next round)
    assert batches[:4] == [["a", "b", "c"], ["d"], ["e", "f"], ["g"]]
    # a shared call failing on its input: each job again alone; on anything else: not
    assert batches[4:] == [["bad", "h"], ["bad"], ["h"], ["fault", "i"]]
    assert all(name.startswith("transformerkit-model") for _, name in calls)


def test_batcher_queue_full_and_timeout():
    release = threading.Event()

    async def scenario():
        batcher = Batcher(window_s=0, max_batch=4, queue_size=1, timeout_s=0.3)
        batcher.start()
        slow = asyncio.ensure_future(batcher.submit([1], lambda x: release.wait(2) and x))
        await asyncio.sleep(0.05)  # running now: the queue is empty again
        waiting = asyncio.ensure_future(batcher.submit([2], lambda x: x))
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull):
            await batcher.submit([3], lambda x: x)
        with pytest.raises(TimeoutError):
            await slow
        with pytest.raises(TimeoutError):
            await waiting
        release.set()
        await batcher.stop()

    asyncio.run(scenario())


def test_batcher_drops_the_job_of_a_client_that_went_away():
    calls = []

    async def scenario():
        batcher = Batcher(window_s=0.3, max_batch=4, queue_size=4, timeout_s=5)
        batcher.start()
        gone = asyncio.ensure_future(batcher.submit(["a"], calls.append, "k"))
        await asyncio.sleep(0.05)
        gone.cancel()  # what Starlette does to a handler whose client disconnected
        await asyncio.sleep(0.01)
        assert batcher.waiting == []
        assert await batcher.submit(["b"], lambda x: [y * 2 for y in x], "k") == ["bb"]
        await batcher.stop()

    asyncio.run(scenario())
    assert calls == []


# -- the engine, the command line ---------------------------------------------------------------
def test_ctranslate2_engine_is_passed_through(runs):
    """Exact: the same CTranslate2 call on the same batch as the API's."""
    pytest.importorskip("ctranslate2")
    run = runs["numbers"]
    with TestClient(create_app({"numbers": run}, engine="ctranslate2")) as client:
        answer = client.post("/translate", json={"texts": SENTENCES, "beam_size": 1,
                                                 "max_new_tokens": 12}).json()
        assert answer["translations"] == run.translate(
            SENTENCES, beam_size=1, max_new_tokens=12, engine="ctranslate2")
        assert client.get("/models").json()["models"][0]["engine"] == "ctranslate2"


def test_run_names_and_serve_options(capsys):
    assert run_names(["runs/a", "other/a/", "b"]) == ["a", "a-2", "b"]
    with pytest.raises(ValueError, match="max_texts must be positive"):
        Limits(max_texts=0)
    assert cli.main(["serve", "runs/none", "--max-texts", "0"]) == 2
    assert "max_texts must be positive" in capsys.readouterr().err
    assert cli.main(["serve", "no/such/run"]) == 2
    assert "no/such/run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["serve"])  # at least one run
    with pytest.raises(ValueError, match="engine must be"):
        create_app({"x": transformerkit}, engine="onnx")


def test_cors_lets_the_named_origins_call_the_api(runs):
    """With ``cors_origins`` a browser page of that origin may call the API (preflight and
    the answer carry the headers, errors too); other origins get none; without it, none."""
    app = create_app(runs, Limits(max_body_bytes=200), cors_origins=["http://app.example:3000"])
    preflight = {"Origin": "http://app.example:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    with TestClient(app) as client:
        response = client.options("/translate", headers=preflight)
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == "http://app.example:3000"
        assert "POST" in response.headers["access-control-allow-methods"]
        response = client.post("/translate", json={"texts": ["ein zwei"]},
                               headers={"Origin": "http://app.example:3000"})
        assert response.status_code == 200
        assert response.json()["translations"] == runs["numbers"].translate(["ein zwei"])
        assert response.headers["access-control-allow-origin"] == "http://app.example:3000"
        response = client.post("/translate", content=b"{" + b" " * 300 + b"}",
                               headers={"Origin": "http://app.example:3000",
                                        "Content-Type": "application/json"})
        assert response.status_code == 413
        assert response.headers["access-control-allow-origin"] == "http://app.example:3000"
        other = client.post("/translate", json={"texts": ["ein"]},
                            headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        refused = client.options("/translate", headers={**preflight,
                                                        "Origin": "http://evil.example"})
        assert refused.status_code == 400
        assert "access-control-allow-origin" not in refused.headers
    with TestClient(create_app(runs)) as client:
        response = client.post("/translate", json={"texts": ["ein"]},
                               headers={"Origin": "http://app.example:3000"})
        assert response.status_code == 200
        assert "access-control-allow-origin" not in response.headers
        assert client.options("/translate", headers=preflight).status_code == 405
    with TestClient(create_app(runs, cors_origins=["*"])) as client:
        response = client.post("/translate", json={"texts": ["ein"]},
                               headers={"Origin": "https://any.example"})
        assert response.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("origin", ["app.example", "http://app.example/", "ftp://app.example",
                                    "http://", "http://user@app.example", 3000])
def test_a_cors_origin_that_is_not_one_is_refused(runs, origin, capsys):
    with pytest.raises(ValueError, match="is not '\\*' or scheme://host"):
        create_app(runs, cors_origins=[origin])
    if isinstance(origin, str):  # before any run is loaded
        assert cli.main(["serve", "no/such/run", "--cors-origin", origin]) == 2
        assert "scheme://host[:port]" in capsys.readouterr().err


def test_the_readmes_requests_are_served(runs):
    """Each ``curl`` request of the README, sent to runs named as there (small, gpt)."""
    import shlex

    from manual import commands

    requests = [shlex.split(line) for line in commands() if line.startswith("curl")]
    assert len(requests) >= 4
    with TestClient(create_app({"small": runs["numbers"], "gpt": runs["poet"]})) as client:
        for words in requests:
            url = next(w for w in words if w.startswith("localhost:8000/"))
            path = url.removeprefix("localhost:8000")
            if "-d" in words:
                body = json.loads(words[words.index("-d") + 1])
                response = client.post(path, json=body)
            else:
                response = client.get(path)
            assert response.status_code == 200, (words, response.text)
