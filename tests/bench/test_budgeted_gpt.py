"""``bench/budgeted_gpt.py``: the overrides of each recipe's run and the paired table."""

import pytest
from paths import load_bench


def test_each_recipe_runs_under_the_budget_but_fitted_under_the_cut_runs_updates():
    bench = load_bench("budgeted_gpt")
    recipes = dict(bench.RECIPES)
    assert bench.overrides("20s", 1, "cut", recipes)[:2] == ["train.time_budget=20s",
                                                              "train.seed=1"]
    assert bench.overrides("20s", 1, "cut", recipes)[-1] == "train.cooldown=0"
    assert bench.overrides("20s", 1, "cooldown", recipes)[-1] == "train.cooldown=0.2"
    fitted = bench.overrides("20s", 1, "fitted", recipes, steps_of_cut=517)
    assert fitted[:2] == ["train.max_steps=517", "train.time_budget=null"]
    with pytest.raises(SystemExit, match="cut run first"):
        bench.overrides("20s", 1, "fitted", recipes)


def test_the_table_pairs_each_recipe_with_the_cut_run_of_its_seed():
    bench = load_bench("budgeted_gpt")

    def result(recipe, seed, loss, steps=500):
        return dict(budget="20s", recipe=recipe, seed=seed, val_loss=loss, steps=steps,
                    final_learning_rate=1e-4)

    results = [result("cut", 0, 2.0), result("cooldown", 0, 1.9),
               result("cut", 1, 2.2), result("cooldown", 1, 2.25)]
    lines = bench.table(results, ["cut", "cooldown"]).splitlines()
    assert lines[2] == ("| 20s | cut | 2 | 500, 500 | 1.00e-04 | 2.1000 (2.0000, 2.2000) |  |")
    assert lines[3].endswith("| 2.0750 (1.9000, 2.2500) | -0.025 (-0.100, +0.050) |")
    assert len(lines) == 4
