"""``bench/search_defaults.py``: the grid's table, and the live-rows A/B set against the same
loop keeping every row."""

from paths import load_bench


def grid_row(search, stopping, cap):
    return dict(search=search, stopping=stopping, max_len_a=cap and cap[0],
                max_len_b=cap and cap[1], bleu=30.0, chrf=50.0, sentences_per_second=100.0,
                outputs_at_cap=0, mean_output_tokens=12.5)


def test_the_table_is_the_grid_and_the_live_rows_only_when_measured():
    bench = load_bench("search_defaults")
    payload = dict(sentences=1014, run="RUN", threads=2, rounds=2,
                   grid=[grid_row("greedy", None, None), grid_row("beam4", "early", (1.2, 10))],
                   live_rows=[])
    table = bench.table(payload)
    assert "| greedy | - | - | - | 30.00 |" in table
    assert "| beam4 | early | 1.2 | 10 | 30.00 |" in table
    assert "Live rows" not in table
    payload.update(ab_sentences=192, ab_rounds=2, live_rows=[
        dict(forced_32=forced, search=search, rows=rows, outputs_equal_kept=True,
             sentences_per_second=rate)
        for forced in (False, True) for search in ("greedy", "beam4")
        for rows, rate in (("kept", 50.0), ("live", 100.0))])
    table = bench.table(payload)
    assert "| to EOS | greedy | 50.0 | 100.0 | 2.00x | True |" in table
    assert "| forced 32 | beam4 | 50.0 | 100.0 | 2.00x | True |" in table
