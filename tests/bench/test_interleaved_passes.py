"""``bench/decode_precision.py``'s protocol of kept workers: a worker process answers one
request per line and its other output is ignored, a dead one reads as an error, and the
controller gives the systems their turns pass by pass, every other round reversed, dropping a
system whose pass fails."""

import textwrap
import types

from paths import load_bench

ECHO = textwrap.dedent("""
    import json, sys
    ANSWER = sys.argv[1]
    for line in sys.stdin:
        message = json.loads(line)
        print("a line that is not an answer", flush=True)
        if message == "die":
            sys.exit("the worker gave up")
        print(ANSWER + json.dumps({"got": message}), flush=True)
""")


def test_kept_worker_answers_each_request_and_reports_its_end(tmp_path):
    common = load_bench("common")
    script = tmp_path / "echo.py"
    script.write_text(ECHO)
    worker = common.KeptWorker(str(script), [common.ANSWER])
    try:
        assert worker.ask(3) == {"got": 3}
        assert worker.ask([1, "x"]) == {"got": [1, "x"]}  # the same process, still running
        assert worker.ask("die") == {"error": "the worker gave up"}
        assert worker.ask(4) == {"error": "the worker gave up"}  # ended: no hang
    finally:
        worker.close()


class FakeWorker:
    """Stands for a :class:`KeptWorker`: records each turn, fails where told."""

    turns, made = [], []

    def __init__(self, script, args, env_extra=None):
        import json

        self.system = json.loads(args[1])["system"]
        self.closed = False
        FakeWorker.made.append(self)

    def ask(self, index):
        FakeWorker.turns.append((self.system, index))
        if self.system == "ct2-int8" and index == 1:
            return {"error": "RuntimeError: no"}
        return {"system": self.system, "workload": index, "seconds": 1.0}

    def close(self):
        self.closed = True


def test_interleaved_passes_alternate_the_order_each_round_and_drop_a_failed_system(
        monkeypatch):
    bench = load_bench("decode_precision")
    monkeypatch.setattr(bench.common, "KeptWorker", FakeWorker)
    monkeypatch.setattr(bench, "PAUSE", 0)
    monkeypatch.setattr(bench, "WORKLOADS", [("greedy", 64, False), ("beam4", 64, False),
                                             ("greedy", 32, True)])
    FakeWorker.turns, FakeWorker.made = [], []
    args = types.SimpleNamespace(threads=1, run=".", batch=64, repeats=2)
    failed = []
    systems = ["tk-compiled", "ct2-int8"]
    passes = list(bench.interleaved_passes(args, systems, {}, failed))
    assert FakeWorker.turns == [
        ("tk-compiled", 0), ("ct2-int8", 0), ("ct2-int8", 0), ("tk-compiled", 0),
        ("tk-compiled", 1), ("ct2-int8", 1),  # fails: no further turn
        ("tk-compiled", 1), ("tk-compiled", 2), ("tk-compiled", 2)]
    assert [p[0]["system"] for p in passes] == [
        "tk-compiled", "ct2-int8", "ct2-int8", "tk-compiled"] + ["tk-compiled"] * 4
    assert failed == [{"system": "ct2-int8", "error": "RuntimeError: no"}]
    assert [w.system for w in FakeWorker.made] == systems
    assert all(w.closed for w in FakeWorker.made)  # the failed one at once, the rest at the end
