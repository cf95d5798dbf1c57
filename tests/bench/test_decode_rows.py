"""``bench/decode_precision.py --rows``: the live-row spread of a search to EOS, counted from
output lengths, and its table."""

from paths import load_bench


def test_live_row_steps_counts_each_batch_until_its_longest_sentence_ends():
    bench = load_bench("decode_precision")
    # batch [1, 3]: 1 step with 2 rows, 2 with 1; batch [3, 5]: 3 steps with 2 rows, 2 with 1
    counts = bench.live_row_steps([1, 3, 3, 5], batch=2)
    assert counts == {"1-1": 4, "2-4": 4, "5-16": 0, "17-63": 0, "64-64": 0}
    # a full batch of 64 that ends together never shrinks; a lone leftover sentence of 5
    counts = bench.live_row_steps([2] * 64 + [5], batch=64)
    assert counts == {"1-1": 5, "2-4": 0, "5-16": 0, "17-63": 0, "64-64": 2}
    # 40 sentences of 1 token and 24 of 10: 1 step with 64 rows, 9 with 24
    counts = bench.live_row_steps([1] * 40 + [10] * 24, batch=64)
    assert counts == {"1-1": 0, "2-4": 0, "5-16": 0, "17-63": 9, "64-64": 1}
    assert sum(counts.values()) == 10  # a batch runs as many steps as its longest output


def test_rows_table_has_a_row_per_system_and_a_column_per_row_count():
    bench = load_bench("decode_precision")
    result = {"system": "tk-bfloat16", "to_eos_seconds": 2.5,
              "ms_per_position": {str(rows): float(rows) for rows in bench.ROW_COUNTS},
              "live_row_steps": bench.live_row_steps([3, 1], batch=2)}
    lines = bench.rows_table([result]).splitlines()
    assert len(lines) == 3
    assert lines[0].count("ms/position") == len(bench.ROW_COUNTS)
    assert lines[2] == "| tk-bfloat16 | 1.0 | 4.0 | 16.0 | 64.0 | 2.5 | 2, 1, 0, 0, 0 |"
