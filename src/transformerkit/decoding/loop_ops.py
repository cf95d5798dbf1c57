"""The array functions of the search loops' bookkeeping: ``keras.ops``, or torch's own kernels.

Beam search does its bookkeeping (which candidates survive, which hypotheses finish, whose
search is over) on small arrays, ``(sentences, 2 * beam)`` and ``(rows, width)``, about
forty array calls per step. Inside a compiled JAX/TensorFlow loop those calls are traced
once; in the eager PyTorch loop each ``keras.ops`` call pays its wrapper every step (input
conversion, a symbolic-tensor check that walks its arguments) that costs more than the
arithmetic (docs/benchmarks.md, "Decoding"). :func:`loop_ops` returns the namespace
a loop computes with: ``keras.ops`` everywhere, and on eager PyTorch, where the
:mod:`transformerkit.fastpath` shortcuts apply, :class:`TorchLoopOps`: the same functions
with the same arguments and results, each one torch call. The loops are written once
against this namespace.
"""
import sys

from transformerkit import fastpath
from transformerkit.backend import keras_ops as ops


def loop_ops():
    """``keras.ops``, or :class:`TorchLoopOps` where the PyTorch shortcuts apply."""
    if fastpath.applies():
        global _TORCH_LOOP_OPS
        if _TORCH_LOOP_OPS is None:
            _TORCH_LOOP_OPS = TorchLoopOps()
        return _TORCH_LOOP_OPS
    return ops


_TORCH_LOOP_OPS = None


def tensor_device():
    """The device Keras puts new tensors on (the CPU, or a GPU): Keras' answer where it is
    imported or a GPU is present; else the CPU, which Keras would take (so a run decoding
    from compiled packages needs no Keras import)."""
    import torch

    if "keras" not in sys.modules and not torch.cuda.is_available() \
            and not torch.backends.mps.is_available():
        return torch.device("cpu")
    return ops.convert_to_tensor(0).device


class TorchLoopOps:
    """The ``keras.ops`` functions the search loops use, as direct torch calls on torch
    tensors (NumPy arrays and Python numbers are converted, as ``keras.ops`` does). Dtypes
    are Keras names (``"int32"``, ``"float32"``, ``"bool"``). The tensors it makes are on
    ``device``, where Keras puts the model's (the CPU, or a GPU), as ``keras.ops`` does."""

    def __init__(self):
        import torch

        self.torch = torch
        self.device = tensor_device()
        self._dtypes = {"int32": torch.int32, "int64": torch.int64, "float32": torch.float32,
                        "bool": torch.bool}

    def _dtype(self, dtype):
        return None if dtype is None else self._dtypes[dtype]

    def convert_to_tensor(self, x, dtype=None):
        return self.torch.as_tensor(x, dtype=self._dtype(dtype), device=self.device)

    def cast(self, x, dtype):
        target = self._dtypes[dtype]
        if isinstance(x, self.torch.Tensor) and x.dtype == target and x.device == self.device:
            return x  # as ``.to`` would return it, without ``as_tensor``'s checks
        if isinstance(x, self.torch.SymInt):  # a captured step's index (aot_search)
            return self.torch.full((), x, dtype=self._dtypes[dtype], device=self.device)
        return self.torch.as_tensor(x, device=self.device).to(self._dtypes[dtype])

    def full(self, shape, value, dtype):
        return self.torch.full(shape, value, dtype=self._dtypes[dtype], device=self.device)

    def zeros(self, shape, dtype):
        return self.torch.zeros(shape, dtype=self._dtypes[dtype], device=self.device)

    def arange(self, start, stop=None, dtype="int32"):
        if stop is None:
            start, stop = 0, start
        return self.torch.arange(start, stop, dtype=self._dtypes[dtype], device=self.device)

    @staticmethod
    def reshape(x, shape):
        return x.reshape(shape)

    @staticmethod
    def expand_dims(x, axis):
        return x.unsqueeze(axis)

    @staticmethod
    def squeeze(x, axis):
        return x.squeeze(axis)

    def concatenate(self, xs, axis=0):
        return self.torch.cat(xs, axis)

    def take(self, x, indices, axis=0):
        """Rows (``axis=0``) or entries of ``x`` by non-negative ``indices`` (1-D)."""
        indices = self.torch.as_tensor(indices, device=self.device)
        return self.torch.index_select(x, axis, indices.reshape(-1)).reshape(
            x.shape[:axis] + indices.shape + x.shape[axis + 1:])

    def slice_update(self, x, start, update):
        """A copy of ``x`` with ``update`` written at the Python-int offsets ``start``."""
        out = x.clone()
        out[tuple(slice(s, s + n) for s, n in zip(start, update.shape, strict=True))] = update
        return out

    @staticmethod
    def slice(x, start, shape):
        """``x[start[0]:start[0] + shape[0], ...]``: a view (static offsets)."""
        return x[tuple(slice(s, s + n) for s, n in zip(start, shape, strict=True))]

    def repeat(self, x, repeats, axis):
        return self.torch.repeat_interleave(x, repeats, dim=axis)

    def all(self, x):
        return self.torch.all(x)

    def where(self, condition, x, y):
        return self.torch.where(condition, x, y)

    def maximum(self, x, y):
        if isinstance(x, self.torch.SymInt):  # a captured step's index (aot_search)
            return self.torch.sym_max(x, y)
        return self.torch.maximum(self.torch.as_tensor(x, device=self.device),
                                  self.torch.as_tensor(y, device=self.device))

    def top_k(self, x, k):
        return self.torch.topk(x, k)

    def min(self, x, axis, keepdims=False):
        return self.torch.amin(x, axis, keepdim=keepdims)

    def softmax(self, x, axis=-1):
        return self.torch.softmax(x, axis)

    def cumsum(self, x, axis):
        return self.torch.cumsum(x, axis)

    def log(self, x):
        return self.torch.log(x)

    def max(self, x, axis):
        return self.torch.amax(x, axis)

    @staticmethod
    def floor_divide(x, y):
        return x // y

    @staticmethod
    def mod(x, y):
        return x % y

    @staticmethod
    def equal(x, y):
        return x == y

    @staticmethod
    def less(x, y):
        return x < y

    @staticmethod
    def greater(x, y):
        return x > y

    @staticmethod
    def greater_equal(x, y):
        return x >= y

    @staticmethod
    def logical_and(x, y):
        return x & y

    @staticmethod
    def logical_or(x, y):
        return x | y

    @staticmethod
    def logical_not(x):
        return ~x
