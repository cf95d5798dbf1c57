"""The one place where attention masks are built.

Convention everywhere (the Keras one): a mask is boolean and ``True`` means
"real token / may attend". Padding id is 0.

Shapes:
    padding mask          (batch, length)
    attention mask        (batch, query_len, key_len)
"""

from keras import ops

from transformerkit.special_tokens import PAD_ID


def padding_mask(token_ids):
    """``True`` where ``token_ids`` is a real token. ``(batch, length)`` -> same shape, bool."""
    return ops.not_equal(token_ids, PAD_ID)


def causal_mask(query_len, key_len, query_offset=0):
    """Lower-triangular mask: query ``i``, at absolute position ``query_offset + i``, sees keys
    ``<= query_offset + i``.

    ``query_offset`` may be a tensor (the write index of a key/value cache). Returns a
    ``(1, query_len, key_len)`` boolean tensor.
    """
    # the dtype given: a length may be a symbolic int (a graph torch.export captures), whose
    # type Keras cannot infer one from
    query_positions = ops.expand_dims(ops.arange(query_len, dtype="int32") + query_offset,
                                      1)  # (q, 1)
    key_positions = ops.expand_dims(ops.arange(key_len, dtype="int32"), 0)  # (1, k)
    return ops.expand_dims(ops.greater_equal(query_positions, key_positions), 0)


def attention_mask(query_mask=None, key_mask=None, causal=False, explicit_mask=None,
                   query_len=None, key_len=None, query_offset=0):
    """Combine padding, causal and explicit masks into one ``(batch, query_len, key_len)`` mask.

    Args:
        query_mask: ``(batch, query_len)`` bool or None. Accepted for symmetry with Keras'
            ``query_mask`` but unused: padding queries may attend freely (their outputs are
            ignored downstream), and masking them would only create all-masked rows.
        key_mask: ``(batch, key_len)`` bool or None; padding keys are never attended to.
        causal: add :func:`causal_mask`.
        explicit_mask: ``(batch, query_len, key_len)`` bool (or 0/1) or None, ANDed in.
        query_len, key_len: needed when ``causal`` is set.
        query_offset: absolute position of the first query (for cached decoding).

    Returns:
        A boolean ``(batch|1, query_len, key_len)`` tensor, or None when nothing masks.
        Rows in which every key is masked are handled by the attention core (zero output,
        no NaN).
    """
    del query_mask  # queries never remove keys; see docstring.
    mask = None
    if key_mask is not None:
        mask = ops.expand_dims(ops.cast(key_mask, "bool"), 1)  # (b, 1, k)
    if causal:
        mask = _and(mask, causal_mask(query_len, key_len, query_offset))
    if explicit_mask is not None:
        mask = _and(mask, ops.cast(explicit_mask, "bool"))
    return mask


def _and(a, b):
    return b if a is None else ops.logical_and(a, b)
