"""Loading saved ``.keras`` models with the layer and model classes registered, and clear
errors.

Only ``transformerkit.layers`` and ``transformerkit.models`` are registered here, so that
this module sits below ``training``: a model loads for inference with ``compile=False``.
Loading a compiled checkpoint (``compile=True``) needs the loss, metric and optimizer
classes registered too, which ``transformerkit.training.callbacks.load_checkpoint`` does.
"""

import os
import zipfile


def load_model(path, compile=False):
    """Load a ``.keras`` file written by transformerkit (Keras safe mode: no pickles or lambdas).

    ``compile=True`` also restores the loss, metrics and optimizer, whose classes must be
    registered first (importing ``transformerkit.training.callbacks`` registers them all).

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file for
    a truncated or corrupt one, instead of an error from deep inside Keras (a file refused
    by safe mode keeps Keras' own message, which names ``safe_mode``).
    """
    import keras

    import transformerkit.layers  # noqa: F401  (registers the classes a .keras file names)
    import transformerkit.models.encoder  # noqa: F401
    import transformerkit.models.gpt  # noqa: F401
    import transformerkit.models.transformer  # noqa: F401

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no model file at {path}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a valid .keras file (truncated or corrupt)")
    try:
        return keras.saving.load_model(path, compile=compile, safe_mode=True)
    except (zipfile.BadZipFile, OSError, KeyError, EOFError) as err:
        raise ValueError(f"{path} could not be read (truncated or corrupt): {err}") from err
    except (ValueError, TypeError) as err:  # a bad config.json, weights of the wrong shape
        if "safe_mode" in str(err):  # refused by safe mode: say so, unchanged
            raise
        raise ValueError(f"{path} could not be loaded (truncated or corrupt, or not a "
                         f"transformerkit model): {err}") from err
