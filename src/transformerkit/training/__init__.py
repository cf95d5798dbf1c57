"""Training math: masked loss and accuracy, the paper's schedule and optimizer, the step."""

from transformerkit.training.losses import MaskedAccuracy, MaskedCrossEntropy, masked_cross_entropy
from transformerkit.training.optimizers import Adam
from transformerkit.training.schedules import TransformerSchedule, paper_optimizer
from transformerkit.training.step import TrainStep, attach_train_step
from transformerkit.training.summary import format_summary, parameter_summary

__all__ = ["Adam", "MaskedAccuracy", "MaskedCrossEntropy", "TrainStep", "TransformerSchedule",
           "attach_train_step", "format_summary", "masked_cross_entropy", "paper_optimizer",
           "parameter_summary"]
