"""``bench/drop_share.py``: its table keeps each share's best pass, compares the best share
with dropping at every step (share 0), and says when the shares' outputs differ."""

from paths import load_bench


def test_table_has_each_shares_best_pass_and_the_gain_over_share_zero():
    bench = load_bench("drop_share")
    results = [{"system": "tk-compiled", "seconds": {"0.0": [2.0, 1.6], "0.125": [1.5, 1.7]},
                "same_outputs": True},
               {"system": "tk-float32", "seconds": {"0.0": [1.0], "0.125": [1.25]},
                "same_outputs": False}]
    lines = bench.table(results, [0.0, 0.125]).splitlines()
    assert lines[0] == ("| system | share 0.0: s | share 0.125: s | best share against 0 "
                        "| same outputs |")
    assert lines[2] == "| tk-compiled | 1.600 | 1.500 | 1.067x | yes |"
    assert lines[3] == "| tk-float32 | 1.000 | 1.250 | 1.000x | NO |"
