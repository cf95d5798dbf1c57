"""The cooldown of a budgeted run (``training/schedules.py: Cooldown``, ``train.cooldown``):
the schedule against a float64 NumPy reference, retargeting without a jump, fitted to a
time budget from the measured update rate (a clock the test drives), recorded in
``metrics.json``, ``history.csv`` and the checkpoint, and continued by a resumed run."""

import json

import keras
import numpy as np
import pytest
from tiny_run import tiny_config

from transformerkit.training.schedules import Cooldown, TransformerSchedule


def reference(base, steps, start, end, start_progress, shape):
    """float64 ``base(step) * factor``: progress 0 before ``start``, then linear from
    ``start_progress`` at ``start`` to 1 at ``end``."""
    steps = np.asarray(steps, np.float64)
    x = np.clip((steps - start) / max(end - start, 1), 0.0, 1.0)
    p = np.where(steps >= start, start_progress + (1 - start_progress) * x, 0.0)
    factor = 1 - p if shape == "linear" else 1 - np.sqrt(p)
    return base * factor


def paper(steps, d_model=64, warmup=10, scale=1.0):
    step = np.asarray(steps, np.float64) + 1
    return scale * d_model ** -0.5 * np.minimum(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_the_cooldown_is_the_schedule_times_its_factor(shape):
    """``schedule(step) * (1 - p)`` or ``* (1 - sqrt(p))``: the paper's schedule unchanged
    before the last ``fraction`` of the run, zero at its end; a constant rate too."""
    steps = np.arange(120)
    cooled = Cooldown(TransformerSchedule(64, 10), end=100, fraction=0.3, shape=shape)
    assert (cooled.start, cooled.end) == (70, 100)
    got = keras.ops.convert_to_numpy(cooled(steps))
    expected = reference(paper(steps), steps, 70, 100, 0.0, shape)
    # float32: the base within a few units of roundoff; the factor 1 - p (or 1 - sqrt(p))
    # within a few roundoffs of 1 in absolute terms, whatever its own size
    unit = 2.0 ** -24
    np.testing.assert_allclose(got, expected, rtol=8 * unit, atol=8 * unit * paper(steps).max())
    np.testing.assert_array_equal(got[:70], keras.ops.convert_to_numpy(
        TransformerSchedule(64, 10)(steps[:70])))
    assert got[100:].max() == 0 and got[99] > 0
    constant = keras.ops.convert_to_numpy(Cooldown(0.5, end=10, fraction=1.0, shape=shape)(
        np.arange(10)))
    np.testing.assert_allclose(constant, reference(0.5, np.arange(10), 0, 10, 0.0, shape),
                               rtol=8 * unit, atol=8 * unit * 0.5)
    assert cooled.factor(69) == 1.0 and cooled.factor(100) == 0.0  # Python numbers too


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_retargeting_moves_the_end_without_a_jump(shape):
    """Before the cooldown has begun the window moves whole; inside it the rest of the
    window runs from the current update at the current progress: the rate at that update
    is unchanged (shrunk or stretched), it reaches zero at the new end, and the window
    survives ``get_config`` (a checkpoint)."""
    cooled = Cooldown(1.0, end=100, fraction=0.2, shape=shape)
    cooled.retarget(30, 200)  # the cooldown has not begun: the window moves
    assert (cooled.start, cooled.end, cooled.start_progress) == (160, 200, 0.0)
    for step, new_end in ((170, 230), (175, 190)):  # inside the cooldown: stretched, shrunk
        before = float(cooled(step))
        cooled.retarget(step, new_end)
        assert float(cooled(step)) == pytest.approx(before, rel=1e-6)
        assert (cooled.start, cooled.end) == (step, new_end)
        assert float(cooled(new_end)) == 0.0 and float(cooled(new_end - 1)) > 0.0
    rates = keras.ops.convert_to_numpy(cooled(np.arange(step, 190)))
    assert np.all(np.diff(rates) <= 0)
    again = Cooldown.from_config(json.loads(json.dumps(cooled.get_config())))
    assert again.window() == cooled.window()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(np.arange(200))),
                                  keras.ops.convert_to_numpy(cooled(np.arange(200))))
    cooled.retarget(189, 150)  # an end already passed: the next update's rate is zero
    assert cooled.end == 190 and float(cooled(190)) == 0.0


def test_bad_cooldowns_are_clear_errors():
    with pytest.raises(ValueError, match="cooldown shape must be one of linear, 1-sqrt"):
        Cooldown(1.0, end=10, shape="cosine")
    with pytest.raises(ValueError, match=r"cooldown fraction must be in \(0, 1\]"):
        Cooldown(1.0, end=10, fraction=0.0)
    from transformerkit.config import resolve

    with pytest.raises(ValueError, match="cooldown"):
        resolve({"train": {"cooldown": 1.5}})
    with pytest.raises(ValueError, match="cooldown_shape"):
        resolve({"train": {"cooldown_shape": "cosine"}})


def test_the_default_cooldown_follows_the_run_length():
    """null: 0.2 for the paper optimizer when a time budget or max_steps ends the run, none
    for a run of whole epochs or ``adamw_cosine`` (whose cosine decays already); 0: off."""
    from transformerkit.config import resolve
    from transformerkit.training.schedules import DEFAULT_COOLDOWN, cooldown_fraction

    def fraction(**train):
        return cooldown_fraction(resolve({"train": train}).train)

    assert fraction(time_budget="10m") == fraction(max_steps=100) == DEFAULT_COOLDOWN == 0.2
    assert fraction() == 0.0 and fraction(max_steps=100, cooldown=0) == 0.0
    assert fraction(max_steps=100, optimizer="adamw_cosine") == 0.0
    assert fraction(optimizer="adamw_cosine", max_steps=100, cooldown=0.1) == 0.1


class Clock:
    """Seconds that pass only when a batch ends: ``seconds_per_update`` each."""

    def __init__(self, seconds_per_update):
        self.now, self.step = 0.0, seconds_per_update

    def __call__(self):
        return self.now


class Tick(keras.callbacks.Callback):
    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def on_train_batch_end(self, batch, logs=None):
        self.clock.now += self.clock.step


class Rates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


@pytest.mark.parametrize("seconds_per_update", [0.5, 2.0])
def test_a_time_budget_fits_the_cooldown_to_its_end(seconds_per_update):
    """With a clock that gives every update the same seconds, a 200-second budget holds
    ``200 / seconds`` updates: the first estimate (16 updates in) finds that length, the
    run cools down over its last fifth without a jump and stops at the rate's zero
    (``cooldown_end``) within the budget, having used all but a few updates of it."""
    from transformerkit.training.callbacks import StopConditions
    from transformerkit.training.optimizers import Adam
    from transformerkit.training.trainer import attach_cooldown

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=Adam(Cooldown(0.01, end=100_000, fraction=0.2)), loss="mse")
    clock, rates = Clock(seconds_per_update), Rates()
    stop = StopConditions(time_budget=200, cooldown=attach_cooldown(model.optimizer),
                          clock=clock)
    x = np.random.default_rng(0).normal(size=(4096, 3)).astype("float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, shuffle=False,
              callbacks=[rates, Tick(clock), stop])
    updates = int(200 / seconds_per_update)
    steps = len(rates.rates)
    assert stop.stopped_by == "cooldown_end" and stop.elapsed() <= 200
    assert updates - 3 <= steps <= updates, (steps, updates)
    assert stop.cooldown.window()["cooldown_end"] == steps
    start = stop.cooldown.start
    assert abs(start - 0.8 * updates) <= 3
    np.testing.assert_allclose(rates.rates[:start], 0.01, rtol=1e-6)
    cooling = np.asarray(rates.rates[start - 1:])
    assert np.all(np.diff(cooling) <= 1e-9) and cooling[-1] < 0.01 / (0.2 * updates) * 1.5
    assert np.abs(np.diff(cooling)).max() <= 2 * 0.01 / (0.2 * updates)  # no jump
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == 0.0


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_checks_the_time_budget(rank):
    """Several processes: the budget is rank 0's clock. Rank 0 stops at the update that
    spends it (``time_budget``); another rank, whose clock started at another moment, never
    stops on its own (:class:`StopTogether` brings it rank 0's stop on the same update), so
    rank 0, which writes metrics.json, always has the reason."""
    from transformerkit.training.callbacks import StopConditions
    from transformerkit.training.processes import ProcessGroup

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    clock = Clock(1.0)
    stop = StopConditions(time_budget=10, clock=clock,
                          group=ProcessGroup(rank=rank, size=2, kind="torch"))
    x = np.zeros((64, 3), "float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[Tick(clock), stop])
    steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    if rank == 0:
        assert stop.stopped_by == "time_budget" and steps == 10
    else:
        assert stop.stopped_by is None and steps == 16


def test_a_budget_that_outlasts_the_run_leaves_the_cooldown_at_the_runs_end():
    """A 10,000-second budget over a run of 1024 updates (its epochs): every estimate is
    capped at the run's length, so the window stays where the epochs end it (the schedule
    of the same run without a budget: a killed and resumed run repeats it exactly)."""
    from transformerkit.training.callbacks import StopConditions
    from transformerkit.training.optimizers import Adam
    from transformerkit.training.trainer import attach_cooldown

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=Adam(Cooldown(0.01, end=1024, fraction=0.2)), loss="mse")
    clock = Clock(0.5)
    stop = StopConditions(time_budget=10_000, cooldown=attach_cooldown(model.optimizer),
                          clock=clock, longest=1024)
    x = np.zeros((4096, 3), "float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[Tick(clock), stop])
    assert stop.retargets == 0 and stop.cooldown.window()["cooldown_end"] == 1024
    assert stop.stopped_by is None  # the epoch ends the run, at the cooldown's end


def test_a_budgeted_run_records_its_cooldown_and_a_resume_continues_it(tmp_path):
    """``transformerkit.train`` with ``train.time_budget`` as users run it: metrics.json
    holds the final rate and the cooldown's window, history.csv a ``learning_rate``
    column, the checkpoint the budget's seconds; resumed, the run has only the rest of its
    budget and continues the recorded window."""
    from transformerkit.run_directory import RunDirectory
    from transformerkit.training.callbacks import load_checkpoint, read_checkpoint_state
    from transformerkit.training.trainer import attach_cooldown, learning_rates, train

    config = tiny_config(tmp_path, epochs=1000, time_budget="4s", learning_rate=None,
                         warmup_steps=10)
    metrics = train(config, tmp_path / "run")
    run = RunDirectory(tmp_path / "run")
    assert metrics["stopped_by"] in ("cooldown_end", "time_budget")
    window = {k: metrics[k] for k in ("cooldown_start", "cooldown_end",
                                      "cooldown_start_progress")}
    assert metrics["cooldown_fraction"] == 0.2 and metrics["cooldown_shape"] == "linear"
    assert metrics["cooldown_retargets"] >= 1  # the window was fitted to the measured rate
    # the run ends at the cooldown's end, or before it where the budget runs out first (a
    # busy machine slows the updates after the last estimate; the fitting itself is tested
    # above with a clock the test drives)
    assert metrics["cooldown_start"] < metrics["cooldown_end"]
    assert metrics["steps"] <= metrics["cooldown_end"]
    if metrics["stopped_by"] == "cooldown_end":
        assert metrics["steps"] == metrics["cooldown_end"]
    # the recorded final rate is the recorded window's schedule at the last update
    recorded = learning_rates(config, metrics["steps"] + 1, metrics)[-1]
    np.testing.assert_allclose(metrics["final_learning_rate"], recorded, rtol=1e-5,
                               atol=1e-6 * max(np.loadtxt(run.history, delimiter=",",
                                                          skiprows=1, usecols=[2], ndmin=1)))
    header = open(run.history).readline().strip().split(",")
    assert "learning_rate" in header
    state = read_checkpoint_state(run.checkpoints)
    assert 0 < state.budget_seconds <= 4 + 5  # the last update may end past the budget
    model, _ = load_checkpoint(run.checkpoints)
    resumed = attach_cooldown(model.optimizer)
    assert resumed.window()["cooldown_end"] == window["cooldown_end"]
    again = train(config, tmp_path / "run", resume=True)  # its budget or its cooldown is spent
    assert again["steps"] == metrics["steps"]
    assert again["stopped_by"] in ("cooldown_end", "time_budget")
    assert again["cooldown_end"] == metrics["cooldown_end"]
    from transformerkit.cli import main

    rates = learning_rates(config, again["steps"], again)  # the window the run followed
    followed = keras.ops.convert_to_numpy(attach_cooldown(model.optimizer)(
        np.arange(again["steps"])))
    unit = 2.0 ** -24  # float32 evaluations of one formula, in two orders
    np.testing.assert_allclose(rates, followed, rtol=8 * unit, atol=8 * unit * followed.max())
    assert main(["plot", str(tmp_path / "run"), "--lr", "--out", str(tmp_path / "lr.png")]) == 0
