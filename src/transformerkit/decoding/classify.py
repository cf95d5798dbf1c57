"""Using an encoder: class probabilities of texts and sentence embeddings.

An :class:`~transformerkit.models.Encoder` reads ``[BOS] + pieces + [EOS]`` (BERT's
``[CLS] ... [SEP]``), as it was trained (:func:`transformerkit.data.pipeline.encode_texts`).
Texts are batched by length (fewer padded positions), run through
:func:`~transformerkit.decoding.compiled.run_decoder` (eager under ``inference_mode`` on
PyTorch, compiled per shape on JAX and TensorFlow), and returned in the input order.
"""

import numpy as np
from keras import ops

from transformerkit.data.padding import pad_batch
from transformerkit.decoding.compiled import run_decoder
from transformerkit.decoding.texts import check_count, encode_sources
from transformerkit.layers.masks import padding_mask
from transformerkit.models.encoder import Encoder, mean_pool

POOLINGS = ("mean", "cls")


def _length_batches(ids, batch_size):
    """``(rows, padded ids)`` per batch of up to ``batch_size`` texts of similar length."""
    batch_size = check_count(batch_size, "batch_size")
    order = np.argsort([len(x) for x in ids], kind="stable")
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        yield rows, pad_batch([ids[i] for i in rows])


def _run(model, ids, batch_size, key, fn):
    """``fn(batch)`` for every length batch -> ``(len(ids), ...)`` float32 in input order."""
    out = None
    for rows, batch in _length_batches(ids, batch_size):
        values = np.asarray(run_decoder(model, key, fn, batch), dtype="float32")
        if out is None:
            out = np.zeros((len(ids), *values.shape[1:]), dtype="float32")
        out[rows] = values
    return out


def class_probabilities(model, tokenizer, texts, batch_size=64):
    """The classifier's softmax for each text: float32 ``(len(texts), num_classes)``.

    ``model`` is an Encoder with a classifier head (``num_classes``). Empty texts raise
    ``ValueError``; texts longer than ``model.max_length`` tokens are cut, with a warning.
    """
    if not isinstance(model, Encoder) or model.classifier is None:
        raise TypeError("class_probabilities needs an Encoder with a classifier head "
                        "(num_classes)")
    ids = encode_sources(texts, tokenizer, model.max_length, add_bos=True, task="classify")

    def probabilities(batch):  # (b, t) -> (b, classes)
        return model(batch, training=False, return_logits=False)

    return _run(model, ids, batch_size, ("classify",), probabilities)


def embed_texts(model, tokenizer, texts, pooling="mean", batch_size=64, normalize=False):
    """Sentence embeddings: float32 ``(len(texts), d_model)``.

    The last layer's hidden states of an Encoder (or a Transformer's encoder: its memory)
    pooled over each text: ``mean`` over its real tokens (sentence-transformers' mean
    pooling) or ``cls``, the state of its first token (``[BOS]``/``[CLS]``; an Encoder
    only, a translation model's source has no such token). ``normalize``: scale each row to
    unit L2 norm (cosine similarity is then a dot product).
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    encoder = isinstance(model, Encoder)
    if not encoder and not hasattr(model, "encode"):
        raise TypeError(f"a {type(model).__name__} has no encoder to embed with; use an "
                        "encoder or a translation run")
    if pooling == "cls" and not encoder:
        raise ValueError("pooling 'cls' reads the first token's state, which only an encoder "
                         "model's input has ([BOS]/[CLS]); a translation model's source "
                         "starts with its first word: use pooling 'mean'")
    ids = encode_sources(texts, tokenizer, model.max_length, add_bos=encoder, task="embed")

    def embed(batch):  # (b, t) -> (b, d_model)
        hidden = model.encode(batch, training=False)
        pooled = hidden[:, 0, :] if pooling == "cls" else mean_pool(hidden, padding_mask(batch))
        pooled = ops.cast(pooled, "float32")
        if normalize:
            norm = ops.sqrt(ops.sum(ops.square(pooled), axis=-1, keepdims=True))
            pooled = pooled / ops.maximum(norm, 1e-12)
        return pooled

    return _run(model, ids, batch_size, ("embed", pooling, bool(normalize)), embed)
