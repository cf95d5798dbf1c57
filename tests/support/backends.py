"""The Keras backends the cross-backend tests run, and whether the caller chose one.

``conftest.py`` sets ``TRANSFORMERKIT_TESTS_DEFAULT_BACKEND`` before this is first imported
when ``KERAS_BACKEND`` was not set (pytest-xdist workers inherit the marker).
"""

import os

BACKENDS = ("jax", "tensorflow", "torch")
# The backend the caller chose with KERAS_BACKEND, or None for the default (PyTorch).
USER_BACKEND = (None if os.environ.get("TRANSFORMERKIT_TESTS_DEFAULT_BACKEND")
                else os.environ.get("KERAS_BACKEND"))
# XLA spends most of a small probe's time compiling; these halve it, numbers stay within 1e-6.
FAST_XLA_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
