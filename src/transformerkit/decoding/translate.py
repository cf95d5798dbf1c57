"""Text in, text out: encode, batch by length, decode (greedy, beam or sampling), detokenize."""

import warnings

import numpy as np

from transformerkit.data.pipeline import pad_batch
from transformerkit.decoding.beam import beam_translate
from transformerkit.decoding.greedy import greedy_translate
from transformerkit.decoding.options import SearchOptions, resolve
from transformerkit.decoding.sampling import sample_translate


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


def translate_batches(model, source_tokenizer, target_tokenizer, texts, options=None,
                      precision="float32", use_cache=True, **keywords):
    """Yield ``(indices, results)`` per batch: the positions in ``texts`` and, for each,
    a string (``n_best == 1``) or a list of ``(text, score)`` pairs, best first.

    ``options``: a :class:`~transformerkit.decoding.options.SearchOptions` (None: its
    defaults), ``keywords`` any of its fields in its place (``beam_size=1``). Texts are sorted
    by length so that a batch pads little; batches come out as soon as they are decoded.
    ``beam_size`` 1 is greedy search; ``temperature`` (not None) samples with ``top_k`` /
    ``top_p`` / ``seed`` instead; see :func:`~transformerkit.decoding.beam_translate` for
    the stopping rule and the length cap. ``precision``, ``use_cache``: as in
    :func:`~transformerkit.decoding.greedy_translate` (``"compiled"``: the compiled step).
    """
    options = resolve(SearchOptions, options, keywords, "translate")
    encoded = encode_sources(texts, source_tokenizer, model.max_length)
    order = np.argsort([len(e) for e in encoded], kind="stable")
    rows = options.batch_size  # sentences per batch (a beam search runs rows * width)
    tgt = target_tokenizer
    for start in range(0, len(order), rows):
        chunk = [int(i) for i in order[start:start + rows]]
        source = pad_batch([encoded[i] for i in chunk])
        ends = dict(bos_id=tgt.bos_id, eos_id=tgt.eos_id, precision=precision,
                    use_cache=use_cache)
        if options.samples:
            results = [tgt.decode(i) for i in sample_translate(model, source, options, **ends)]
        elif options.searches_beams:
            hyps = beam_translate(model, source, options, **ends)
            results = [[(tgt.decode(h.ids), h.score) for h in found] if options.n_best > 1
                       else tgt.decode(found[0].ids) for found in hyps]
        else:
            results = [tgt.decode(i) for i in greedy_translate(model, source, options, **ends)]
        yield chunk, results


def translate_texts(model, source_tokenizer, target_tokenizer, texts, options=None,
                    precision="float32", use_cache=True, **keywords):
    """Translations of ``texts`` in their order (arguments of :func:`translate_batches`)."""
    results = [None] * len(texts)
    for indices, outputs in translate_batches(model, source_tokenizer, target_tokenizer, texts,
                                              options, precision, use_cache, **keywords):
        for i, out in zip(indices, outputs, strict=True):
            results[i] = out
    return results
