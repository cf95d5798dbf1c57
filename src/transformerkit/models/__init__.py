"""The three models: encoder-decoder ``Transformer``, ``Encoder`` and ``GPT``."""

from transformerkit.models.encoder import Encoder
from transformerkit.models.gpt import GPT
from transformerkit.models.transformer import Transformer

__all__ = ["Encoder", "GPT", "Transformer"]
