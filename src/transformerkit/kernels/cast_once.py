"""Mixed-precision training on PyTorch: each float32 weight cast once per step.

Keras' autocast scope casts a variable at every use; the training step's forward pass
(``training/step.py: TrainStep``) runs in :func:`cast_once`'s scope instead, where each
weight's bfloat16 (or float16) copy is made at its first use and reused until the weight
changes. The numbers are those of Keras' scope (the same casts, the same float32 gradient
sums); the private Keras class is looked up in :mod:`transformerkit.internals`.
"""

import keras

from transformerkit import internals

if keras.backend.backend() == "torch":
    import torch

    TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                    "float16": torch.float16, "float64": torch.float64}


def cast_once(dtype):
    """A Keras autocast scope (``keras.src.backend.AutocastScope``, through
    :mod:`transformerkit.internals`) to ``dtype`` that casts each float variable once while it
    is in force, not at every use: the mixed-precision training step
    (``training/step.py: TrainStep``) runs its forward pass in one, so that every weight's
    bfloat16 copy is made once per step. None where Keras lacks the scope class.

    A copy is keyed on the variable's tensor and its in-place version counter (an update
    writes a new version, which is cast anew). Where autograd records, each use is an
    autograd node of its own over the one copy (:class:`_CastOnceGrad`): its gradient
    reaches the float32 variable converted to float32 per use and summed there in float32,
    exactly as under Keras' scope, whose every use is a cast of its own. The copies live as
    long as the scope object: make one per step."""
    base = internals.get("autocast_scope")
    if base is None:
        return None
    if base not in _CAST_ONCE_CLASSES:
        _CAST_ONCE_CLASSES[base] = type("CastOnceScope", (base,), {
            "__doc__": cast_once.__doc__, "maybe_cast": _cast_once_maybe_cast})
    scope = _CAST_ONCE_CLASSES[base](dtype)
    scope.copies = {}
    return scope


_CAST_ONCE_CLASSES = {}


def _cast_once_maybe_cast(self, value):
    """``AutocastScope.maybe_cast`` with the copies of :func:`cast_once`."""
    if self.dtype is None or not isinstance(value, torch.Tensor) \
            or not value.is_floating_point():
        return super(type(self), self).maybe_cast(value)
    target = TORCH_DTYPES[self.dtype]
    if value.dtype == target:
        return value
    entry = self.copies.get(id(value))
    version = internals.tensor_version(value)  # None: no counter, so cast at every use
    if entry is None or entry[0] is not value or version is None or entry[1] != version:
        with torch.no_grad():
            entry = (value, version, value.to(target))
        self.copies[id(value)] = entry
    if torch.is_grad_enabled() and value.requires_grad:
        return _CastOnceGrad.apply(value, entry[2])
    return entry[2]


if keras.backend.backend() == "torch":
    class _CastOnceGrad(torch.autograd.Function):
        """One use of :func:`cast_once`'s copy ``cast`` of ``master``: forward the copy (a
        view of it), backward the gradient converted to ``master``'s dtype, what the
        backward pass of ``master.to(cast.dtype)`` gives."""

        @staticmethod
        def forward(ctx, master, cast):
            ctx.master_dtype = master.dtype
            return cast.view_as(cast)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            return grad.to(ctx.master_dtype), None
