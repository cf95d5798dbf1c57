"""``bench/gpt2_generate.py``: the vocabulary it writes has GPT-2's layout at the asked size,
and its summary keeps each system's best round, the compile and cached load times and the
agreement with ``transformers``."""

from paths import load_bench


def test_the_vocabulary_has_exactly_the_size_with_the_end_token_last(tmp_path):
    bench = load_bench("gpt2_generate")
    texts = ["A man in an orange hat starring at something.",
             "Two dogs run through the snow."] * 20
    tokenizer = bench.write_vocabulary(str(tmp_path), 400, texts)
    assert len(tokenizer) == 400
    assert tokenizer.convert_tokens_to_ids(bench.END) == 399
    assert tokenizer.eos_token == bench.END
    ids = tokenizer.encode("Two dogs run.")
    assert tokenizer.decode(ids) == "Two dogs run."
    assert max(ids) < 399  # the fillers are never produced by the merges


def test_the_summary_keeps_the_best_round_and_the_compile_and_load_times():
    bench = load_bench("gpt2_generate")

    def run(system, round_index, seconds, first, outputs):
        return dict(system=system, batch=2, round=round_index, seconds=seconds,
                    first_call_seconds=first, load_seconds=1.0, outputs=outputs)

    same, other = [[1, 2], [3, 4]], [[1, 2], [3, 5]]
    timings = {("hf", 2): [run("hf", 0, 2.0, 2.1, same), run("hf", 1, 1.6, 1.7, same)],
               ("tk-compiled", 2): [run("tk-compiled", 0, 1.0, 61.0, other),
                                    run("tk-compiled", 1, 0.8, 1.3, other)]}
    rows = bench.summarize(timings, new_tokens=2)
    assert [r["system"] for r in rows] == ["tk-compiled", "hf"]  # SYSTEMS' order
    compiled, hf = rows
    assert compiled["seconds"] == 0.8 and hf["seconds"] == 1.6
    assert compiled["tokens_per_second"] == 5.0 and compiled["ms_per_token"] == 400.0
    assert compiled["compile_seconds"] == 60.0 and compiled["cached_load_seconds"] == 0.5
    assert compiled["same_as_hf"] == 0.5 and hf["same_as_hf"] == 1.0
    table = bench.table(rows, threads=1).splitlines()
    assert table[2] == "| 2 | tk-compiled | 400.0 | 5.0 | 2.00x | - | - | 50% | 60.0 / 0.5 |"
