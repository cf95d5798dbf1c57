"""Adam with a fused update on the PyTorch backend."""

import keras


@keras.saving.register_keras_serializable(package="transformerkit")
class Adam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose update is one fused kernel on the PyTorch backend.

    Keras' PyTorch Adam updates the variables with about ten ``torch._foreach_*`` passes;
    ``torch._fused_adam_`` reads and writes each parameter, gradient and moment once. The
    update is Kingma & Ba's algorithm 1 as in ``torch.optim.Adam``:
    ``theta -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + epsilon)``; Keras'
    formula places ``epsilon`` outside the bias correction ("epsilon hat"), which differs
    by ``O(epsilon)`` (1e-9 here). On JAX and TensorFlow this is plain Keras Adam.
    """

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if keras.backend.backend() != "torch" or self.amsgrad or _compiling():
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import torch

        with torch.no_grad():
            params = [v.value for v in trainable_variables]
            index = [self._get_variable_index(v) for v in trainable_variables]
            momentums = [self._momentums[i].value for i in index]
            velocities = [self._velocities[i].value for i in index]
            step = torch.as_tensor(float(self.iterations.value) + 1.0, dtype=torch.float32)
            grads = [g.to(p.dtype) for g, p in zip(grads, params, strict=True)]
            torch._fused_adam_(params, grads, momentums, velocities, [], [step] * len(params),
                               lr=float(learning_rate), beta1=float(self.beta_1),
                               beta2=float(self.beta_2), weight_decay=0.0,
                               eps=float(self.epsilon), amsgrad=False, maximize=False)


def _compiling():
    """Inside ``torch.compile`` (``jit_compile=True`` on PyTorch), where the fused kernel
    cannot be traced: Keras' own update is used there."""
    import torch

    return torch.compiler.is_compiling()
