"""``latest.json`` as a typed state (``training/checkpoint_state.py``): what ``RunCheckpoint``
writes reads back as the same state, files written before the type existed still read,
and anything else is refused with the reason (``load_checkpoint`` then falls back to the
newest epoch file, tested in test_failure_recovery.py)."""

import json

import pytest

from transformerkit.training.checkpoint_state import CheckpointState

ONE_PROCESS = {"epoch": 3, "batch": 150, "step": 690,
               "checkpoint": "epoch-0003-batch-0000150.keras", "sha256": "ab" * 32,
               "best": 2.31, "monitor": "val_loss", "wait": 1, "global_rng": "cm5n"}


def test_a_written_state_reads_back_the_same():
    state = CheckpointState.from_json(json.loads(json.dumps(ONE_PROCESS)))
    assert (state.epoch, state.batch, state.step, state.wait) == (3, 150, 690, 1)
    assert state.to_json() == ONE_PROCESS  # a one-process file keeps its keys
    assert CheckpointState.from_json(state.to_json()) == state
    assert state.rng_of(0) == "cm5n"
    several = state.replace(world_size=2, rank_rng=["r0", "r1"])
    assert CheckpointState.from_json(several.to_json()) == several
    assert several.rng_of(1) == "r1"
    budgeted = state.replace(budget_seconds=61.5)  # a time-budgeted run's seconds so far
    assert budgeted.to_json() == {**ONE_PROCESS, "budget_seconds": 61.5}
    assert CheckpointState.from_json(budgeted.to_json()) == budgeted


def test_nulls_of_older_files_take_the_defaults():
    state = CheckpointState.from_json({**ONE_PROCESS, "batch": None, "wait": None,
                                       "best": None, "global_rng": None})
    assert (state.batch, state.wait, state.best, state.world_size) == (0, 0, None, 1)


@pytest.mark.parametrize("change, message", [
    ({"sha256": None}, "no checkpoint name and sha256"),
    ({"checkpoint": 3}, "no checkpoint name and sha256"),
    ({"epoch": -1}, "epoch is -1"),
    ({"step": "7"}, "step is '7'"),
    ({"wait": True}, "wait is True"),
    ({"surprise": 1}, "unknown key"),
    ({"budget_seconds": -1.0}, "budget_seconds is -1.0"),
    ({"budget_seconds": "60"}, "budget_seconds is '60'"),
    ({"budget_seconds": float("nan")}, "budget_seconds is nan"),
])
def test_what_is_not_a_state_is_refused_with_the_reason(change, message):
    with pytest.raises(ValueError, match=message):
        CheckpointState.from_json({**ONE_PROCESS, **change})
    with pytest.raises(ValueError, match="not a JSON object"):
        CheckpointState.from_json([1, 2])
