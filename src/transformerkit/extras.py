"""The optional packages, the extra of ``keras-transformerkit`` that installs each, and the
one error a missing one gives.

``pyproject.toml``'s ``[project.optional-dependencies]`` declares the extras; this table
maps what the code imports to them, so that a path a user takes without its package ends
in one line naming what to install (the CLI prints it and exits with status 2) instead of
a traceback from deep inside a command.
"""

import importlib

# top-level import name -> the extra that installs it
EXTRAS = {
    "safetensors": "hf",  # import / export --format huggingface: the weight files
    "transformers": "hf",  # Hugging Face tokenizer folders
    "huggingface_hub": "hf",  # hub names (a dependency of transformers)
    "ctranslate2": "ctranslate2",
    "fastapi": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "pydot": "diagram",
    "tensorflow_datasets": "tfds",
    "tensorboard": "torch",  # every backend's extra installs it
}


class MissingExtra(ImportError):
    """An optional package is not installed; the message names the extra to install."""


def install_hint(module):
    """``pip install "keras-transformerkit[EXTRA]"`` for ``module``'s extra."""
    extra = EXTRAS[module.split(".")[0]]
    return f'pip install "keras-transformerkit[{extra}]"'


def require(module, purpose):
    """``importlib.import_module(module)``, or :class:`MissingExtra` saying that
    ``purpose`` (what the user asked for: "transformerkit import") needs the package and
    which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        missing = (getattr(err, "name", None) or "").split(".")[0]
        if top not in EXTRAS or missing != top:  # not absent: broken, let it show
            raise
        raise MissingExtra(f"{purpose} needs the {top} package, which is not installed "
                           f"({install_hint(top)})") from err
