"""Choose the Keras backend before Keras is imported.

An explicit ``KERAS_BACKEND`` (or ``--backend`` on the CLI, which sets it) wins. Otherwise
we pick the fastest installed backend on a CPU by our measurements (``bench/``): PyTorch,
then JAX, then TensorFlow. (``~/.keras/keras.json`` is not consulted: Keras writes
"tensorflow" there by itself on first import, so it says nothing about the user's choice.)
"""

import importlib.util
import os
import sys

PREFERRED = ("torch", "jax", "tensorflow")


def choose_default_backend():
    """Set ``KERAS_BACKEND`` if nobody chose one; return the backend Keras will use."""
    if "KERAS_BACKEND" in os.environ:
        return os.environ["KERAS_BACKEND"]
    if "keras" in sys.modules:  # too late to choose: Keras already picked
        import keras

        return keras.backend.backend()
    for name in PREFERRED:
        if importlib.util.find_spec(name) is not None:
            os.environ["KERAS_BACKEND"] = name
            return name
    return "tensorflow"


class _KerasOps:
    """``keras.ops``, imported when first used: the decoding modules name it at their top,
    and a run answered by compiled packages (:mod:`transformerkit.decoding.aot_files`) on
    PyTorch never calls it, so never pays for importing Keras. Once imported, its functions
    are plain attributes of this object (no lookup hook per call)."""

    def __getattr__(self, name):
        from keras import ops

        self.__dict__.update(vars(ops))
        return getattr(ops, name)


keras_ops = _KerasOps()
