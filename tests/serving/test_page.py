"""The page of ``transformerkit serve`` in a real browser (slow).

Starts ``transformerkit serve`` (uvicorn) on 127.0.0.1 and a free port with the two tiny
runs of ``conftest.py`` (trained once for the whole test run), drives headless Chromium
(Debian's ``/usr/bin/chromium``; Playwright never downloads a browser here) through the
page: a sentence is translated (the n-best list equals what the API answers), the
cross-attention heatmaps are drawn (one canvas per head, painted, with the weight shown on
hover), an empty input shows the server's error, and a GPT run generates text, shown piece
by piece as the server streams it. The screenshot of the translated sentence is taken every
time (into the test's temporary folder); with ``TRANSFORMERKIT_UPDATE_SCREENSHOT=1`` it replaces the
README's ``docs/images/serve_page.png`` (a test run leaves the checkout unchanged otherwise).
"""

import contextlib
import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from paths import ROOT

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("fastapi")

CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = ROOT / "docs" / "images" / "serve_page.png"
API_KEYS = "TRANSFORMERKIT_API_KEYS"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url, body=None, key=None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def serving(run_dirs, folder, env=None):
    """The URL of ``transformerkit serve`` on ``run_dirs`` (127.0.0.1, a free port, the
    environment ``env``) once it answers ``/health``; stopped at the end."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt install chromium)")
    port = free_port()
    log = open(folder / "serve.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "transformerkit.cli", "serve", *map(str, run_dirs),
         "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            try:
                if get_json(url + "/health")["status"] == "ready":
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the server did not start:\n" +
                            (folder / "serve.log").read_text()[-3000:])
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def server(run_dirs, tmp_path_factory):
    """The URL of a running ``transformerkit serve`` on the two served runs (conftest.py)."""
    env = {name: value for name, value in os.environ.items() if name != API_KEYS}
    with serving(run_dirs, tmp_path_factory.mktemp("page"), env) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, shared by the tests of this file (one Playwright per process)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt install chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(server, browser):
    page = browser.new_page(viewport={"width": 980, "height": 640})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(server + "/")
    page.wait_for_selector("#translate-panel:not([hidden])")
    yield page
    page.close()
    assert not errors, errors  # no script error on the page


def test_translation_and_heatmaps(page, server, tmp_path):
    page.fill("#source", "drei vier fuenf")
    page.fill("#beam", "4")
    page.fill("#nbest", "3")
    page.click("#translate")
    page.wait_for_selector("canvas.heatmap")
    shown = page.locator("#translations li .hyp").all_inner_texts()
    expected = get_json(server + "/translate", {"texts": ["drei vier fuenf"], "beam_size": 4,
                                                "n_best": 3})["n_best"][0]
    assert shown == [h["text"] for h in expected]
    scores = page.locator("#translations li .score").all_inner_texts()
    assert scores == [f"{h['score']:.3f}" for h in expected]
    attention = get_json(server + "/attention", {"source": "drei vier fuenf",
                                                 "target": expected[0]["text"]})
    canvases = page.locator("canvas.heatmap")
    assert canvases.count() == attention["heads"]
    layers = page.locator("#layer option").all_inner_texts()
    assert layers == [str(i + 1) for i in range(attention["layers"])]
    painted = page.evaluate("""() => [...document.querySelectorAll('canvas.heatmap')].map(c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let blue = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i + 2] > d[i] + 40) blue++;
        return blue; })""")
    assert all(count > 0 for count in painted), painted  # every head has shaded cells
    # hover the bottom-right cell: the last target piece over the last source piece
    canvases.first.scroll_into_view_if_needed()
    box = canvases.first.bounding_box()
    page.mouse.move(box["x"] + box["width"] - 4, box["y"] + box["height"] - 4)
    tip = page.locator("#tip")
    assert tip.is_visible()
    weight = attention["attention"]["cross"][-1][0][-1][-1]
    assert tip.inner_text() == (f"{attention['target_input_tokens'][-1]} → "
                                f"{attention['source_tokens'][-1]}: {weight:.4f}")
    from transformerkit.files import atomic_path

    update = os.environ.get("TRANSFORMERKIT_UPDATE_SCREENSHOT") == "1"
    target = SCREENSHOT if update else tmp_path / SCREENSHOT.name
    with atomic_path(target) as temporary:
        page.screenshot(path=str(temporary), type="png", full_page=True)
    assert target.read_bytes().startswith(b"\x89PNG")
    page.mouse.move(0, 0)


def test_empty_input_shows_the_servers_error(page):
    page.fill("#source", "   ")
    page.click("#translate")
    sync_api.expect(page.locator("#translate-error")).not_to_be_empty()
    assert page.inner_text("#translate-error") == "text 0 is empty: send some text"
    assert page.locator("#translations li").count() == 0
    assert page.locator("#attention-panel").is_hidden()


def test_generation_with_a_gpt_run(page, server):
    page.select_option("#model", "poet")
    page.wait_for_selector("#generate-panel:not([hidden])")
    assert page.locator("#translate-panel").is_hidden()
    page.fill("#prompt", "ein zwei")
    page.fill("#temperature", "0.5")
    page.fill("#topk", "3")
    page.fill("#seed", "11")
    page.fill("#maxnew", "20")
    # every text the output shows, in order (the page streams: a text per piece)
    page.evaluate("""() => {
      window.shown = [];
      new MutationObserver((records) => {
        for (const r of records) for (const n of r.addedNodes) window.shown.push(n.textContent);
      }).observe(document.getElementById("generated"), {childList: true});
    }""")
    page.click("#generate")
    expected = get_json(server + "/generate", {"prompt": "ein zwei", "model": "poet",
                                               "temperature": 0.5, "top_k": 3, "seed": 11,
                                               "max_new_tokens": 20})["text"]
    sync_api.expect(page.locator("#generated")).to_have_text(expected, timeout=30_000)
    sync_api.expect(page.locator("#generate")).to_be_enabled()
    shown = page.evaluate("window.shown")
    assert shown[0] == "ein zwei" and shown[-1] == expected
    growing = [a for a, b in itertools.pairwise(shown) if b.startswith(a) and len(b) > len(a)]
    assert len(growing) >= 5, shown  # the text grew piece by piece


def test_the_page_asks_for_the_key_of_a_server_with_keys(run_dirs, browser, tmp_path):
    """A server with a key (from a file named by ``$TRANSFORMERKIT_API_KEYS``): the page asks
    for it, says so when a wrong one is typed, and with the right one translates; the key is
    kept for the tab and sent with every later call."""
    key = "page-test-key-0123456789"
    (tmp_path / "keys.txt").write_text(f"# the page test's key\n{key}\n")
    env = {**os.environ, API_KEYS: str(tmp_path / "keys.txt")}
    with serving(run_dirs, tmp_path, env) as url:
        page = browser.new_page()  # a context of its own: an empty sessionStorage
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: message.type == "error"
                and "401" not in message.text and errors.append(message.text))
        page.goto(url + "/")
        sync_api.expect(page.locator("#key-panel")).to_be_visible()
        assert page.inner_text("#key-message") == "This server needs an API key."
        assert page.locator("#translate-panel").is_hidden()
        page.fill("#key", "wrong-key-0123456789abc")
        page.click("#key-submit")
        sync_api.expect(page.locator("#key-message")).to_have_text(
            "That key was not accepted; try again.")
        sync_api.expect(page.locator("#key-panel")).to_be_visible()
        page.fill("#key", key)
        page.press("#key", "Enter")
        page.wait_for_selector("#translate-panel:not([hidden])")
        assert page.locator("#key-panel").is_hidden()
        page.fill("#source", "drei vier fuenf")
        page.click("#translate")
        page.wait_for_selector("canvas.heatmap")  # /translate, then /attention, with the key
        expected = get_json(url + "/translate", {"texts": ["drei vier fuenf"], "beam_size": 4,
                                                 "n_best": 3}, key=key)["n_best"][0]
        shown = page.locator("#translations li .hyp").all_inner_texts()
        assert shown == [h["text"] for h in expected]
        assert page.evaluate("sessionStorage.getItem('transformerkit-api-key')") == key
        page.reload()  # the tab keeps the key: no question this time
        page.wait_for_selector("#translate-panel:not([hidden])")
        assert page.locator("#key-panel").is_hidden()
        page.close()
    assert not errors, errors  # no script error, no Content-Security-Policy violation
