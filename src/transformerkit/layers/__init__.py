"""Keras 3 layers of the Transformer, one job per module."""

from transformerkit.layers.attention import MultiHeadAttention, scaled_dot_product_attention
from transformerkit.layers.blocks import DecoderBlock, EncoderBlock
from transformerkit.layers.embeddings import PositionalEncoding, TokenEmbedding, sinusoidal_table
from transformerkit.layers.feedforward import FeedForward
from transformerkit.layers.masks import attention_mask, causal_mask, padding_mask

__all__ = [
    "DecoderBlock", "EncoderBlock", "FeedForward", "MultiHeadAttention", "PositionalEncoding",
    "TokenEmbedding", "attention_mask", "causal_mask", "padding_mask",
    "scaled_dot_product_attention", "sinusoidal_table",
]
