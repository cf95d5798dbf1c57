"""What a search takes and gives, apart from the model: texts in (checked and encoded), the
values of its options checked, the length caps, and text out piece by piece.

Plain Python and NumPy, no Keras: the engines that decode without the run's Keras model (the
CTranslate2 export, :mod:`transformerkit.export.runtime`) use these, so a command that
translates with them starts without importing Keras. The Keras engines' modules
(:mod:`.common`, :mod:`.translate`, :mod:`.sampling`, :mod:`.streaming`) use the same
functions and name them too.
"""

import math
import warnings

import numpy as np

from transformerkit.special_tokens import PAD_ID


def check_count(value, name, minimum=1):
    """``value`` as an int if it is one (a Python or NumPy integer, not a bool) of at least
    ``minimum``; else a ``TypeError`` / ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.40}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def check_number(value, name, minimum=0.0):
    """``value`` as a float if it is a finite real number (not a bool) of at least
    ``minimum``; else a ``TypeError`` / ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r:.40}")
    if not (math.isfinite(value) and value >= minimum):  # NaN and infinities too
        raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {value}")
    return float(value)


def check_max_new_tokens(max_new_tokens, limit, what="max_new_tokens"):
    """``max_new_tokens`` as an int in ``[1, limit]``; larger values are cut with a warning."""
    if max_new_tokens is None:
        return int(limit)
    max_new_tokens = check_count(max_new_tokens, what)
    if max_new_tokens > limit:
        warnings.warn(f"{what}={max_new_tokens} is more than this model can produce; "
                      f"decoding at most {limit} tokens (the model's max_length)", stacklevel=3)
        return int(limit)
    return max_new_tokens


def length_caps(source, max_new, max_len_a=None, max_len_b=None):
    """``(rows,)`` int32: the most tokens (EOS included) each sentence of ``(rows, len)``
    source ids may produce: ``min(max_new, floor(max_len_a * source_len + max_len_b))`` with
    ``source_len`` its real tokens (EOS included), as fairseq's ``--max-len-a/--max-len-b``;
    just ``max_new`` when both are None, and either one None counts as 0. The values are
    those of a :class:`~transformerkit.decoding.options.SearchOptions`, which checks them (a
    finite ``max_len_a >= 0``, an int ``max_len_b >= 0``, a cap of at least one token)."""
    source = np.asarray(source)
    rows = source.shape[0]
    if max_len_a is None and max_len_b is None:
        return np.full((rows,), max_new, dtype="int32")
    # a and b as large as they may be (1e308, 10**400): above max_new they cap at max_new
    a = 0.0 if max_len_a is None else min(float(max_len_a), max_new)
    b = 0 if max_len_b is None else min(int(max_len_b), max_new)
    lengths = (source != PAD_ID).sum(axis=1)
    caps = np.floor(a * lengths + b + 1e-9).astype("int64")
    return np.clip(caps, 1, max_new).astype("int32")


def check_sampling(temperature, top_k, top_p, seed):
    """``(top_k, top_p, seed)`` checked and normalised (clear errors for bad values): a
    ``temperature`` >= 0, ``top_k`` an int >= 1, ``top_p`` in (0, 1], ``seed`` an int (taken
    modulo 2**31; None draws one)."""
    check_number(temperature, "temperature")
    if top_k is not None:
        top_k = check_count(top_k, "top_k")
    if top_p is not None and not 0.0 < check_number(top_p, "top_p") <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2 ** 31))
    check_count(seed, "seed", minimum=-(2 ** 63))
    return top_k, (None if top_p in (None, 1.0) else top_p), np.int32(int(seed) % (2 ** 31))


def check_text(text, what, empty=None):
    """Raise a clear ``ValueError`` naming ``what`` (``"text 3"``) if ``text`` holds lone
    surrogates (U+D800..U+DFFF: not Unicode text; Python makes them from undecodable bytes),
    which no tokenizer can take; with ``empty`` (what to tell the caller, ``"nothing to
    translate"``), also if it is empty or only whitespace. The one check of both rules: the
    decoders and the HTTP server call it."""
    if empty is not None and not text.strip():
        raise ValueError(f"{what} is empty: {empty}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{what} is not valid Unicode: lone surrogate {text[err.start]!r} at "
                         f"character {err.start} (undecodable bytes? decode them with "
                         "errors='replace')") from None


def as_text_list(texts):
    """``(list of texts, single)`` for an argument that is one text (a str: ``single``) or
    an iterable of texts; anything else (None, a number, bytes) is a clear ``TypeError``.
    Each item is checked by :func:`encode_sources`."""
    if isinstance(texts, str):
        return [texts], True
    if isinstance(texts, (bytes, bytearray)):
        raise TypeError("texts are bytes: decode them to str first (bytes.decode('utf-8'))")
    try:
        return list(texts), False
    except TypeError:
        raise TypeError(f"texts must be a str or a list of str, got "
                        f"{type(texts).__name__}") from None


def encode_sources(texts, tokenizer, max_length, add_bos=False, task="translate"):
    """Source texts -> id lists ``pieces + [EOS]`` (how the model was trained; an encoder's
    ``[BOS] + pieces + [EOS]`` with ``add_bos``).

    Raises ``ValueError`` for an empty (or whitespace-only) text or one with lone
    surrogates, naming its index; a text
    longer than ``max_length`` tokens is cut to its first ``max_length - 1`` tokens + EOS,
    with a warning (``task`` names what is done with it there).
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings; wrap a single sentence in a list")
    encoded, too_long = [], []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"text {i} is {type(text).__name__}, not str: {text!r:.60}")
        check_text(text, f"text {i}", empty=f"nothing to {task}")
        ids = tokenizer.encode(text, add_bos=add_bos, add_eos=True)
        if len(ids) > max_length:
            too_long.append((i, len(ids)))
            ids = ids[: max_length - 1] + [tokenizer.eos_id]
        encoded.append(ids)
    if too_long:  # one warning per call, not one per text
        (first, length), more = too_long[0], len(too_long) - 1
        warnings.warn(f"text {first} has {length} tokens, more than the model's max_length="
                      f"{max_length}" + (f" (and {more} more texts)" if more else "") +
                      f"; only the first {max_length - 1} tokens of each are used to {task}",
                      stacklevel=3)
    return encoded


def text_pieces(tokenizer, id_chunks):
    """The new text of each list of ids from ``id_chunks`` (decoded with ``tokenizer``,
    whose end token is left out as ``Run.generate`` leaves it out), as a generator of one
    string per list (empty where the ids add no text yet); joined, ``tokenizer.decode`` of
    all the ids.

    A text that ends in U+FFFD (the start of a character whose other bytes are still to
    come) is held back until it is whole; new text is handed out only when the text so far
    extends what was handed out, so the tokenizer's decoding must be stable that way (it is
    for transformerkit's character, BPE, WordPiece and Unigram tokenizers). What is still
    held back at the end comes as one last string. Closing this generator closes
    ``id_chunks``.
    """
    eos = tokenizer.eos_id

    def decode(ids):
        return tokenizer.decode([i for i in ids if i != eos])

    new, said = [], ""
    chunks = iter(id_chunks)
    try:
        for ids in chunks:
            new.extend(ids)
            text = decode(new).rstrip("\ufffd")
            if len(text) > len(said) and text.startswith(said):
                piece, said = text[len(said):], text
            else:
                piece = ""
            yield piece
    finally:
        if hasattr(chunks, "close"):
            chunks.close()
    final = decode(new)
    if final != said:
        if not final.startswith(said):
            raise RuntimeError(f"the tokenizer decodes the continuation as {final!r}, which "
                               f"does not extend the text streamed so far, {said!r}")
        yield final[len(said):]
