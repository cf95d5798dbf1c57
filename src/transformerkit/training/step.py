"""The training step: what ``model.fit`` runs for every batch, and the update it makes.

For a batch ``(x, y)`` (and, with gradient accumulation, a ``sample_weight``):

1. forward pass: ``model(x, training=True)`` (``models/transformer.py``, ``gpt.py`` or
   ``encoder.py``: ``call``), on PyTorch with the logits of the real label positions only
   (:meth:`TrainStep.real_label_positions`);
2. loss: the compiled loss (``training/losses.py: MaskedCrossEntropy``, plus any loss a
   layer adds), weighted for gradient accumulation (:meth:`TrainStep.compute_loss`);
3. backward pass, then the gradient exchange between processes
   (:class:`GradientAllReduce`, several PyTorch processes only);
4. update: ``optimizer.apply`` (``training/optimizers.py: Adam``, or ``gpt_recipe.py``);
5. logs: the loss tracker and the compiled metrics (:meth:`TrainStep.compute_metrics`).

Keras' ``fit`` calls ``model.train_step``; the models (``models/base.py``) hand that call,
and Keras' calls of ``model.compute_loss`` and ``model.compute_metrics``, to the
:class:`TrainStep` attached to them by :func:`attach_train_step` (``transformerkit train``
attaches one; a model without one trains with Keras' own step, as any Keras model). The
step is a plain object on the model, neither a layer nor part of its config: ``.keras``
files are the same with or without it, and runs saved before it existed load unchanged.

Two ways to run the same step, behind the one switch (:mod:`transformerkit.fastpath`):
Keras' own ``train_step`` (JAX, TensorFlow, ``jit_compile``, shortcuts off) and, on eager
PyTorch, :meth:`TrainStep._torch_step`: the same loss, loss scaling, optimizer, tracker and
metrics objects with less Python around them (``tests/layers/test_fast_paths.py``: the same
numbers). The private Keras pieces both use are looked up in :mod:`transformerkit.internals`.
"""

import contextlib
import warnings

import keras

from transformerkit import fastpath, internals
from transformerkit.kernels.cast_once import cast_once
from transformerkit.layers.calls import call_sublayer
from transformerkit.special_tokens import PAD_ID

BUCKET_BYTES = 25 << 20  # DDP's default bucket size


def attach_train_step(model, gradient_sync=None):
    """Attach a new :class:`TrainStep` to ``model`` (a ``TransformerBase``) and return it:
    from now on ``model.fit`` / ``train_on_batch`` train with it. Call it after (or before)
    ``model.compile``; ``gradient_sync`` as for :class:`TrainStep`."""
    step = TrainStep(gradient_sync)
    model.training_step = step
    return step


class TrainStep:
    """The training step of a ``TransformerBase`` model (see the module docstring).

    ``gradient_sync``: None (one process) or a callable ``(grads, variables, optimizer) ->
    grads`` averaging the gradients over the processes, with a ``replicas`` count
    (:class:`GradientAllReduce`; the trainer sets it for a ``torchrun`` launch). It is
    called between the backward pass and ``optimizer.apply``.
    """

    def __init__(self, gradient_sync=None):
        self.gradient_sync = gradient_sync

    def train_step(self, model, *args):
        """One optimisation step of ``model`` on a batch (``args``: Keras' ``(data,)``, or
        JAX's ``(state, data)``); returns the logs."""
        if fastpath.applies() and not model.jit_compile and model.optimizer is not None:
            weights = model.trainable_weights
            parts = [internals.attribute(model, name) for name in internals.TRAIN_STEP_PARTS]
            if weights and None not in parts:
                return self._torch_step(model, weights, *parts, *args)
        if self.gradient_sync is None:
            return keras.Model.train_step(model, *args)
        return self._keras_torch_step(model, *args)

    def _torch_step(self, model, weights, clear_losses, compute_loss, loss_tracker, data):
        """The PyTorch shortcut of Keras' ``train_step`` (eager, shortcuts on): the trainable
        weights listed once, their gradients reset to None before the backward pass (what
        ``zero_grad`` does), the model called through
        :func:`~transformerkit.layers.calls.call_sublayer` after clearing the previous
        call's losses (what the outermost ``__call__`` does)."""
        import torch

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        clear_losses()
        for variable in weights:
            variable.value.grad = None
        positions = self.real_label_positions(model, y, sample_weight)
        with self._casts(model):
            if positions is None:
                y_pred = call_sublayer(model, x, training=True)
            else:  # logits, loss and metrics of the real tokens only: (1, n, vocab), (1, n)
                y_pred = call_sublayer(model, x, training=True, logit_positions=positions)[None]
                y = keras.ops.convert_to_tensor(y).reshape(1, -1)[:, positions]
            loss = compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                training=True)
        batch_size = next(t for t in keras.tree.flatten(x) if t is not None).shape[0]
        loss_tracker.update_state(loss, sample_weight=batch_size)
        model.optimizer.scale_loss(loss).backward()
        with torch.no_grad():
            self._apply(model.optimizer, [v.value.grad for v in weights], weights)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    @staticmethod
    def _casts(model):
        """The scope of the forward pass: for a mixed-precision model (float32 weights,
        bfloat16 or float16 compute dtype) one that casts each weight once in the step
        (:func:`~transformerkit.kernels.cast_once.cast_once`: float32 master weights, their
        low-precision copies made at their first use and dropped with the scope, after the
        step); for others nothing (Keras' own call casts under its per-use scope where
        the scope class is missing)."""
        compute, variables = model.compute_dtype, model.variable_dtype
        scope = None
        if compute != variables and compute in ("bfloat16", "float16"):
            scope = cast_once(compute)
        return contextlib.nullcontext() if scope is None else scope

    def _keras_torch_step(self, model, data):
        """Keras' own PyTorch ``train_step`` (Keras 3.15, line for line) with the gradient
        exchange before ``optimizer.apply``: the step of several PyTorch processes when the
        shortcuts are off."""
        import torch

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = model(x, training=True)
        model.zero_grad()
        loss = internals.attribute(model, "compute_loss")(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        internals.attribute(model, "loss_tracker").update_state(
            loss, sample_weight=next(t for t in keras.tree.flatten(x) if t is not None).shape[0])
        if model.optimizer is not None:
            loss = model.optimizer.scale_loss(loss)
        if model.trainable_weights:
            loss.backward()
            weights = model.trainable_weights[:]
            with torch.no_grad():
                self._apply(model.optimizer, [v.value.grad for v in weights], weights)
        else:
            warnings.warn("The model does not have any trainable weights.", stacklevel=2)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _apply(self, optimizer, grads, weights):
        """The update: the gradients averaged over the processes, if several, then applied."""
        sync = self.gradient_sync
        optimizer.apply(grads if sync is None else sync(grads, weights, optimizer), weights)

    def real_label_positions(self, model, y, sample_weight):
        """For the step on PyTorch: the flat positions ``(n,)`` of the real (non-padding)
        labels of a ``(batch, len)`` batch that has padding, when the model's ``call`` takes
        ``logit_positions`` and the loss and every metric ignore padding positions; then the
        output projection, the loss and the metrics need those positions only (the output
        projection is a large share of a small Transformer's products, and length-bucketed
        batches still hold some padding). None where that does not hold, or the batch has no
        padding.

        A loss or metric says it ignores padding with a true ``ignores_padding`` class
        attribute: its value is the same when the padding positions are left out of
        ``y_true`` and ``y_pred`` (``MaskedCrossEntropy``, ``MaskedAccuracy``)."""
        if not model.takes_logit_positions or sample_weight is not None \
                or not getattr(model.loss, "ignores_padding", False):
            return None
        tracker = internals.attribute(model, "loss_tracker")
        for metric in model.metrics:
            if metric is tracker:
                continue
            inner = getattr(metric, "metrics", None)  # Keras' container of compiled metrics
            if inner is not None and not metric.built:
                return None  # not built yet: which metrics it holds is not known
            if not all(getattr(m, "ignores_padding", False)
                       for m in (inner if inner is not None else [metric])):
                return None
        labels = keras.ops.convert_to_tensor(y)  # on the model's device (NumPy labels too)
        if labels.dim() != 2 or labels.is_floating_point():
            return None
        real = labels.reshape(-1) != PAD_ID
        return None if bool(real.all()) else real.nonzero().squeeze(1)

    def accumulation_steps(self, model):
        """How many micro-batch gradients are averaged into one update, when more than one:
        ``k`` when the optimizer accumulates gradients over k micro-batches, times the
        number of processes whose gradients :attr:`gradient_sync` averages; else None."""
        optimizer = getattr(model, "optimizer", None)
        steps = getattr(optimizer, "gradient_accumulation_steps", None) or 1
        steps *= getattr(self.gradient_sync, "replicas", 1)
        return steps if steps > 1 else None

    def compute_loss(self, model, x=None, y=None, y_pred=None, sample_weight=None,
                     training=True):
        """Keras' ``compute_loss``; with gradient accumulation, one micro-batch's share of
        its update's loss.

        With ``gradient_accumulation_steps = k`` Keras' optimizer updates with the plain mean
        of k micro-batch gradients (and with P processes, :attr:`gradient_sync` averages
        over the P ranks too: k is then k * P, ``N`` counts all ranks' tokens). The
        token-normalized loss of one large batch made of those micro-batches has the
        gradient ``sum_i n_i g_i / N`` (``n_i`` real target tokens of micro-batch i,
        ``N = sum_i n_i``; for a classifier, whose labels are ``(rows,)``, ``n_i`` counts
        rows), so each micro-batch's loss ``L_i`` is scaled to ``k * n_i / N * L_i``, whose
        mean over the k micro-batches is the large batch's loss. ``N`` travels with every
        micro-batch as its ``sample_weight``, a ``(rows,)`` array all equal to ``N``
        (:class:`transformerkit.training.accumulation.UpdateBatches` adds it); a batch
        without one (validation) gets the plain loss.
        """
        steps = self.accumulation_steps(model)
        if not steps or sample_weight is None:
            return keras.Model.compute_loss(model, x, y, y_pred, sample_weight,
                                            training=training)
        loss = keras.Model.compute_loss(model, x, y, y_pred, None, training=training)
        if len(y.shape) == 1:  # one class label per row (sequence classification): n_i rows
            tokens = keras.ops.cast(keras.ops.shape(y)[0], "float32")
        else:
            tokens = keras.ops.sum(keras.ops.cast(keras.ops.not_equal(y, PAD_ID), "float32"))
        update_tokens = keras.ops.max(keras.ops.cast(sample_weight, "float32"))
        return loss * (tokens * float(steps) / keras.ops.maximum(update_tokens, 1.0))

    def compute_metrics(self, model, x, y, y_pred, sample_weight=None):
        """Keras' ``compute_metrics``; with gradient accumulation the ``sample_weight`` is the
        update's token count (see :meth:`compute_loss`), not a weight: metrics get none."""
        if self.accumulation_steps(model):
            sample_weight = None
        return keras.Model.compute_metrics(model, x, y, y_pred, sample_weight=sample_weight)


class GradientAllReduce:
    """Averages gradients over the ranks of ``group`` (a
    :class:`~transformerkit.training.processes.ProcessGroup` of PyTorch processes):
    ``__call__(grads, variables, optimizer) -> grads``, lists of torch tensors (None kept
    as None: every rank has the same unused weights). What ``DistributedDataParallel`` does,
    here called by :class:`TrainStep` because a Keras model is not driven through a DDP
    wrapper.

    The gradients are concatenated into flat buckets of at most ``bucket_bytes`` (one
    tensor larger than that is a bucket of its own), each summed with one ``all_reduce``
    and divided by the number of ranks. ``replicas`` is that number (the token weighting of
    :meth:`TrainStep.compute_loss` reads it); ``bytes_per_call`` the bytes of the last
    exchange's buckets, ``calls`` the number of exchanges.

    With gradient accumulation (``optimizer.gradient_accumulation_steps = k``) the ranks
    exchange once per update, as DDP's ``no_sync`` does, not once per micro-batch: the
    first k - 1 micro-batches accumulate locally, and on the k-th the sum of the local
    accumulator and the gradient is averaged over the ranks and handed to the optimizer
    minus the local accumulator, so that the optimizer's ``(accumulator + g) / k`` is the
    average over ranks of each rank's sum. That reads the optimizer's accumulators
    (through :mod:`transformerkit.internals`); without them every micro-batch is exchanged,
    with the same result.
    """

    def __init__(self, group, bucket_bytes=BUCKET_BYTES):
        self.group = group
        self.replicas = group.size
        self.bucket_bytes = int(bucket_bytes)
        self.bytes_per_call = 0
        self.calls = 0

    def __call__(self, grads, variables=None, optimizer=None):
        accumulated = _local_accumulators(optimizer, variables)
        if accumulated is False:  # a micro-batch before the update: accumulate locally
            return list(grads)
        if accumulated is None:
            return self._all_reduce(grads)
        totals = self._all_reduce([None if g is None else g + a
                                   for g, a in zip(grads, accumulated, strict=True)])
        return [None if t is None else t - a for t, a in zip(totals, accumulated, strict=True)]

    def _all_reduce(self, grads):
        import torch
        import torch.distributed as dist

        self.calls += 1

        present = [i for i, g in enumerate(grads) if g is not None]
        out = list(grads)
        buckets, current, size = [], [], 0
        for i in present:
            nbytes = grads[i].numel() * grads[i].element_size()
            if current and size + nbytes > self.bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        if current:
            buckets.append(current)
        self.bytes_per_call = 0
        try:
            for bucket in buckets:
                flat = torch.cat([grads[i].reshape(-1) for i in bucket])
                dist.all_reduce(flat)
                flat.div_(self.replicas)
                self.bytes_per_call += flat.numel() * flat.element_size()
                offset = 0
                for i in bucket:
                    count = grads[i].numel()
                    out[i] = flat[offset:offset + count].view_as(grads[i])
                    offset += count
        except Exception as err:  # noqa: BLE001
            raise self.group.lost("the gradient all-reduce", err) from err
        return out


def _local_accumulators(optimizer, variables):
    """This rank's gradient accumulators of ``variables`` (torch tensors) when ``optimizer``
    accumulates and its next ``apply`` is an update, False when it is a micro-batch before
    one, None without accumulation (or without the private accumulators: then every
    micro-batch is exchanged)."""
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if not steps or steps < 2 or variables is None or not optimizer.built:
        return None
    accumulators = internals.attribute(optimizer, "accumulated_gradients")
    calls = internals.attribute(optimizer, "micro_batches")  # (iterations counts updates)
    index = internals.attribute(optimizer, "variable_index")
    if not accumulators or calls is None or index is None:
        return None
    if (int(calls.value) + 1) % steps:
        return False
    return [accumulators[index(v)].value for v in variables]
