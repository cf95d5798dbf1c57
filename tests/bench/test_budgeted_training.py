"""``bench/budgeted_training.py``: what counts as a repeated phrase, the run each budget
makes, and the table of means and seeds."""

from paths import load_bench


def test_a_repeated_phrase_is_a_word_4gram_seen_twice():
    bench = load_bench("budgeted_training")
    assert bench.repeats_a_phrase("A man wearing a red vest is wearing a red vest , and a red "
                                  "vest is sitting in a red vest is sitting in a red vest .")
    assert not bench.repeats_a_phrase("a man in a red vest is wearing a red vest")  # 3-grams
    assert not bench.repeats_a_phrase("a red vest , a red hat")  # 3-grams only
    assert not bench.repeats_a_phrase("A dog runs through the snow .")
    assert bench.repeats_a_phrase("One two three four ONE TWO THREE FOUR")  # case folded


def test_a_budget_is_updates_or_minutes(monkeypatch):
    bench = load_bench("budgeted_training")
    calls = []
    monkeypatch.setattr(bench.common, "train_run",
                        lambda config, run_dir, overrides: calls.append(overrides) or 1.0)
    bench.train("/tmp/x", "660", 2, ["train.cooldown=0"])
    bench.train("/tmp/x", "2.5m", 0, [])
    assert calls[0][:2] == ["train.max_steps=660", "train.time_budget=null"]
    assert "train.seed=2" in calls[0] and calls[0][-1] == "train.cooldown=0"
    assert calls[1][:2] == ["train.time_budget=2.5m", "train.max_steps=null"]


def test_the_table_has_the_mean_and_each_seed_per_budget_and_recipe():
    bench = load_bench("budgeted_training")

    def result(budget, recipe, seed, val, test, steps=660):
        return dict(budget=budget, recipe=recipe, seed=seed, val_bleu=val, val_chrf=50.0,
                    test2016_bleu=test, test2016_chrf=51.0, repeated_phrase_share=0.02,
                    steps=steps)

    results = [result("660", "schedule", 0, 25.0, 28.0), result("660", "schedule", 1, 27.0, 29.0),
               result("660", "cooldown", 0, 28.0, 30.0),
               result("2.5m", "cooldown", 0, 30.0, 31.0, steps=706)]
    lines = bench.table(results, ["schedule", "cooldown"]).splitlines()
    assert lines[2] == ("| 660 updates | schedule | 2 | 26.00 (25.0, 27.0) | 50.0 | 28.50 (28.0, "
                        "29.0) | 51.0 | 2.0% |")
    assert lines[3].startswith("| 660 updates | cooldown | 1 | 28.00 (28.0) |")
    assert lines[4].startswith("| 2.5m (706 updates) | cooldown | 1 | 30.00 (30.0) |")
    assert len(lines) == 5
