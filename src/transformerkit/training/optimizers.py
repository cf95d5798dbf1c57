"""Adam with a fused update on the PyTorch backend (a :mod:`transformerkit.fastpath` shortcut)."""

import keras

from transformerkit import fastpath, internals

# The private torch kernels and Keras optimizer hooks of the fused update
# (listed in transformerkit.internals): all present, or Keras' own update everywhere.
_FUSED_NEEDS = ("optimizer_hooks", "in_stateless_scope", "foreach_norm", "foreach_mul_",
                "fused_adam_", "fused_adamw_")


@keras.saving.register_keras_serializable(package="transformerkit")
class Adam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose update is one fused kernel on the PyTorch backend.

    Keras' PyTorch Adam updates the variables with about ten ``torch._foreach_*`` passes,
    clips a global norm with three operations per variable and applies decoupled weight
    decay with three more (evaluating the learning-rate schedule once per variable). Here,
    on PyTorch, the global norm is one ``torch._foreach_norm`` and one in-place
    ``torch._foreach_mul_``, and ``torch._fused_adam_``/``torch._fused_adamw_`` read and
    write each parameter, gradient and moment once, the weight decay included. The
    results are Keras' formulas: clipping scales by ``min(1, clipnorm / norm)`` (NaN when
    the norm is not finite), weight decay is ``theta -= lr * weight_decay * theta`` before
    the step, for the variables ``_use_weight_decay`` selects. The step is Kingma & Ba's
    algorithm 1 as in ``torch.optim.Adam``:
    ``theta -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + epsilon)``; Keras'
    formula places ``epsilon`` outside the bias correction ("epsilon hat"), which differs
    by ``O(epsilon)``. On JAX and TensorFlow, under ``torch.compile``, with ``amsgrad`` and
    with the shortcuts off this is plain Keras Adam.
    """

    def _fused(self):
        return (fastpath.applies() and not self.amsgrad and not _compiling()
                and all(internals.available(name) for name in _FUSED_NEEDS)
                and None not in (internals.attribute(self, "adam_momentums"),
                                 internals.attribute(self, "adam_velocities")))

    def _clip_gradients(self, grads):
        if not (self._fused() and self.global_clipnorm and not self.clipnorm
                and not self.clipvalue) or any(g is None for g in grads):
            return super()._clip_gradients(grads)
        import torch

        with torch.no_grad():
            norm = torch.linalg.vector_norm(torch.stack(internals.get("foreach_norm")(grads)))
            clip = float(self.global_clipnorm)
            scale = clip * torch.minimum(1.0 / norm, norm.new_tensor(1.0 / clip))
            internals.get("foreach_mul_")(grads, scale + (norm - norm))  # NaN if not finite
        return grads

    def _apply_weight_decay(self, variables):
        if not self._fused():
            super()._apply_weight_decay(variables)
        # fused: applied inside _backend_update_step

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self._fused() or internals.get("in_stateless_scope")():
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import torch

        learning_rate = float(learning_rate)
        steps = optimizer_steps(self) + 1.0
        with torch.no_grad():
            for decayed, positions, params, momentums, velocities in \
                    self._fused_groups(trainable_variables):
                fused = internals.get("fused_adamw_" if decayed else "fused_adam_")
                # the kernel wants its step counts on the parameters' device (CPU or GPU)
                step = torch.tensor(steps, dtype=torch.float32, device=params[0].device)
                group_grads = [_as_dtype(grads[i], p)
                               for i, p in zip(positions, params, strict=True)]
                fused(params, group_grads, momentums, velocities, [], [step] * len(params),
                      lr=learning_rate, beta1=float(self.beta_1), beta2=float(self.beta_2),
                      weight_decay=float(self.weight_decay) if decayed else 0.0,
                      eps=float(self.epsilon), amsgrad=False, maximize=False)
                # the fused kernel writes the weights without bumping their version counters:
                # bump them, so autograd and the packed inference weights (kernels/products.py)
                # see the update
                torch.autograd.graph.increment_version(params)

    def _fused_groups(self, variables):
        """The fused kernels' arguments for ``variables``: one ``(decayed, positions, params,
        momentums, velocities)`` group per weight-decay choice, with the variables' torch
        tensors. Built once per list of variables and reused, since reading every
        ``Variable.value`` (a property with scope checks) and grouping the variables each
        step costs Python time. The tensors stay valid: a Keras variable on PyTorch
        keeps its tensor for life (``assign`` copies into it); a new list of variables
        (a layer frozen or unfrozen) or a rebuilt optimizer makes a new plan."""
        decays = self.weight_decay is not None and float(self.weight_decay) > 0
        cached = self.__dict__.get("_fused_plan")
        momentums = internals.attribute(self, "adam_momentums")
        velocities = internals.attribute(self, "adam_velocities")
        if cached is not None and cached[1] is momentums and cached[2] == decays \
                and len(cached[0]) == len(variables) \
                and all(a is b for a, b in zip(cached[0], variables, strict=True)):
            return cached[3]
        groups = []
        for decayed in (True, False):
            positions = [i for i, v in enumerate(variables)
                         if (decays and self._use_weight_decay(v)) == decayed]
            if positions:
                index = [self._get_variable_index(variables[i]) for i in positions]
                groups.append((decayed, positions, [variables[i].value for i in positions],
                               [momentums[j].value for j in index],
                               [velocities[j].value for j in index]))
        # a plain attribute, which Keras' attribute tracking does not see
        self.__dict__["_fused_plan"] = (tuple(variables), momentums, decays, groups)
        return groups


def optimizer_steps(optimizer):
    """The updates ``optimizer`` has applied, an int: ``iterations``, which with
    ``gradient_accumulation_steps = k`` Keras counts as micro-batches // k."""
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


@keras.saving.register_keras_serializable(package="transformerkit")
class UpdateCountSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``schedule`` evaluated at the update count when an optimizer accumulates gradients
    over ``steps`` micro-batches.

    Keras' optimizer evaluates a learning-rate schedule at its micro-batch counter
    (``_iterations``) while its ``iterations`` (Adam's bias correction, ``max_steps``) count
    updates; this makes the schedule count updates too: ``schedule(micro_batches // steps)``,
    so a warmup of 4000 steps is 4000 updates whatever the accumulation.
    """

    def __init__(self, schedule, steps):
        self.schedule = schedule
        self.steps = int(steps)

    def __call__(self, step):
        return self.schedule(keras.ops.floor_divide(step, self.steps))

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "steps": self.steps}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["steps"])


def with_accumulation(optimizer, steps):
    """A copy of the (unbuilt) ``optimizer`` that applies one update every ``steps`` calls of
    ``apply`` (Keras' ``gradient_accumulation_steps``: the update uses the mean of the
    ``steps`` gradients; ``TrainStep.compute_loss`` (``training/step.py``) weights each
    micro-batch's loss by its share of the update's real tokens so that this mean is the
    token-weighted one), with its learning-rate schedule counting updates
    (:class:`UpdateCountSchedule`).
    ``steps`` 1 returns ``optimizer`` itself."""
    steps = int(steps)
    if steps == 1:
        return optimizer
    if steps < 1:
        raise ValueError(f"accumulation steps must be positive, got {steps}")
    config = optimizer.get_config()
    rate = config["learning_rate"]
    if isinstance(rate, dict):
        config["learning_rate"] = UpdateCountSchedule(
            keras.saving.deserialize_keras_object(rate), steps)
    config["gradient_accumulation_steps"] = steps
    return type(optimizer).from_config(config)


def _as_dtype(grad, param):
    return grad if grad.dtype == param.dtype else grad.to(param.dtype)


def _compiling():
    """Inside ``torch.compile`` (``jit_compile=True`` on PyTorch), where the fused kernel
    cannot be traced: Keras' own update is used there."""
    import torch

    return torch.compiler.is_compiling()
