"""``bench/search_work.py``: its inputs are what a beam search's step work package takes, it
times both ways only where they give identical outputs, and its table shows what it measured.
(The two ways' packages equal the eager work: ``tests/decoding/test_compiled_step.py``.)"""

import pytest
from paths import load_bench


def test_inputs_are_the_packages_signature():
    from transformerkit.decoding import aot_search

    bench = load_bench("search_work")
    inputs = bench.inputs_for(sentences=3, beam_size=4, vocab=50)
    assert len(inputs) == 2 + len(aot_search.FIELDS)
    logits, index, alive, alive_logp = inputs[:4]
    assert logits.shape == (12, 50) and int(index) == bench.INDEX
    assert alive.shape[0] == 12 and alive_logp.shape == (3, 4)
    assert inputs[-1].shape == (3,) and bool(inputs[-1].all())  # every sentence active


def test_both_ways_are_timed_on_identical_outputs_and_a_difference_stops_it():

    bench = load_bench("search_work")

    def package(shift):
        def call(inputs):
            assert len(inputs) == 11
            return [inputs[0].amax(1) + shift, inputs[3]]

        return call

    same = {"written": (package(0.0), 1.0), "unwritten": (package(0.0), 1.0)}
    results = bench.time_ways(same, [1, 2], beam_size=4, vocab=40, repeats=3, calls=2)
    assert [(row["sentences"], row["rows"]) for row in results] == [(1, 4), (2, 8)]
    for row in results:
        for kind in ("median_ms", "best_ms"):
            assert set(row[kind]) == set(bench.WAYS) and min(row[kind].values()) > 0
            assert row["best_ms"]["written"] <= row["median_ms"]["written"]
    differing = dict(same, unwritten=(package(1.0), 1.0))
    with pytest.raises(SystemExit, match="differ at 2 sentences"):
        bench.time_ways(differing, [2], beam_size=4, vocab=40, repeats=1, calls=1)


def test_table_shows_each_count_and_the_ratio():
    bench = load_bench("search_work")
    results = [{"sentences": 64, "rows": 256, "median_ms": {"written": 5.51, "unwritten": 3.482},
                "best_ms": {"written": 5.0, "unwritten": 3.2}}]
    lines = bench.table(results, {"written": 17.0, "unwritten": 16.4}, 4, 8000, 25,
                        30).splitlines()
    assert lines[2] == "| 64 | 256 | 5.510 | 3.482 | 0.63 |"
    assert lines[-1].startswith("Beam 4, 8000 words, the step at index 5; median of 25 "
                                "interleaved rounds of 30 calls")
    assert lines[-1].endswith("Built in 17 s (written) and 16 s (unwritten).")
    assert "30 calls, 1 thread;" in lines[-1]
    two = bench.table(results, {"written": 17.0, "unwritten": 16.4}, 4, 8000, 25, 30, 2)
    assert "30 calls, 2 threads;" in two.splitlines()[-1]
