"""Decoding with the key/value cache: greedy, beam search, sampling; compiled loops.

- :func:`greedy_translate`, :func:`beam_translate`, :func:`sample_translate`: a
  ``Transformer`` on a batch of source ids.
- :func:`generate_ids`, :func:`generate_text`: a ``GPT`` continuing prompts.
- :func:`translate_texts`, :func:`translate_batches`: text in, text out.
- :func:`sequence_log_probs`: the model's log-probability of given outputs.
"""

from transformerkit.decoding.beam import Hypothesis, beam_translate
from transformerkit.decoding.greedy import greedy_translate
from transformerkit.decoding.sampling import generate_ids, generate_text, sample_translate
from transformerkit.decoding.scoring import sequence_log_probs
from transformerkit.decoding.translate import translate_batches, translate_texts

__all__ = ["Hypothesis", "beam_translate", "generate_ids", "generate_text", "greedy_translate",
           "sample_translate", "sequence_log_probs", "translate_batches", "translate_texts"]
