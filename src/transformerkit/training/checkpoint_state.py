"""Where a run stands at a checkpoint: the typed contents of ``checkpoints/latest.json``.

:class:`CheckpointState` is written by ``RunCheckpoint`` (``training/callbacks.py``) next to
every checkpoint it saves, read back by ``load_checkpoint`` and used by the trainer to
resume exactly: the position in the epoch, the early-stopping record and the global RNG
state of every process. The JSON file is the dataclass' fields, so a reader of the file
and a reader of the code see the same names.
"""

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointState:
    """The state of a run at its checkpoint ``checkpoint``.

    Attributes:
        checkpoint: the file name in the checkpoint folder (``epoch-0003.keras``,
            ``epoch-0003-batch-0000150.keras``).
        epoch: epochs completed before the checkpoint's position.
        step: optimizer updates done.
        batch: batches of epoch ``epoch + 1`` done (0 at an epoch's end).
        sha256: the checkpoint file's digest (None where it was not recorded: a state
            rebuilt from a file name).
        best, monitor, wait: the early-stopping record: the best value of the log key
            ``monitor`` so far and the evaluations since it improved.
        global_rng: the backend's global RNG state of rank 0 (base64 text), or None.
        world_size: the processes of the run that wrote it.
        rank_rng: every rank's global RNG state, for a run of several processes.
        budget_seconds: seconds of ``train.time_budget`` used so far (None: no budget), so
            that a resumed run has the rest of it and continues its cooldown's schedule.
    """

    checkpoint: str
    epoch: int
    step: int
    batch: int = 0
    sha256: str | None = None
    best: float | None = None
    monitor: str | None = None
    wait: int = 0
    global_rng: str | None = None
    world_size: int = 1
    rank_rng: list | None = None
    budget_seconds: float | None = None

    @classmethod
    def from_json(cls, raw):
        """The state of a ``latest.json`` dict; ``ValueError`` for one that is not a
        checkpoint state (no checkpoint name or digest, an unknown key, a wrong type)."""
        if not isinstance(raw, dict):
            raise ValueError("not a checkpoint state: not a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ValueError(f"not a checkpoint state: unknown key(s) {', '.join(unknown)}")
        if not all(isinstance(raw.get(key), str) for key in ("checkpoint", "sha256")):
            raise ValueError("not a checkpoint state: no checkpoint name and sha256")
        for key in ("epoch", "step", "batch", "wait", "world_size"):
            value = raw.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ValueError(f"not a checkpoint state: {key} is {value!r}")
        seconds = raw.get("budget_seconds")
        if seconds is not None and (isinstance(seconds, bool)
                                    or not isinstance(seconds, (int, float)) or not seconds >= 0):
            raise ValueError(f"not a checkpoint state: budget_seconds is {seconds!r}")
        if "epoch" not in raw or "step" not in raw:
            raise ValueError("not a checkpoint state: no epoch or step")
        values = {key: value for key, value in raw.items() if value is not None}
        return cls(**values)

    def to_json(self):
        """The dict written as ``latest.json`` (fields of a one-process run that are not
        set are left out)."""
        out = dataclasses.asdict(self)
        if self.rank_rng is None:
            del out["rank_rng"], out["world_size"]
        if self.budget_seconds is None:
            del out["budget_seconds"]
        return out

    def rng_of(self, rank):
        """The global RNG state to restore in process ``rank`` (rank 0's in a one-process
        checkpoint), or None."""
        return self.rank_rng[rank] if self.rank_rng else self.global_rng

    def replace(self, **changes):
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)
