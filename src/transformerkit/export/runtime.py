"""Translate and generate with a run's CTranslate2 export (``engine="ctranslate2"``).

The run's tokenizers turn text into token strings of the exported vocabulary and back; the
search runs in CTranslate2 (``Translator.translate_batch`` / ``Generator.generate_batch``;
``Generator.generate_tokens`` for a streamed generation).
How our decoding options map onto CTranslate2's:

    ====================  ===========================================================
    ours                  CTranslate2
    ====================  ===========================================================
    beam_size             ``beam_size`` (1: greedy search)
    n_best                ``num_hypotheses`` (scores: ``return_scores``)
    max_new_tokens        ``max_decoding_length`` / ``max_length``, within the model's
                          ``max_length`` (the positional table's end), as ours; a
                          generation's ``max_length`` option, less the prompt, where it
                          is none
    alpha, penalty        ``length_penalty``: CTranslate2 divides a beam's log-probability
                          by ``length ** alpha``: ``penalty="power"`` exactly; with the
                          GNMT form (``((5 + length) / 6) ** alpha``) long and short
                          candidates are weighed a little differently
    temperature, top_k,   ``sampling_temperature``, ``sampling_topk`` (0: the whole
    top_p                 vocabulary), ``sampling_topp``; temperature 0 is greedy
    seed                  ``ctranslate2.set_random_seed``, which seeds a translator's
                          worker threads when they start: a call with a seed runs on a
                          fresh session (a model load), so the same seed gives the same
                          output (not the same draws as our engine)
    never PAD or BOS      ``suppress_sequences``, which rules them out before the softmax:
                          ``renormalize=True``; with ``false`` (ours rules them out after
                          it) a beam's scores differ by the mass they had
    min_new_tokens        ``min_decoding_length`` / ``min_length`` (0 by default: ``</s>``
                          may come first, as in ours; CTranslate2's default 1 forbids it)
    no_repeat_ngram_size  translation: ``no_repeat_ngram_size`` (both ban each id that
                          would complete an n-gram the output already holds); refused
                          for a GPT, whose n-grams include the prompt's here and not in
                          CTranslate2's generator
    stop_at_eos=False     ``end_token=[]``

    max_len_a, max_len_b  the cap ``max_len_a * source_len + max_len_b`` per sentence:
                          CTranslate2 decodes the batch up to its largest cap
                          (``max_decoding_length``) and each output is cut at its own
                          cap, which is exactly ours for greedy search and sampling (a
                          shorter cap only ends the same sequence earlier); beam search
                          compares its candidates under the batch's cap, so a capped
                          sentence may get another hypothesis than ours
    stopping="early"      CTranslate2's only rule; ``"exact"`` and ``"heuristic"`` are
                          refused for beam search
    forced_eos            greedy search and sampling: each output is cut one token
                          before its cap (the forced end token), exactly ours; refused
                          for beam search, where forcing changes the hypotheses' scores
    ====================  ===========================================================

Not mapped: for a GPT, generation beyond the model's ``max_length`` (our engine slides a
window over the context; CTranslate2 raises).
"""

import os
import warnings
import weakref

import numpy as np

from transformerkit.data.padding import pad_batch
from transformerkit.decoding.options import GenerationOptions, resolve
from transformerkit.decoding.texts import (
    as_text_list,
    check_sampling,
    check_text,
    encode_sources,
    length_caps,
    text_pieces,
)
from transformerkit.export.ctranslate2_folders import (
    default_export_dir,
    is_current,
    read_metadata,
    record_file,
    stands_for_file,
)
from transformerkit.extras import require
from transformerkit.threads import resolve_threads

_ENGINES = weakref.WeakKeyDictionary()  # Run -> {threads: its CTranslate2Engine}

ctranslate2 = require("ctranslate2", "the CTranslate2 export and engine")


def engine_for(run, threads=0):
    """The run's :class:`CTranslate2Engine` with ``threads`` (``RuntimeOptions.threads``),
    made once per run and thread count."""
    engines = _ENGINES.setdefault(run, {})
    threads = resolve_threads(threads)
    if threads not in engines:
        engines[threads] = CTranslate2Engine(run, threads=threads)
    return engines[threads]


def ensure_export(run, quantization=None):
    """The run's export folder (:func:`default_export_dir`), written first if it is missing,
    incomplete or made from other weights than ``run.model``'s. A run whose weights are still
    those of its ``.keras`` file (:meth:`~transformerkit.api.Run.weights_file`) is checked
    by that file's digest, without loading the model where :func:`~transformerkit.api.load`
    left it unloaded. The export is atomic, so a half-written one is never used; two
    processes exporting at once both end with a complete folder."""
    model_dir = default_export_dir(run.run_dir, quantization)
    model_file = run.weights_file()
    if model_file is not None and (run.checked_export() == model_dir
                                   or stands_for_file(model_dir, run.run_dir, model_file)):
        return model_dir
    if is_current(model_dir, run.model):
        model_file = run.weights_file()
        if model_file is not None:  # an export that recorded no file, or another file
            record_file(model_dir, run.run_dir, model_file, run.model.count_params())
        return model_dir
    from transformerkit.export.ctranslate2 import export_run

    try:
        export_run(run, model_dir, quantization=quantization, force=True)
    except OSError:
        if not is_current(model_dir, run.model):  # else another process exported it
            raise
    return model_dir


class CTranslate2Engine:
    """A run's model in CTranslate2: ``translate`` / ``translate_batches`` for a
    ``Transformer`` run, ``generate`` for a GPT, with the options of ``transformerkit.api.Run``.

    Args:
        run: a loaded ``transformerkit.api.Run`` (its tokenizers; its model is exported on
            first use into the run directory).
        threads: CTranslate2's ``intra_threads`` (0: the cores this process may use,
            :func:`transformerkit.threads.resolve_threads`).
        compute_type: CTranslate2's ``compute_type`` ("default": as exported; "int8",
            "int8_float32", "float32", ...: converted when loaded).
        model_dir: an export folder to use instead of the run's own.
    """

    def __init__(self, run, threads=0, compute_type="default", model_dir=None):
        self.run = run
        self.model_dir = os.fspath(model_dir) if model_dir else ensure_export(run)
        metadata = read_metadata(self.model_dir) or {}  # a folder of another tool has none
        self.max_length = metadata.get("max_length") or run.model.max_length
        self.threads = resolve_threads(threads)  # CTranslate2's intra_threads
        self._open = lambda: (ctranslate2.Generator if run.kind == "gpt" else
                              ctranslate2.Translator)(self.model_dir, device="cpu",
                                                      intra_threads=self.threads,
                                                      compute_type=compute_type)
        self.session = self._open()
        target = run.target_tokenizer
        self._source_tokens = _tokens_of(run.source_tokenizer)
        self._target_ids = {t: i for i, t in enumerate(_tokens_of(target))}
        self._suppress = [[target.id_to_token(target.pad_id)],
                          [target.id_to_token(target.bos_id)]]
        self._target = target

    def _session(self, seed):
        """The session to sample with ``seed``: CTranslate2 seeds its worker threads' random
        generators when they start, so a seeded call gets a session of its own."""
        if seed is None:
            return self.session
        ctranslate2.set_random_seed(int(seed) % 2 ** 31)
        return self._open()

    def _max_new(self, max_new_tokens):
        limit = self.max_length  # the last output needs no position of its own
        if max_new_tokens is None:
            return limit
        if int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if int(max_new_tokens) > limit:
            warnings.warn(f"max_new_tokens={max_new_tokens} is more than this model can "
                          f"produce; decoding at most {limit} tokens", stacklevel=3)
        return min(int(max_new_tokens), limit)

    def _decode(self, tokens):
        return self._target.decode([self._target_ids[t] for t in tokens])

    # -- translation ---------------------------------------------------------------------
    def translate_batches(self, texts, options=None, **keywords):
        """Yield ``(indices, results)`` per batch, as
        :func:`transformerkit.decoding.translate.translate_batches` (the same
        :class:`~transformerkit.decoding.options.SearchOptions`; the length cap and stopping
        rule as the module's table says)."""
        options = self.run.search_options(options, keywords, "translate")
        _check_expressible(options)
        n_best, max_len_a, max_len_b = options.n_best, options.max_len_a, options.max_len_b
        encoded = encode_sources(texts, self.run.source_tokenizer, self.max_length)
        order = np.argsort([len(e) for e in encoded], kind="stable")
        search = options
        options = dict(beam_size=search.width, num_hypotheses=n_best,
                       length_penalty=search.alpha, return_scores=n_best > 1,
                       max_decoding_length=self._max_new(search.max_new_tokens),
                       min_decoding_length=search.min_new_tokens, max_input_length=0,
                       no_repeat_ngram_size=search.no_repeat_ngram_size,
                       suppress_sequences=self._suppress)
        session = self.session
        if search.samples:
            options.update(_sampling(search.temperature, search.top_k, search.top_p,
                                     search.seed), beam_size=1)
            session = self._session(search.seed)
        for start in range(0, len(order), search.batch_size):
            chunk = [int(i) for i in order[start:start + search.batch_size]]
            # the model adds </s> itself (add_source_eos): give the pieces only
            source = [[self._source_tokens[i] for i in encoded[k][:-1]] for k in chunk]
            caps = length_caps(pad_batch([encoded[k] for k in chunk]),
                               options["max_decoding_length"], max_len_a, max_len_b)
            longest = int(caps.max())  # a cap ends an output even before min_new_tokens
            found = session.translate_batch(source, **{
                **options, "max_decoding_length": longest,
                "min_decoding_length": min(options["min_decoding_length"], longest)})
            # a cap counts the end token: an output of cap tokens or more is cut to cap,
            # or one token before it where the end token is forced there
            caps = caps - int(search.forced_eos)
            if n_best > 1:
                results = [[(self._decode(h[:cap]), float(s)) for h, s in
                            zip(r.hypotheses, r.scores, strict=True)]
                           for r, cap in zip(found, caps, strict=True)]
            else:
                results = [self._decode(r.hypotheses[0][:cap])
                           for r, cap in zip(found, caps, strict=True)]
            yield chunk, results

    def translate(self, texts, options=None, **keywords):
        """One text -> str, a list -> a list (options of :meth:`translate_batches`)."""
        texts, single = as_text_list(texts)
        results = [None] * len(texts)
        for indices, outputs in self.translate_batches(texts, options, **keywords):
            for i, out in zip(indices, outputs, strict=True):
                results[i] = out
        return results[0] if single else results

    # -- generation ----------------------------------------------------------------------
    def generate(self, prompt, options=None, **keywords):
        """Continue ``prompt`` with a GPT export; returns prompt + continuation
        (:class:`~transformerkit.decoding.options.GenerationOptions`, or its fields as
        keywords)."""
        session, tokens, arguments = self._generation(prompt, options, keywords)
        result = session.generate_batch([tokens], include_prompt_in_result=False,
                                         **arguments)[0]
        new = [self._target_ids[t] for t in result.sequences[0]]
        tok = self.run.source_tokenizer
        return prompt + tok.decode([i for i in new if i != tok.eos_id])

    def generate_stream(self, prompt, options=None, **keywords):
        """The continuation of :meth:`generate` as a generator of text pieces (the new text
        of each token, :func:`~transformerkit.decoding.streaming.text_pieces`), from
        ``Generator.generate_tokens``; closing the generator stops the decoding."""
        session, tokens, arguments = self._generation(prompt, options, keywords)

        def ids():
            steps = session.generate_tokens(tokens, **arguments)
            try:
                for step in steps:
                    yield [self._target_ids[step.token]]
            finally:
                steps.close()  # its search stops at the next token

        return text_pieces(self.run.source_tokenizer, ids())

    def _generation(self, prompt, options, keywords):
        """``(session, prompt tokens, arguments)`` of a generation, every option checked."""
        options = resolve(GenerationOptions, self.run.generation if options is None else options,
                          keywords, "generate")
        seed = options.seed
        tok = self.run.source_tokenizer
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        check_text(prompt, "the prompt")
        ids = tok.encode(prompt)
        if not ids:
            raise ValueError("the prompt is empty: give at least one character or token")
        if len(ids) >= self.max_length:
            raise ValueError(f"the prompt has {len(ids)} tokens; CTranslate2 reads at most "
                             f"{self.max_length - 1} before generating (the model's "
                             "max_length); shorten it or use engine='keras'")
        max_new_tokens = options.new_tokens(len(ids))
        if max_new_tokens is None:
            max_new_tokens = self.max_length - len(ids)
        if len(ids) + max_new_tokens > self.max_length:
            raise ValueError(
                f"{len(ids)} prompt tokens + max_new_tokens={max_new_tokens} exceed the "
                f"model's max_length={self.max_length}: CTranslate2 has no positions beyond "
                "it (engine='keras' slides a window over the context); ask for at most "
                f"{self.max_length - len(ids)} new tokens")
        if options.no_repeat_ngram_size:
            raise ValueError(
                f"no_repeat_ngram_size={options.no_repeat_ngram_size}: CTranslate2's generator "
                "counts the n-grams of the new tokens only, ours those of the prompt too; "
                "generate with engine='keras' or 'compiled'")
        arguments = dict(max_length=max_new_tokens, min_length=options.min_new_tokens,
                         suppress_sequences=self._suppress,
                         **_sampling(options.temperature, options.top_k, options.top_p, seed))
        if not options.stop_at_eos:
            arguments["end_token"] = []
        session = self._session(seed if options.temperature else None)
        return session, [self._source_tokens[i] for i in ids], arguments


def _check_expressible(options):
    """Refuse, in one ``ValueError`` naming each, the options CTranslate2's beam search
    cannot express (see the module's table): a stopping rule other than ``early``, and a
    forced end token. Greedy search and sampling take them all (no stopping rule to apply;
    the forced token is a cut)."""
    if not options.searches_beams:
        return
    refused = []
    if options.stopping != "early":
        refused.append(("stopping", options.stopping, "early", "--stopping early"))
    if options.forced_eos:
        refused.append(("forced_eos", True, False, "--no-forced-eos"))
    if refused:
        given = ", ".join(f"{name}={value!r}" for name, value, _, _ in refused)
        wanted = ", ".join(f"{name}={value!r}" for name, _, value, _ in refused)
        flags = " ".join(flag for *_, flag in refused)
        raise ValueError(f"the ctranslate2 engine has one stopping rule, 'early' (a sentence "
                         f"ends when beam_size hypotheses have), and never forces the end "
                         f"token; got {given} (the run's search section, or the call's); "
                         f"pass {wanted} ({flags}) or use the keras engine")


def _sampling(temperature, top_k, top_p, seed):
    """CTranslate2's sampling arguments for our ``temperature`` / ``top_k`` / ``top_p``
    (each, and ``seed``, checked as for the Keras engine)."""
    top_k, top_p, _ = check_sampling(temperature, top_k, top_p, 0 if seed is None else seed)
    if temperature == 0:
        return dict(sampling_topk=1)
    return dict(sampling_topk=int(top_k or 0), sampling_topp=float(top_p or 1.0),
                sampling_temperature=float(temperature))


def _tokens_of(tokenizer):
    return [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
