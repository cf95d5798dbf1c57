"""The paper's learning-rate schedule and optimizer (section 5.3), and the cooldown that
ends a budgeted run's schedule at zero."""

import keras
from keras import ops

from transformerkit.config.sections import COOLDOWN_SHAPES


@keras.saving.register_keras_serializable(package="transformerkit")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)  (paper eq. 3).

    ``step`` counts from 1 (Keras' optimizer ``iterations`` + 1), so the first update uses a
    small positive rate. The peak, at ``step == warmup_steps``, is
    ``scale * (d_model * warmup_steps)^-0.5``.

    Args:
        d_model: int. warmup_steps: int (4000 in the paper). scale: float multiplier (1.0).
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        return (self.scale * self.d_model ** -0.5
                * ops.minimum(ops.rsqrt(step), step * self.warmup_steps ** -1.5))

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


def paper_optimizer(d_model, warmup_steps=4000, scale=1.0, **kwargs):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on :class:`TransformerSchedule`
    (:class:`transformerkit.training.optimizers.Adam`: fused update on PyTorch)."""
    from transformerkit.training.optimizers import Adam

    schedule = TransformerSchedule(d_model, warmup_steps, scale)
    kwargs = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9, **kwargs}
    return Adam(learning_rate=schedule, **kwargs)


# train.cooldown when the config leaves it null, for the paper optimizer in a run that a
# time budget or max_steps ends (docs/training.md, "Time-budgeted runs")
DEFAULT_COOLDOWN = 0.2


def cooldown_fraction(train_cfg):
    """The cooldown share a run of the ``train:`` section ``train_cfg`` uses: its
    ``cooldown``, or where that is null :data:`DEFAULT_COOLDOWN` for the paper optimizer
    when a time budget or ``max_steps`` ends the run, else 0 (off)."""
    if train_cfg.cooldown is not None:
        return float(train_cfg.cooldown)
    limited = train_cfg.time_budget is not None or train_cfg.max_steps is not None
    return DEFAULT_COOLDOWN if limited and train_cfg.optimizer == "paper" else 0.0


def with_cooldown(rate, train_cfg, total_steps):
    """``rate`` (a schedule or a constant) wrapped in a :class:`Cooldown` ending at
    ``total_steps`` updates where the run cools down (:func:`cooldown_fraction`), else
    ``rate`` itself."""
    fraction = cooldown_fraction(train_cfg)
    if not fraction or not total_steps:
        return rate
    return Cooldown(rate, total_steps, fraction, train_cfg.cooldown_shape)


@keras.saving.register_keras_serializable(package="transformerkit")
class Cooldown(keras.optimizers.schedules.LearningRateSchedule):
    """``schedule`` cooled down to zero over the last ``fraction`` of a run's updates: the
    rate a budget-limited run ends on (Li et al., ICLR 2020, "Budgeted Training"; the
    warmup-stable-decay schedules of Hägele et al., 2024).

    ``lr(step) = schedule(step) * (1 - p)`` (``shape="linear"``) or ``* (1 - sqrt(p))``
    (``"1-sqrt"``), where the cooldown's progress ``p`` is 0 before update ``start``, rises
    linearly from ``start_progress`` at ``start`` to 1 at ``end`` (the update count at which
    the rate reaches zero: the run's length), and stays 1 after it. A new run starts with
    ``start = round((1 - fraction) * end)`` and ``start_progress = 0``.

    A time-budgeted run does not know its length in advance: :meth:`retarget` moves
    ``end`` to a new estimate (``training/callbacks.py: StopConditions``, from the
    measured update rate) without a jump in the rate: before the cooldown has begun it
    moves the whole window, inside it the rest of the window is stretched or shrunk from
    the current update and progress. The window is part of :meth:`get_config`, so a
    checkpoint holds it and a resumed run continues the same schedule.

    Args:
        schedule: the schedule (or a constant float rate) being cooled down.
        end: int, the run's length in updates (the rate is zero from there on).
        fraction: the share of the run spent cooling down, in ``(0, 1]``.
        shape: ``linear`` or ``1-sqrt``.
        start, start_progress: the window as retargeted (None, 0: a new run's).
    """

    def __init__(self, schedule, end, fraction=0.2, shape="linear", start=None,
                 start_progress=0.0):
        if shape not in COOLDOWN_SHAPES:
            raise ValueError(f"cooldown shape must be one of {', '.join(COOLDOWN_SHAPES)}; "
                             f"got {shape!r}")
        if not 0.0 < float(fraction) <= 1.0:
            raise ValueError(f"cooldown fraction must be in (0, 1], got {fraction}")
        if int(end) < 1:
            raise ValueError(f"cooldown end must be at least 1 update, got {end}")
        self.schedule = schedule
        self.fraction, self.shape = float(fraction), shape
        self.end = int(end)
        self.start = int(round((1.0 - self.fraction) * self.end)) if start is None else int(start)
        self.start_progress = float(start_progress)

    def progress(self, step):
        """The cooldown's progress ``p`` at update ``step`` (0-based, as the optimizer's
        ``iterations``): a tensor, or a float for a Python number."""
        span = max(self.end - self.start, 1)
        if isinstance(step, (int, float)):
            if step < self.start:
                return 0.0
            x = min((step - self.start) / span, 1.0)
            return self.start_progress + (1.0 - self.start_progress) * x
        x = ops.clip((ops.cast(step, "float32") - self.start) / span, 0.0, 1.0)
        began = ops.cast(ops.greater_equal(ops.cast(step, "float32"), self.start), "float32")
        return began * (self.start_progress + (1.0 - self.start_progress) * x)

    def factor(self, step):
        """The multiplier ``1 - p`` or ``1 - sqrt(p)`` at update ``step``."""
        p = self.progress(step)
        if isinstance(p, float):
            return 1.0 - (p if self.shape == "linear" else p ** 0.5)
        return 1.0 - (p if self.shape == "linear" else ops.sqrt(p))

    def __call__(self, step):
        base = self.schedule(step) if callable(self.schedule) else self.schedule
        return base * self.factor(step)

    def retarget(self, step, end):
        """Make the rate reach zero at update ``end`` (at least ``step + 1``), continuing
        from update ``step``: the window moves while the cooldown has not begun at ``step``
        and the new start lies ahead, else the rest of the window runs from ``step`` at
        its current progress."""
        end = max(int(end), int(step) + 1)
        start = int(round((1.0 - self.fraction) * end))
        if step < self.start and step < start:
            self.start, self.end, self.start_progress = start, end, 0.0
        else:
            self.start_progress = self.progress(step)
            self.start, self.end = int(step), end

    def window(self):
        """The resolved parameters: ``{"cooldown_start", "cooldown_end", "cooldown_shape",
        "cooldown_fraction", "cooldown_start_progress"}`` (metrics.json)."""
        return {"cooldown_start": self.start, "cooldown_end": self.end,
                "cooldown_shape": self.shape, "cooldown_fraction": self.fraction,
                "cooldown_start_progress": round(self.start_progress, 6)}

    def get_config(self):
        schedule = (keras.saving.serialize_keras_object(self.schedule)
                    if callable(self.schedule) else self.schedule)
        return {"schedule": schedule, "end": self.end, "fraction": self.fraction,
                "shape": self.shape, "start": self.start,
                "start_progress": self.start_progress}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config["schedule"], dict):
            config["schedule"] = keras.saving.deserialize_keras_object(config["schedule"])
        return cls(**config)
