"""transformerkit: the Transformer of "Attention Is All You Need" on Keras 3."""

from transformerkit.backend import choose_default_backend

choose_default_backend()

__version__ = "0.1.0"
