"""Token ids where they enter a model or a decoder: rank, integer dtype, length and
vocabulary range checked, with a clear error (no Keras needed for NumPy or PyTorch ids)."""

import sys

import numpy as np

_INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def check_token_ids(ids, vocab_size, max_length, name="token_ids"):
    """Validate ``(batch, length)`` token ids where they enter a model.

    Always checks rank, integer dtype and length <= ``max_length``; checks that every id is
    in ``[0, vocab_size)`` whenever the values are concrete (eager calls, NumPy input), i.e.
    everywhere except inside a compiled graph. Raises ``TypeError``/``ValueError`` naming
    the problem instead of failing deep inside a backend (or, on JAX, silently clipping).
    """
    if isinstance(ids, (list, tuple)):
        ids = np.asarray(ids)
    dtype = _dtype_name(ids)
    if dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must be integer token ids, got dtype {dtype}")
    if len(ids.shape) != 2:
        raise ValueError(f"{name} must have shape (batch, length), got shape {tuple(ids.shape)}")
    length = ids.shape[1]
    if length is not None and length > max_length:
        raise ValueError(f"{name} has length {length}, longer than max_length={max_length} of "
                         "this model; truncate the input or build the model with a larger "
                         "max_length")
    values = concrete_numpy(ids)
    if values is not None and values.size:
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{name} contains id {bad}, outside the vocabulary [0, {vocab_size})")
    return ids


def concrete_numpy(x):
    """NumPy value of ``x`` if it is concrete (not symbolic or traced), else None."""
    if isinstance(x, np.ndarray):
        return x
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return None if torch.compiler.is_compiling() else x.detach().cpu().numpy()
    import keras

    if isinstance(x, keras.KerasTensor):
        return None
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):
            return None
    elif backend == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly() or not hasattr(x, "numpy"):
            return None
    return keras.ops.convert_to_numpy(x)


def _dtype_name(ids):
    """The dtype of ``ids`` by its Keras name (``"int32"``, ``"float32"``, ...)."""
    if isinstance(ids, np.ndarray):
        return ids.dtype.name
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(ids.dtype, torch.dtype):
        return str(ids.dtype).removeprefix("torch.")
    import keras

    return keras.backend.standardize_dtype(ids.dtype)
