"""``bench/serve_soak.py`` in its short form on the two tiny runs of ``conftest.py``: about
18 seconds of mixed traffic (translations, n-best, attention, generation, streamed generation
when the server has it, and the invalid classes) from 4 clients against ``transformerkit
serve`` started by the script. No answer is a 5xx or a connection error, every valid request
is answered 200 and every invalid one with its own 4xx, and the report files hold each
window's throughput, latencies per class, outcomes and the server's memory."""

import json
import os
import subprocess
import sys

import pytest
from paths import ROOT

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

pytestmark = pytest.mark.slow


def test_the_short_soak_reports_every_window_and_no_server_error(run_dirs, tmp_path):
    numbers, poet = run_dirs
    out = tmp_path / "serve_soak"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "serve_soak.py"), str(numbers), str(poet),
         "--minutes", "0.3", "--window-s", "6", "--clients", "4", "--source", "generated",
         "--max-new-tokens", "8", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads((out.with_suffix(".json")).read_text())
    windows = payload["windows"]
    assert [w["window"] for w in windows] == [1, 2, 3]
    classes = set(payload["class_weights"])
    assert {"translate", "nbest", "attention", "generate", "bad_json", "unknown_field",
            "empty_text", "too_long", "unknown_model", "wrong_content_type",
            "oversized_body"} <= classes
    assert ("generate_stream" in classes) == payload["streamed_generation"]
    totals = {key: sum(w["outcomes"][key] for w in windows) for key in windows[0]["outcomes"]}
    assert totals["5xx"] == totals["connection"] == 0, payload["problem_samples"]
    assert totals["wrong_4xx"] == totals["unexpected_4xx"] == 0, payload["problem_samples"]
    assert totals["unexpected_status"] == 0, payload["problem_samples"]
    assert totals["ok"] > 50 and totals["expected_4xx"] > 0
    assert sum(w["requests"] for w in windows) == payload["requests"]
    seen = set()
    for w in windows:
        assert w["requests_per_s"] > 0 and w["rss_mib_end"] > 50  # a loaded Keras server
        assert w["valid_p50_ms"] <= w["valid_p99_ms"]
        for kind, found in w["by_class"].items():
            assert found["requests"] > 0 and found["p50_ms"] <= found["p99_ms"], (kind, found)
            seen.add(kind)
    assert {"translate", "nbest", "attention", "generate"} <= seen
    goals = {g["goal"]: g for g in payload["goals"]}
    assert goals["no 5xx answer"]["pass"] is True and len(goals) == 3
    report = out.with_suffix(".md").read_text()
    assert "| window | requests/s |" in report and "PASS: no 5xx answer" in report
    assert payload["machine"]["cpu"] in report
