"""Text in, text out: encode, batch by length, decode (greedy, beam or sampling), detokenize."""


import numpy as np

from transformerkit.data.padding import pad_batch
from transformerkit.decoding.beam import beam_translate
from transformerkit.decoding.greedy import greedy_translate
from transformerkit.decoding.options import SearchOptions, resolve
from transformerkit.decoding.sampling import sample_translate
from transformerkit.decoding.texts import encode_sources


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
