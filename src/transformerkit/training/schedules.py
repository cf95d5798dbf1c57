"""The paper's learning-rate schedule and optimizer (section 5.3)."""

import keras
from keras import ops


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
