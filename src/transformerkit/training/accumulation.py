"""The training batches as ``model.fit`` sees them: grouped into updates, resumable inside
an epoch.

:class:`UpdateBatches` wraps an epoch dataset of :mod:`transformerkit.data.pipeline`
(``TranslationBatches``, ``ClassificationBatches``, ``LanguageModelBatches``: anything
with ``len``, ``[i]`` and ``set_epoch``) and

- with ``accumulate_steps = k > 1`` serves the batches in groups of k consecutive batches,
  one optimizer update each (``train.accumulate_steps``), each batch with the number of
  real target tokens (a classifier's: rows) of its whole group as ``sample_weight``
  (``(rows,)`` float32, all equal), which ``TrainStep.compute_loss`` (``training/step.py``)
  needs to weight the batch's gradient by its tokens. An epoch serves ``len // k * k``
  batches: the last ``len % k`` batches of an epoch's order, which is reshuffled every
  epoch, are left out so that every update has exactly k batches;
- with ``start = s`` serves the epoch from its batch ``s`` on (``len - s`` batches): the rest
  of an epoch a mid-epoch checkpoint stopped in (``train.checkpoint_every``, ``--resume``);
- with ``replicas = P > 1`` (P processes training data-parallel, ``replica`` = this rank r)
  serves this rank's shard: the epoch's order is cut into updates of ``k * P`` batches, and
  rank r takes batches r, r + P, r + 2P, ... of it (``len // (k * P) * k`` batches per
  epoch), each with the real target tokens of its whole update over all ranks as its
  ``sample_weight`` (every rank reads the same epoch order, so it counts them without
  communicating). P processes thus see per update what one process sees with
  ``accumulate_steps = k * P``.
"""

import keras
import numpy as np

from transformerkit.special_tokens import PAD_ID


class UpdateBatches(keras.utils.PyDataset):
    """``dataset`` grouped into updates of ``accumulate_steps`` batches, from batch ``start``.

    Args:
        dataset: the epoch dataset (its ``set_epoch`` decides the epoch; pass it, not this
            wrapper, to ``EpochSync``).
        accumulate_steps: int >= 1, batches per update.
        start: int, the first batch of the epoch served (a multiple of
            ``accumulate_steps``: updates are never split), counted in this rank's batches.
        replicas, replica: processes training data-parallel and this one's rank.
    """

    def __init__(self, dataset, accumulate_steps=1, start=0, replicas=1, replica=0):
        super().__init__()
        self.dataset = dataset
        self.accumulate_steps = int(accumulate_steps)
        self.replicas, self.replica = int(replicas), int(replica)
        if self.accumulate_steps < 1:
            raise ValueError(f"accumulate_steps must be positive, got {accumulate_steps}")
        if not 0 <= self.replica < self.replicas:
            raise ValueError(f"replica {replica} is not in [0, {replicas})")
        group_size = self.accumulate_steps * self.replicas  # batches per update, all ranks
        if len(dataset) < group_size:
            raise ValueError(f"an epoch has {len(dataset)} batches, fewer than "
                             f"train.accumulate_steps={self.accumulate_steps} x "
                             f"{self.replicas} process(es); lower train.accumulate_steps or "
                             "data.tokens_per_batch")
        self.full_length = len(dataset) // group_size * self.accumulate_steps
        self.start = int(start)
        if not 0 <= self.start < self.full_length or self.start % self.accumulate_steps:
            raise ValueError(f"start batch {start} is not the beginning of an update of an "
                             f"epoch of {self.full_length} batches")
        self._group_key, self._group = None, None

    @property
    def updates_per_epoch(self):
        """Optimizer updates in a full epoch."""
        return self.full_length // self.accumulate_steps

    def __len__(self):
        return self.full_length - self.start

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} out of range for {len(self)} batches")
        index = i + self.start
        if self.accumulate_steps == 1 and self.replicas == 1:
            return self.dataset[index]
        group, offset = divmod(index, self.accumulate_steps)
        key = (getattr(self.dataset, "epoch", None), group)
        if self._group_key != key:  # build the group's batches once, count its tokens
            size = self.accumulate_steps * self.replicas
            batches = [self.dataset[j] for j in range(group * size, (group + 1) * size)]
            tokens = sum(loss_units(labels) for _, labels in batches)
            self._group_key, self._group = key, (batches[self.replica::self.replicas], tokens)
        batches, tokens = self._group
        x, labels = batches[offset]
        return x, labels, np.full((len(labels),), tokens, dtype="float32")

    def on_epoch_begin(self):
        self.dataset.on_epoch_begin()

    def on_epoch_end(self):
        self.dataset.on_epoch_end()


def loss_units(labels):
    """The terms a batch's loss averages over: its real (non-padding) target tokens, or its
    rows for ``(rows,)`` class labels (``TrainStep.compute_loss`` counts the same)."""
    labels = np.asarray(labels)
    return len(labels) if labels.ndim == 1 else int(np.count_nonzero(labels != PAD_ID))
