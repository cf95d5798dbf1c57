"""``bench/argmax_ids.py``: every way it times gives NumPy's ids (a way that does not is
caught), and its table shows what it measured."""

import pytest
from paths import load_bench

torch = pytest.importorskip("torch")


def test_each_way_gives_numpys_ids_and_a_wrong_one_is_caught():
    bench = load_bench("argmax_ids")
    ways = bench.ways()
    assert tuple(ways) == bench.WAYS
    results = bench.time_ways(ways, [1, 9], [300, 1000], repeats=2, tensors=3)
    assert [(row["rows"], row["vocab"]) for row in results] == [(1, 300), (9, 300),
                                                                (1, 1000), (9, 1000)]
    assert all(set(row["us"]) == set(bench.WAYS) and min(row["us"].values()) > 0
               for row in results)
    lines = bench.table(results, 2, 1).splitlines()
    assert lines[0].startswith("| rows | vocabulary | numpy, us |")
    assert lines[2].startswith(f"| 1 | 300 | {results[0]['us']['numpy']:.1f} |")
    # the last column of the tie inside each row: not the first one, so not numpy's
    wrong = {"last": lambda x: x.shape[1] - 1 - torch.flip(x, [1]).argmax(1)}
    with pytest.raises(AssertionError, match="last differs from numpy.argmax"):
        bench.time_ways(wrong, [2], [300], repeats=1, tensors=1)
