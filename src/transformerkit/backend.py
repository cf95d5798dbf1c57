"""Choose the Keras backend before Keras is imported.

Order: an explicit ``KERAS_BACKEND`` (or ``--backend`` on the CLI, which sets it), then a
backend named in ``~/.keras/keras.json``, then the fastest installed one on this kind of
machine by our measurements (``bench/``): PyTorch, then JAX, then TensorFlow.
"""

import importlib.util
import json
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
    config = os.path.join(os.environ.get("KERAS_HOME", os.path.expanduser("~/.keras")),
                          "keras.json")
    try:
        with open(config) as f:
            configured = json.load(f).get("backend")
    except (OSError, ValueError):
        configured = None
    if configured:
        return configured
    for name in PREFERRED:
        if importlib.util.find_spec(name) is not None:
            os.environ["KERAS_BACKEND"] = name
            return name
    return "tensorflow"
