"""Decoding: greedy (with the key/value cache)."""

from transformerkit.decoding.greedy import greedy_translate

__all__ = ["greedy_translate"]
