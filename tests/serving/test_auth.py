"""API keys (``serving/auth.py``): the HTTP API in-process (Starlette's TestClient) on the two
tiny runs of ``conftest.py``, the keys read from options, the environment and files, and the
rule that ``transformerkit serve`` on a host other than loopback needs keys or ``--no-auth``.

Every route but ``/`` and ``/health`` answers 401 (the same JSON and ``WWW-Authenticate``
whatever was wrong) without one of the keys, and with one answers exactly what a server
without keys answers.
"""

import base64
import logging
import os
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from starlette.websockets import WebSocketDisconnect  # noqa: E402

from transformerkit import cli  # noqa: E402
from transformerkit.serving import auth  # noqa: E402
from transformerkit.serving.app import create_app  # noqa: E402
from transformerkit.serving.auth import (  # noqa: E402
    ENV_VAR,
    BearerAuth,
    is_loopback,
    keys_for_host,
    read_keys,
)
from transformerkit.serving.limits import Limits  # noqa: E402
from transformerkit.serving.server import load_runs  # noqa: E402

KEYS = ("first-key-0123456789abcdef", "second-key-ZYXWVUTSRQ-_.~+/=")
ORIGIN = "http://app.example:3000"
CHALLENGE = 'Bearer realm="transformerkit"'
REFUSED = {"error": auth.REFUSAL, "status": 401}
ROUTES = [("GET", "/models", None), ("GET", "/openapi.json", None),
          ("POST", "/translate", {"texts": ["ein zwei drei"], "beam_size": 2}),
          ("POST", "/generate", {"prompt": "ein", "model": "poet", "max_new_tokens": 5,
                                 "seed": 1}),
          ("POST", "/attention", {"source": "ein zwei", "target": "one two"}),
          ("GET", "/no/such/route", None), ("POST", "/health/x", {})]
WRONG = {  # the value of the Authorization header (None: no header)
    "none": None,
    "a wrong key": "Bearer wrong-key-0123456789abcdef",
    "the last character differs": "Bearer " + KEYS[0][:-1] + "g",
    "one character more": "Bearer " + KEYS[0] + "0",
    "a prefix": "Bearer " + KEYS[0][:-1],
    "basic": "Basic " + base64.b64encode(f"user:{KEYS[0]}".encode()).decode(),
    "the key alone": KEYS[0],
    "bearer without a key": "Bearer",
    "bearer and a space": "Bearer ",
    "two spaces": "Bearer  " + KEYS[0],
    "a tab": "Bearer\t" + KEYS[0],
    "another scheme word": "Bearerx " + KEYS[0],
    "two keys": f"Bearer {KEYS[0]} {KEYS[1]}",
    "a comma list": f"Bearer {KEYS[0]},{KEYS[1]}",
    "the key quoted": f'Bearer "{KEYS[0]}"',
    "an empty header": "",
}


@pytest.fixture(scope="module")
def runs(run_dirs):
    return load_runs(run_dirs)


@pytest.fixture(scope="module")
def client(runs):
    with TestClient(create_app(runs, Limits(max_body_bytes=4096), api_keys=KEYS)) as client:
        yield client


@pytest.fixture(scope="module")
def open_client(runs):
    """The same runs with no keys: what a request with a right key must be answered."""
    with TestClient(create_app(runs, Limits(max_body_bytes=4096))) as client:
        yield client


def send(client, method, path, body, authorization=None, **headers):
    if authorization is not None:
        headers["Authorization"] = authorization
    return client.request(method, path, json=body, headers=headers)


def assert_refused(response):
    assert response.status_code == 401, response.text
    assert response.json() == REFUSED
    assert response.headers["www-authenticate"] == CHALLENGE


def routes_of(client):
    """:data:`ROUTES`, and ``GET /metrics`` where the app has it."""
    paths = {getattr(route, "path", None) for route in client.app.routes}
    return ROUTES + ([("GET", "/metrics", None)] if "/metrics" in paths else [])


@pytest.mark.parametrize("wrong", list(WRONG))
def test_every_route_refuses_a_request_without_a_right_key(client, wrong):
    for method, path, body in routes_of(client):
        assert_refused(send(client, method, path, body, WRONG[wrong]))


def test_two_authorization_headers_are_refused_even_with_a_right_key(client):
    for method, path, body in routes_of(client):
        response = client.request(method, path, json=body, headers=[
            ("Authorization", f"Bearer {KEYS[0]}"), ("Authorization", f"Bearer {KEYS[1]}")])
        assert_refused(response)


@pytest.mark.parametrize("authorization", [f"Bearer {KEYS[0]}", f"Bearer {KEYS[1]}",
                                           f"bearer {KEYS[1]}", f"BEARER {KEYS[0]}"])
def test_a_right_key_is_answered_as_without_keys(client, open_client, authorization):
    """Either key, the scheme in any case: the answer of a server without keys (200 for the
    routes, 404 for an unknown path, 405 for a wrong method)."""
    for method, path, body in routes_of(client):
        response = send(client, method, path, body, authorization)
        expected = send(open_client, method, path, body)
        assert response.status_code == expected.status_code, (path, response.text)
        assert response.status_code in (200, 404, 405)
        if path in ("/metrics", "/openapi.json"):  # counts differ; the schema: below
            continue
        assert response.json() == expected.json(), path
        assert "www-authenticate" not in response.headers


def test_the_schema_says_which_routes_need_a_key(client, open_client):
    """The schema of a server with keys: a bearer scheme, required (401 possible) by every
    operation but /health; otherwise the schema of a server without keys."""
    schema = client.get("/openapi.json", headers={"Authorization": f"Bearer {KEYS[0]}"}).json()
    assert schema["components"].pop("securitySchemes") == {"apiKey": {
        "type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"}}
    guarded = set()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if path == "/health":
                assert "security" not in operation and "401" not in operation["responses"]
                continue
            assert operation.pop("security") == [{"apiKey": []}]
            assert operation["responses"].pop("401")["content"]["application/json"][
                "schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
            guarded.add((method.upper(), path))
    assert {("GET", "/models"), ("POST", "/translate"), ("POST", "/generate"),
            ("POST", "/attention")} <= guarded
    assert schema == open_client.get("/openapi.json").json()


def test_every_key_is_compared_whichever_matches(client, monkeypatch):
    """No early exit: ``hmac.compare_digest`` runs once per key, for the first key too."""
    calls = []
    compare = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest",
                        lambda a, b: calls.append(b) or compare(a, b))
    for key in (*KEYS, "wrong-key-0123456789abcdef"):
        calls.clear()
        client.get("/models", headers={"Authorization": f"Bearer {key}"})
        assert calls == [k.encode() for k in KEYS]


def test_health_and_the_page_are_open(client):
    for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789abcdef"}):
        health = client.get("/health", headers=headers)
        assert health.status_code == 200 and health.json()["models"] == ["numbers", "poet"]
        assert client.head("/health", headers=headers).status_code == 200
        page = client.get("/", headers=headers)
        assert page.status_code == 200 and "<!DOCTYPE html>" in page.text
        assert "content-security-policy" in page.headers
    assert_refused(client.get("/health/"))  # only the paths themselves are open
    assert_refused(client.get("/index.html"))


def test_a_request_without_a_key_is_refused_before_its_body_is_read(client):
    """Over the body limit and without a key: 401, not 413 (the key is checked first)."""
    response = client.post("/translate", content=b"{" + b" " * 5000 + b"}",
                           headers={"Content-Type": "application/json"})
    assert_refused(response)
    too_large = client.post("/translate", content=b"{" + b" " * 5000 + b"}",
                            headers={"Content-Type": "application/json",
                                     "Authorization": f"Bearer {KEYS[0]}"})
    assert too_large.status_code == 413


def test_a_websocket_needs_a_key_too(client):
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect("/models"):
            pass
    assert refused.value.code == 1008
    with pytest.raises(WebSocketDisconnect) as no_route:  # with the key: the router's answer
        with client.websocket_connect("/models", headers={"Authorization": f"Bearer {KEYS[0]}"}):
            pass
    assert no_route.value.code != 1008


def test_cors_preflight_is_answered_and_a_401_carries_the_cors_headers(runs):
    app = create_app(runs, cors_origins=[ORIGIN], api_keys=KEYS[:1])
    with TestClient(app) as client:
        preflight = client.options("/translate", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        refused = client.post("/translate", json={"texts": ["ein"]}, headers={"Origin": ORIGIN})
        assert_refused(refused)
        assert refused.headers["access-control-allow-origin"] == ORIGIN
        answered = client.post("/translate", json={"texts": ["ein"]},
                               headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEYS[0]}"})
        assert answered.status_code == 200
        assert answered.json()["translations"] == runs["numbers"].translate(["ein"])
        assert answered.headers["access-control-allow-origin"] == ORIGIN


# -- the keys -----------------------------------------------------------------------------------
def test_keys_from_the_options_an_env_list_and_a_file(tmp_path):
    assert read_keys(environ={}) == ()
    assert read_keys(KEYS, environ={ENV_VAR: ""}) == KEYS  # empty: unset
    assert read_keys(environ={ENV_VAR: f" {KEYS[0]} , {KEYS[1]}"}) == KEYS
    assert read_keys([KEYS[1]], environ={ENV_VAR: KEYS[0]}) == (KEYS[1], KEYS[0])
    assert read_keys(KEYS, environ={ENV_VAR: ",".join(KEYS)}) == KEYS  # repeats once
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# the web app's key\n{KEYS[0]}\n\n   \n  # the batch job's\n"
                    f"  {KEYS[1]}  \n")
    assert read_keys(environ={ENV_VAR: str(keys)}) == KEYS
    with pytest.raises(ValueError, match="names no file: /no/such/keys.txt"):
        read_keys(environ={ENV_VAR: "/no/such/keys.txt"})
    with pytest.raises(ValueError, match="names no file"):
        read_keys(environ={ENV_VAR: str(tmp_path)})  # a folder
    keys.write_text("# none yet\n\n")
    with pytest.raises(ValueError, match=r"\(file .*keys.txt\) holds no key"):
        read_keys(environ={ENV_VAR: str(keys)})
    with pytest.raises(ValueError, match="empty item"):
        read_keys(environ={ENV_VAR: KEYS[0] + ",,"})


SECRET = "secret-part-of-a-key"  # a bad key's text never appears in the error


@pytest.mark.parametrize(("key", "problem"), [
    ("short-key", "has 9 characters; use at least 16"),
    (SECRET + " more", "holds ' ' at position 21; a key is printable ASCII without spaces"),
    (SECRET + "\tmore", r"holds '\\t' at position 21"),
    (SECRET + "\x00", r"holds '\\x00' at position 21"),
    (SECRET + "ü", "holds 'ü' at position 21"),
])
def test_a_bad_key_is_refused_naming_where_it_came_from(key, problem, tmp_path, capsys):
    with pytest.raises(ValueError, match=f"^--api-key: the key {problem}") as err:
        read_keys([key], environ={})
    assert SECRET not in str(err.value)
    with pytest.raises(ValueError, match=f"^{ENV_VAR}: key 2 {problem}"):
        read_keys(environ={ENV_VAR: f"{KEYS[0]},{key}"})
    keys = tmp_path / "keys"
    keys.write_text(f"{KEYS[0]}\n{key}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"file {keys}): key 2 ")):
        read_keys(environ={ENV_VAR: str(keys)})
    with pytest.raises(ValueError, match=f"^api_keys: the key {problem}"):
        create_app({}, api_keys=[key])
    assert cli.main(["serve", "no/such/run", "--api-key", key]) == 2  # before any run loads
    message = capsys.readouterr().err
    assert "--api-key: the key" in message and SECRET not in message


def test_keys_must_be_a_list_of_strings():
    with pytest.raises(ValueError, match="expected a list of keys, got one str"):
        create_app({}, api_keys=KEYS[0])
    with pytest.raises(ValueError, match="key 2 is a bytes, not a string"):
        create_app({}, api_keys=[KEYS[0], KEYS[1].encode()])
    with pytest.raises(ValueError, match="at least one key"):
        BearerAuth(None, [])


# -- who may listen where -----------------------------------------------------------------------
@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LocalHost.", True), ("0.0.0.0", False), ("::", False),
    ("192.168.1.20", False), ("10.0.0.1", False), ("example.com", False), ("", False),
    ("128.0.0.1", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_a_host_beyond_loopback_needs_keys_or_no_auth():
    with pytest.raises(ValueError) as refused:
        keys_for_host("0.0.0.0", environ={})
    for named in ("--host 0.0.0.0", "--api-key", ENV_VAR, "--no-auth"):
        assert named in str(refused.value)
    assert keys_for_host("0.0.0.0", no_auth=True, environ={}) == ()
    assert keys_for_host("0.0.0.0", KEYS[:1], environ={}) == KEYS[:1]
    assert keys_for_host("0.0.0.0", environ={ENV_VAR: KEYS[1]}) == KEYS[1:]
    assert keys_for_host("127.0.0.1", environ={}) == ()
    assert keys_for_host("localhost", KEYS, environ={}) == KEYS
    with pytest.raises(ValueError, match="--no-auth serves without keys, but"):
        keys_for_host("127.0.0.1", no_auth=True, environ={ENV_VAR: KEYS[0]})


def test_serve_on_all_interfaces_without_a_key_stops_before_loading(run_dirs, monkeypatch):
    """The command in a process of its own: exit 2 and the message, before Keras is imported
    (in about a second), so before any run loads."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    command = ("import sys; from transformerkit.cli import main; code = main(sys.argv[1:]); "
               "print('keras' in sys.modules); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", command, "serve", str(run_dirs[0]),
                             "--host", "0.0.0.0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "False\n"
    assert result.stderr.startswith("transformerkit serve: error: --host 0.0.0.0 lets other "
                                     "machines call the server, and no API key is set")
    assert "--no-auth" in result.stderr and ENV_VAR in result.stderr
    assert "loaded" not in result.stderr


@pytest.fixture
def served(runs, monkeypatch):
    """``transformerkit serve`` up to the server's ``run``, which records its app and host
    instead of serving; the runs are those already loaded (the run folders are not looked
    at)."""
    from transformerkit.serving import server, shutdown

    calls = []
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(server, "check_runs", lambda run_dirs, checkpoint: None)
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):  # serve sets them
        monkeypatch.setenv(name, os.environ.get(name, "1024"))
    monkeypatch.setattr(server, "load_runs", lambda run_dirs, runtime=None: runs)
    monkeypatch.setattr(shutdown.DrainingServer, "run", lambda self: calls.append(
        (self.config.app, self.config.host)))
    return calls


def ready(client):
    """``client`` once its application says "ready": ``serve`` hands the runs to a loader
    thread that the application starts (polled for at most a minute)."""
    deadline = time.monotonic() + 60
    while client.get("/health").json()["status"] != "ready":
        assert time.monotonic() < deadline, "the served app never became ready"
        time.sleep(0.02)
    return client


def test_serve_with_no_auth_or_keys(served, run_dirs, monkeypatch, caplog):
    caplog.set_level(logging.INFO, "transformerkit.serve")
    assert cli.main(["serve", str(run_dirs[0]), "--host", "0.0.0.0", "--no-auth"]) == 0
    app, host = served.pop()
    assert host == "0.0.0.0"
    with TestClient(app) as client:
        ready(client)
        assert client.get("/models").status_code == 200
    [off] = [r for r in caplog.records if r.getMessage().startswith("API keys: off")]
    assert off.getMessage() == "API keys: off; anyone who can reach 0.0.0.0 may call the API"
    assert off.levelno == logging.WARNING  # other machines may connect
    monkeypatch.setenv(ENV_VAR, KEYS[1])
    assert cli.main(["serve", str(run_dirs[0]), "--host", "0.0.0.0", "--api-key", KEYS[0]]) == 0
    app, _ = served.pop()
    with TestClient(app) as client:
        ready(client)
        assert_refused(client.get("/models"))
        for key in KEYS:
            assert client.get("/models", headers={"Authorization": f"Bearer {key}"}).is_success
    assert "API keys: on (2 keys)" in caplog.text
    assert not any(key in caplog.text for key in KEYS)  # never logged


def test_no_auth_and_keys_together_are_refused(served, run_dirs, capsys):
    assert cli.main(["serve", str(run_dirs[0]), "--no-auth", "--api-key", KEYS[0]]) == 2
    assert "--no-auth serves without keys" in capsys.readouterr().err
    assert not served


def test_the_manuals_api_key_commands(served, runs, tmp_path, monkeypatch):
    """The commands of docs/serving.md's "API keys": the server line (``env VAR=... cmd``)
    through the command line with a keys file, then its ``curl`` request with the key and
    without."""
    import shlex

    from manual import commands
    from paths import ROOT

    lines = [line for line in commands(ROOT / "docs" / "serving.md")
             if ENV_VAR in line or "Authorization: Bearer" in line]
    assert len(lines) == 2, lines
    server_line, curl_line = map(shlex.split, lines)
    assert server_line[0] == "env" and server_line[2:4] == ["transformerkit", "serve"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keys.txt").write_text(f"# the key of the web app\n{KEYS[0]}\n")
    name, value = server_line[1].split("=")
    monkeypatch.setenv(name, value)
    assert cli.main(server_line[3:]) == 0
    app, host = served.pop()
    assert host == "0.0.0.0"
    path = next(w for w in curl_line if w.startswith("localhost:8000/")).removeprefix(
        "localhost:8000")
    header = curl_line[curl_line.index("-H") + 1]
    with TestClient(app) as client:
        ready(client)
        name, value = header.split(": ")
        answered = client.get(path, headers={name: value.replace("$KEY", KEYS[0])})
        assert answered.status_code == 200 and answered.json()["default"] == "numbers"
        assert_refused(client.get(path))
