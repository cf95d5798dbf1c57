"""Adam with a fused update on the PyTorch backend."""

import keras


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
    by ``O(epsilon)``. On JAX and TensorFlow, under ``torch.compile`` and with ``amsgrad``
    this is plain Keras Adam.
    """

    def _fused(self):
        return keras.backend.backend() == "torch" and not self.amsgrad and not _compiling()

    def _clip_gradients(self, grads):
        if not (self._fused() and self.global_clipnorm and not self.clipnorm
                and not self.clipvalue) or any(g is None for g in grads):
            return super()._clip_gradients(grads)
        import torch

        with torch.no_grad():
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            clip = float(self.global_clipnorm)
            scale = clip * torch.minimum(1.0 / norm, norm.new_tensor(1.0 / clip))
            torch._foreach_mul_(grads, scale + (norm - norm))  # NaN for a non-finite norm
        return grads

    def _apply_weight_decay(self, variables):
        if not self._fused():
            super()._apply_weight_decay(variables)
        # fused: applied inside _backend_update_step

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self._fused():
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import torch

        decays = self.weight_decay is not None and float(self.weight_decay) > 0
        groups = {True: ([], []), False: ([], [])}
        for grad, variable in zip(grads, trainable_variables, strict=True):
            group = groups[decays and self._use_weight_decay(variable)]
            group[0].append(variable)
            group[1].append(grad)
        learning_rate = float(learning_rate)
        step = torch.as_tensor(float(self.iterations.value) + 1.0, dtype=torch.float32)
        with torch.no_grad():
            for decayed, (variables, group_grads) in groups.items():
                if not variables:
                    continue
                params = [v.value for v in variables]
                index = [self._get_variable_index(v) for v in variables]
                fused = torch._fused_adamw_ if decayed else torch._fused_adam_
                fused(params, [g.to(p.dtype) for g, p in zip(group_grads, params, strict=True)],
                      [self._momentums[i].value for i in index],
                      [self._velocities[i].value for i in index], [], [step] * len(params),
                      lr=learning_rate, beta1=float(self.beta_1), beta2=float(self.beta_2),
                      weight_decay=float(self.weight_decay) if decayed else 0.0,
                      eps=float(self.epsilon), amsgrad=False, maximize=False)


def _compiling():
    """Inside ``torch.compile`` (``jit_compile=True`` on PyTorch), where the fused kernel
    cannot be traced: Keras' own update is used there."""
    import torch

    return torch.compiler.is_compiling()
