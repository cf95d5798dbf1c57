"""Running a decode loop fast on each backend: compiled where compiling pays, eager elsewhere.

A decode loop is written once with ``keras.ops`` (:mod:`.greedy`, :mod:`.beam`,
:mod:`.sampling`) as a function of arrays. :func:`run_decoder` then runs it

- on **JAX** as one ``jax.jit``-compiled function per shape bucket, the whole loop inside
  (``lax.while_loop``); the model's weights are arguments (through ``keras.StatelessScope``),
  not constants, so a compiled decoder follows the weights while a model trains;
- on **TensorFlow** as one ``tf.function`` graph per shape bucket (``tf.while_loop``);
- on **PyTorch** eagerly under ``torch.inference_mode()``: a Python loop with integer
  positions, which on a CPU is faster than anything ``torch.compile`` gained back after its
  compile time (see ``bench/decode.py``). Inference mode skips the autograd bookkeeping
  (version counters, view tracking) that ``torch.no_grad`` still does on every call, which
  counts in a decode loop of many small calls. The model is built first, outside it, so
  that its variables stay normal tensors that later training can differentiate.

Compiled functions are kept on the model (keyed by the algorithm, its settings and the
array shapes), so translating many batches compiles once per bucket; :func:`bucket` rounds
lengths and batch sizes up to keep the number of buckets small.
"""

import sys

import numpy as np

from transformerkit.backend import choose_default_backend
from transformerkit.backend import keras_ops as ops

_CACHE_ATTRIBUTE = "_transformerkit_compiled_decoders"


def backend():
    """The Keras backend: Keras' own answer once it is imported, before that the one it will
    take (``KERAS_BACKEND``, which :mod:`transformerkit.backend` sets where nobody chose
    one), so that decoding from compiled packages needs no Keras import."""
    keras = sys.modules.get("keras")
    return keras.backend.backend() if keras is not None else choose_default_backend()


def is_eager_loop():
    """True where decode loops run as Python loops (PyTorch): positions stay Python ints."""
    return backend() == "torch"


def run_decoder(model, key, fn, *args):
    """Run ``fn(*args)`` (``keras.ops`` over ``model``) compiled for the current backend.

    ``key`` must identify everything ``fn`` bakes in (algorithm and static settings); the
    shapes and dtypes of ``args`` (NumPy arrays) are added to it here. Returns NumPy.
    """
    _sync_jax_training_state(model)
    if backend() == "torch":
        import torch

        ensure_built = getattr(model, "_ensure_built", None)
        if ensure_built is not None:  # variables made in inference mode could not train
            ensure_built()
        with torch.inference_mode():
            out = fn(*args)
    else:
        compiled_fns = _compiled_fns(model)
        full_key = (key, tuple((np.shape(a), np.asarray(a).dtype.str) for a in args))
        compiled = compiled_fns.get(full_key)
        if compiled is None:
            compiled = _compile_jax(model, fn) if backend() == "jax" else _compile_tf(fn)
            compiled_fns[full_key] = compiled
        out = compiled(*args)
    return _numpy_tree(out)


def to_numpy(x):
    """NumPy value of a backend tensor (on PyTorch without NumPy 2's ``__array__`` warning)."""
    if isinstance(x, (np.ndarray, np.generic, int, float)):
        return np.asarray(x)
    if getattr(x, "is_cpu", False) and not x.requires_grad:  # a torch tensor in host memory
        return x.numpy()
    if hasattr(x, "detach") and backend() == "torch":
        return x.detach().cpu().numpy()
    return ops.convert_to_numpy(x)


def _numpy_tree(out):
    """``out`` (tensors in dicts, lists and tuples; None kept) with every tensor as NumPy."""
    if isinstance(out, dict):
        return {k: _numpy_tree(v) for k, v in out.items()}
    if isinstance(out, (list, tuple)):
        values = [_numpy_tree(v) for v in out]
        return type(out)(*values) if hasattr(out, "_fields") else type(out)(values)
    return None if out is None else to_numpy(out)


def _compiled_fns(model):
    fns = model.__dict__.get(_CACHE_ATTRIBUTE)
    if fns is None:  # object.__setattr__: not a Keras-tracked attribute, not saved
        fns = {}
        object.__setattr__(model, _CACHE_ATTRIBUTE, fns)
    return fns


def _sync_jax_training_state(model):
    """During ``fit`` on JAX the weights live outside the variables; bring them back."""
    sync = getattr(model, "jax_state_sync", None)
    if backend() == "jax" and callable(sync):
        sync()


def _compile_jax(model, fn):
    import jax
    import keras

    variables = list(model.variables)

    def stateless(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return fn(*args)

    jitted = jax.jit(stateless)
    return lambda *args: jitted([v.value for v in variables], *args)


def _compile_tf(fn):
    import tensorflow as tf

    return tf.function(fn, autograph=False, jit_compile=False)


def while_loop(cond, body, state):
    """``while cond(state): state = body(state)`` over a dict of tensors.

    PyTorch: a plain Python loop (``state["index"]`` may stay a Python int). JAX and
    TensorFlow: ``keras.ops.while_loop``, i.e. ``lax.while_loop`` / ``tf.while_loop``, so
    the loop is part of the compiled function; shapes must not change between iterations.
    """
    if is_eager_loop():
        while bool(cond(state)):
            state = body(state)
        return state
    return ops.while_loop(cond, lambda s: (body(s),), (state,))[0]


def start_index(value):
    """The loop's position counter: a Python int on PyTorch, an int32 scalar elsewhere."""
    return int(value) if is_eager_loop() else ops.convert_to_tensor(value, "int32")


class UniformNoise:
    """Reproducible uniform noise in (0, 1) per decode step, inside compiled loops.

    ``keras.random`` needs a Python int or a ``SeedGenerator`` (a variable) as seed, which a
    compiled loop cannot vary per step, so each backend's own counter-based generator is
    used: ``jax.random.fold_in(key(seed), step)``, ``tf.random.stateless_uniform(seed=[seed,
    step])`` and, in PyTorch's eager loop, one ``torch.Generator`` seeded once. The same
    seed gives the same numbers on the same backend.

    Args:
        seed: int32 scalar (a NumPy value outside, a tensor inside a compiled function).
    """

    def __init__(self, seed):
        self.seed = seed
        self._generator = None
        if backend() == "torch":
            import torch

            from transformerkit.decoding.loop_ops import tensor_device

            self._generator = torch.Generator(device=tensor_device())
            self._generator.manual_seed(int(seed))

    def __call__(self, step, shape):
        tiny = 1e-20
        if backend() == "torch":
            import torch

            u = torch.rand(shape, generator=self._generator, device=self._generator.device)
            return u.clamp_min(tiny)
        if backend() == "jax":
            import jax

            key = jax.random.fold_in(jax.random.PRNGKey(self.seed), step)
            return jax.random.uniform(key, shape, minval=tiny, maxval=1.0)
        import tensorflow as tf

        seed = tf.stack([tf.cast(self.seed, tf.int32), tf.cast(step, tf.int32)])
        return tf.random.stateless_uniform(shape, seed=seed, minval=tiny, maxval=1.0)


def bucket(value, multiple, limit=None):
    """``value`` rounded up to a multiple of ``multiple`` (at most ``limit``) on compiling
    backends, unchanged on PyTorch (where every shape is as cheap as any other)."""
    if is_eager_loop():
        return int(value)
    rounded = -(-int(value) // multiple) * multiple
    return max(int(value), min(rounded, limit)) if limit is not None else rounded


def batch_bucket(rows):
    """Rows of a batch after bucketing: the next power of two on compiling backends."""
    if is_eager_loop() or rows <= 1:
        return int(rows)
    return 1 << (int(rows) - 1).bit_length()
