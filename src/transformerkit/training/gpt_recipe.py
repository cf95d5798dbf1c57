"""nanoGPT's optimizer recipe for small GPTs: AdamW on matrices only, warmup + cosine decay.

nanoGPT (``train.py`` with ``config/train_shakespeare_char.py``) trains with
``AdamW(lr, betas=(0.9, beta2), eps=1e-8, weight_decay=0.1)`` where only parameters with
two or more dimensions (embeddings and projection matrices) are decayed, clips the global
gradient norm at 1.0, and sets the learning rate of iteration ``it`` (counted from 0) to::

    it < warmup:        lr * (it + 1) / (warmup + 1)
    it > decay_steps:   min_lr
    otherwise:          min_lr + 0.5 * (1 + cos(pi * (it - warmup) / (decay_steps - warmup)))
                        * (lr - min_lr)

:func:`gpt_optimizer` builds exactly that from Keras parts, so a ``GPT`` compiled with it
follows nanoGPT's recipe step for step (``bench/gpt_vs_nanogpt.py``).
"""

import math

import keras
from keras import ops

from transformerkit.training.optimizers import Adam


@keras.saving.register_keras_serializable(package="transformerkit")
class WarmupCosineSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to ``peak`` over ``warmup_steps``, cosine decay to ``minimum`` at
    ``decay_steps``, then constant (nanoGPT's ``get_lr``; ``step`` counts from 0).

    Args:
        peak: float, the learning rate after warmup (nanoGPT shakespeare_char: 1e-3).
        warmup_steps: int >= 0 (100). decay_steps: int >= 1 (max_iters; a run shorter
            than its warmup, ``decay_steps <= warmup_steps``, never leaves the warmup).
        minimum: float, the final learning rate (peak / 10).
    """

    def __init__(self, peak, warmup_steps, decay_steps, minimum):
        if int(warmup_steps) < 0 or int(decay_steps) < 1:
            raise ValueError(f"need warmup_steps >= 0 and decay_steps >= 1, got {warmup_steps} "
                             f"and {decay_steps}")
        self.peak, self.minimum = float(peak), float(minimum)
        self.warmup_steps, self.decay_steps = int(warmup_steps), int(decay_steps)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = self.peak * (step + 1.0) / (self.warmup_steps + 1.0)
        span = max(self.decay_steps - self.warmup_steps, 1)  # a run shorter than warmup
        ratio = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        cosine = self.minimum + 0.5 * (1.0 + ops.cos(math.pi * ratio)) * \
            (self.peak - self.minimum)
        return ops.where(step < self.warmup_steps, warm, cosine)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "decay_steps": self.decay_steps, "minimum": self.minimum}


@keras.saving.register_keras_serializable(package="transformerkit")
class MatrixDecayAdam(Adam):
    """Adam with decoupled weight decay (AdamW) applied to matrices only: variables with
    two or more dimensions decay, biases and LayerNorm scales/offsets do not (GPT-2,
    nanoGPT's ``configure_optimizers``). Fused update on PyTorch, as :class:`Adam`."""

    def build(self, variables):
        # Keras' public exclusion list, set before the optimizer state is created
        if not self.built:
            self.exclude_from_weight_decay(var_list=[v for v in variables if len(v.shape) < 2])
        super().build(variables)


def gpt_optimizer(learning_rate=1e-3, warmup_steps=100, decay_steps=2000, min_lr=1e-4,
                  beta_1=0.9, beta_2=0.99, weight_decay=0.1, clip_norm=1.0, epsilon=1e-8):
    """nanoGPT's shakespeare_char optimizer: :class:`MatrixDecayAdam` on
    :class:`WarmupCosineSchedule` with global gradient-norm clipping (defaults = its config
    with ``max_iters = lr_decay_iters = 2000``)."""
    schedule = WarmupCosineSchedule(learning_rate, warmup_steps, decay_steps, min_lr)
    return MatrixDecayAdam(learning_rate=schedule, beta_1=beta_1, beta_2=beta_2,
                           epsilon=epsilon, weight_decay=weight_decay,
                           global_clipnorm=clip_norm or None)


__all__ = ["MatrixDecayAdam", "WarmupCosineSchedule", "gpt_optimizer"]
