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


def test_kept_results_add_the_earlier_runs_not_measured_again_on_the_same_cpu(tmp_path,
                                                                                 monkeypatch):
    import json

    import pytest

    bench = load_bench("budgeted_training")
    monkeypatch.setattr(bench.common, "RESULTS", str(tmp_path))
    machine = {"cpu": "AMD EPYC", "cpu_flags": ["avx2"], "cores": 2, "command": "python b.py"}
    earlier = [dict(budget="660", recipe="recipe", seed=0, val_bleu=29.0),
               dict(budget="660", recipe="schedule", seed=0, val_bleu=26.0)]
    (tmp_path / "bt.epyc-avx2.json").write_text(json.dumps(
        {"machine": dict(machine, command="python a.py"), "results": earlier,
         "recipes": {"recipe": [], "schedule": ["train.cooldown=0"]}}))
    fresh = [dict(budget="660", recipe="recipe", seed=0, val_bleu=29.5),
             dict(budget="660", recipe="lr0.25", seed=0, val_bleu=30.0)]
    results, recipes, commands = bench.kept_results(
        "bt", machine, fresh, {"recipe": [], "lr0.25": ["train.lr_scale=0.25"]})
    assert [(r["recipe"], r["val_bleu"]) for r in results] == [
        ("schedule", 26.0), ("recipe", 29.5), ("lr0.25", 30.0)]  # the rerun replaces
    assert list(recipes) == ["recipe", "schedule", "lr0.25"]
    assert commands == ["python a.py", "python b.py"]
    with pytest.raises(SystemExit, match="not this CPU"):
        bench.kept_results("bt", dict(machine, cpu="AMD EPYC 9R14"), fresh, {})  # same family
    assert bench.kept_results("absent", machine, fresh, {})[0] == fresh


def test_the_paired_table_subtracts_the_baseline_seed_by_seed():
    bench = load_bench("budgeted_training")

    def result(budget, recipe, seed, val, test):
        return dict(budget=budget, recipe=recipe, seed=seed, val_bleu=val, test2016_bleu=test)

    results = [result("660", "recipe", 0, 30.0, 31.0), result("660", "schedule", 0, 26.0, 31.5),
               result("660", "recipe", 1, 31.0, 32.0), result("660", "schedule", 1, 28.0, 30.0),
               result("660", "recipe", 2, 29.0, 30.0),  # no baseline of seed 2: left out
               result("1320", "recipe", 0, 35.0, 36.0)]  # no baseline at all: no row
    lines = bench.paired(results).splitlines()
    assert lines[2] == ("| 660 updates | 2 | +3.50 (+4.0, +3.0) | 2 of 2 | +0.75 (-0.5, +2.0) "
                        "| 1 of 2 |")
    assert len(lines) == 3
    assert bench.paired([result("660", "recipe", 0, 30.0, 31.0)]) == ""
