"""``transformerkit.load(run_dir)``: a trained run as an object that translates, generates
and shows its attention.

Example:
>>> run = transformerkit.load("runs/multi30k_de_en")
>>> run.translate("Ein Hund läuft im Schnee.")
'A dog is running in the snow.'
>>> run.translate(["Zwei Männer.", "Ein Kind."], beam_size=4, n_best=2)
[[('Two men.', -0.41), ('Two men .', -1.2)], [('A child.', -0.35), ...]]
>>> weights = run.attention("Ein Hund läuft.")   # cross- and self-attention per layer/head
"""

import os
import warnings

import numpy as np

from transformerkit.config import load_config
from transformerkit.run_directory import RunDirectory
from transformerkit.special_tokens import SPECIAL_TOKENS


def load(run_dir, runtime=None, **keywords):
    """Load a run directory written by ``transformerkit train`` (or ``import``).

    Args:
        run_dir: the run directory (holds ``config.yaml``, the tokenizer(s), ``model.keras``).
        runtime: a :class:`transformerkit.decoding.options.RuntimeOptions` (None: its
            defaults), or its fields as keywords in its place, each replacing its value:
            ``checkpoint`` (``"model"``: the final weights; ``"best"``: the best validation
            score, see ``train.early_stopping_metric``; ``"averaged"``: ``transformerkit
            average``; the name of a file in ``RUN/checkpoints`` or a ``.keras`` path),
            ``engine`` (``"keras"``, ``"compiled"`` or ``"ctranslate2"``), ``precision``
            (``float32``, ``bfloat16``, ``int8`` or ``auto``: see :meth:`Run.translate`),
            ``threads`` (0: the cores this process may use; N: N threads, which for the
            keras and compiled engines sets PyTorch's threads for the whole process:
            :mod:`transformerkit.threads`). They are the run's :attr:`Run.runtime`: what its
            calls use unless a call says otherwise.

    Returns a :class:`Run`.
    """
    from transformerkit.data.tokenizers import load_tokenizer
    from transformerkit.decoding.options import RuntimeOptions, resolve

    runtime = resolve(RuntimeOptions, runtime, keywords, "load()")
    run = RunDirectory(run_dir)
    if not os.path.isfile(run.config):
        raise FileNotFoundError(f"{run} is not a run directory: no config.yaml in it")
    config = load_config(run.config)
    model_file = run.model_file(runtime.checkpoint)
    if runtime.engine in _MODEL_ENGINES:  # first: the compiled packages are named by them
        from transformerkit.threads import use_torch_threads

        use_torch_threads(runtime.threads)
    # the CTranslate2 engine answers from a current export: the model is loaded (and Keras
    # imported) only when something needs it
    deferred = runtime.engine == "ctranslate2" and config.model.type in ("transformer", "gpt") \
        and _export_stands_for(run.path, model_file)
    # the compiled engine answers from the packages of the file's weights where they are
    # built: the model is loaded (and Keras imported) only when a batch needs it
    file_digest = _packages_file_digest(runtime, config, model_file)
    packaged = None if file_digest is None else _packaged_model(file_digest, runtime.precision)
    deferred = deferred or packaged is not None
    model = None if deferred else _load_model(model_file)
    if file_digest is not None and model is not None:  # the packages' names, for next time
        from transformerkit.decoding.aot_files import record

        record(file_digest, model)
    source_path, target_path = run.tokenizer_paths(
        shared=True if config.model.type == "gpt" else None)
    source_tokenizer = load_tokenizer(source_path)
    target_tokenizer = source_tokenizer if target_path == source_path else \
        load_tokenizer(target_path)
    # an encoder without a classifier head (an imported BERT) has no labels
    labels = run.read_labels() if getattr(model, "classifier", None) is not None else None
    loaded = Run(model, config, source_tokenizer, target_tokenizer, run.path, labels, runtime,
                 model_file=model_file)
    if packaged is not None:
        loaded.use_packages(packaged)
    elif deferred:  # found current by the file's digest just now: not computed again
        loaded._checked_export = _default_export(run.path)
    loaded.check_runtime(runtime)  # bfloat16/int8 where they cannot run: the error, now
    return loaded


def _load_model(model_file):
    """The Keras model of a ``.keras`` file, computing in float32 (a mixed_bfloat16-trained
    model decodes as chosen per call)."""
    from transformerkit.models.base import compute_in_float32
    from transformerkit.saving import load_model

    model = load_model(model_file, compile=False)
    compute_in_float32(model)
    return model


def _packages_file_digest(runtime, config, model_file):
    """The sha256 of the weights file (remembered by the file's identity: a 124M model's
    file takes 0.3 s to read), which names its compiled packages' record
    (:mod:`transformerkit.decoding.aot_files`), where the compiled engine may decode a
    translation or GPT run from them: PyTorch, a ``Transformer`` or ``GPT``, a file; else
    None."""
    from transformerkit.decoding.compiled import backend
    from transformerkit.files import remembered_sha256

    if runtime.engine != "compiled" or config.model.type not in ("transformer", "gpt") \
            or backend() != "torch" or not os.path.isfile(model_file):
        return None
    return remembered_sha256(model_file)


def _packaged_model(file_digest, precision):
    """The compiled engine's stand-in for the model of the file of sha256 ``file_digest``
    (:func:`~transformerkit.decoding.aot_files.packaged_model`), or None."""
    from transformerkit.decoding.aot_files import packaged_model
    from transformerkit.kernels.lowprec import resolve

    return packaged_model(file_digest, resolve(precision)[0])


def _export_stands_for(run_dir, model_file):
    """Whether the run's CTranslate2 export is current for ``model_file`` (by its digest)."""
    from transformerkit.export.ctranslate2_folders import stands_for_file

    return stands_for_file(_default_export(run_dir), run_dir, model_file)


def _default_export(run_dir):
    from transformerkit.export.ctranslate2_folders import default_export_dir

    return default_export_dir(run_dir)


class Run:
    """A trained model with its tokenizers and config.

    Attributes: ``model`` (a Keras ``Transformer``, ``GPT`` or ``Encoder``), ``config`` (the
    resolved :class:`~transformerkit.config.RunConfig`: ``config.train.epochs``, ...),
    ``source_tokenizer``, ``target_tokenizer`` (the same object for a shared vocabulary, a
    GPT or an encoder), ``run_dir``, ``kind`` ("transformer", "gpt" or
    "encoder"), ``labels`` (an encoder classifier's class names by class id, else None),
    ``runtime`` (a :class:`~transformerkit.decoding.options.RuntimeOptions`: the engine and
    precision its translations and generations use when a call names none, the
    CTranslate2 engine's threads, the weights loaded), ``precision`` (``runtime``'s),
    ``search`` (how it translates when a call names no option: its config's ``search:``
    section).
    """

    def __init__(self, model, config, source_tokenizer, target_tokenizer, run_dir=None,
                 labels=None, runtime=None, model_file=None):
        from transformerkit.decoding.options import RuntimeOptions

        self._model = None
        self._source = None  # (the .keras file, its weights' versions when loaded)
        self._checked_export = None  # the export load() found made from that file
        self._packaged = None  # the packages load() found made from that file's weights
        self._export_record = None  # (that folder, its metadata)
        if model is not None:
            self.model = model
        if model_file is not None:
            self._source = (os.fspath(model_file),
                            None if model is None else _versions(model))
        self.config = config
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.run_dir = run_dir
        self.kind = config.model.type
        self.labels = labels
        self.runtime = runtime or RuntimeOptions()

    @property
    def model(self):
        """The Keras model (a ``Transformer``, ``GPT`` or ``Encoder``). A run that
        :func:`load` gave the CTranslate2 engine with a current export loads it from its
        ``.keras`` file here, on first use."""
        if self._model is None and self._source is not None:
            path = self._source[0]
            self._model = _load_model(path)
            self._source = (path, _versions(self._model))
        return self._model

    @model.setter
    def model(self, model):
        self._model, self._source = model, None  # another model: no file stands for it
        self._checked_export = self._packaged = None

    def use_packages(self, packaged):
        """Translate and generate with the compiled engine from ``packaged`` (a
        :class:`~transformerkit.decoding.aot_files.PackagedModel` of the weights file) while
        the model is unloaded; where a batch needs the model, it loads it (:attr:`model`)."""
        self._packaged = packaged
        packaged.load = lambda: self.model

    def _decoding_model(self, engine):
        """What decodes for ``engine``: for the compiled engine while the model is unloaded,
        the packages its file stands for (:meth:`use_packages`); else the model."""
        if engine == "compiled" and self._model is None and self._packaged is not None:
            return self._packaged
        return self.model

    def checked_export(self):
        """The CTranslate2 export folder :func:`load` found made from the weights file (by
        its digest) while the model is still unloaded, so that the engine need not read
        the file again; else None."""
        return self._checked_export if self._model is None else None

    @property
    def max_length(self):
        """The longest sequence the model reads (``model.max_length``): while the model is
        unloaded, what its current export recorded (the model is not loaded for it)."""
        return self._exported("max_length") or self._unloaded("max_length") \
            or self.model.max_length

    def count_params(self):
        """The model's number of weights (``model.count_params()``), from its current
        export's record while the model is unloaded."""
        return self._exported("parameters") or self._unloaded("parameters") \
            or self.model.count_params()

    def _unloaded(self, key):
        """``key`` of the model from its packages' record while it is unloaded, else None."""
        return getattr(self._packaged, key, None) if self._model is None else None

    def _exported(self, key):
        folder = self.checked_export()
        if folder is None:
            return None
        if self._export_record is None or self._export_record[0] != folder:
            from transformerkit.export.ctranslate2_folders import read_metadata

            self._export_record = (folder, read_metadata(folder) or {})
        return self._export_record[1].get(key)

    def weights_file(self):
        """The ``.keras`` file the model's weights were loaded from, while they are those of
        the file: none written since (their in-place version counters, PyTorch's, as at
        loading; a model not loaded yet holds the file's). None for a model given
        otherwise, once a weight is written, or where the backend keeps no such counter."""
        if self._source is None:
            return None
        path, versions = self._source
        if self._model is None:
            return path
        if versions is None or None in versions or _versions(self._model) != versions:
            return None
        return path

    @property
    def precision(self):
        """The precision of the run's products unless a call says otherwise
        (``runtime.precision``)."""
        return self.runtime.precision

    def __repr__(self):
        return (f"Run({self.run_dir!r}, {self.config.model.type}, "
                f"{self.count_params():,} parameters)")

    def _require(self, kind, method):
        if self.kind != kind:
            raise TypeError(f"{method}() needs a {kind} run; {self.run_dir} holds model.type "
                            f"{self.kind}")

    # -- translation ------------------------------------------------------------------------
    def translate(self, texts, options=None, engine=None, precision=None, **keywords):
        """Translate one text (returns a str) or a list of texts (returns a list).

        Args:
            options: a :class:`transformerkit.decoding.SearchOptions` (None: the run's own,
                :attr:`search`), or its fields as keywords, each replacing the run's value:
                ``beam_size`` (1 = greedy), ``alpha`` and ``penalty`` (the length penalty),
                ``n_best`` (> 1 returns, per text, a list of ``(translation, score)`` pairs,
                best first; ``score`` = length-penalised log-probability),
                ``max_new_tokens``, ``batch_size``, ``stopping``, ``forced_eos``,
                ``renormalize``, ``max_len_a`` / ``max_len_b`` (the length cap),
                ``temperature`` (set: sample instead of searching, with ``top_k``, ``top_p``
                and ``seed``). Each field's default and meaning:
                ``transformerkit.decoding.options`` (the same for every engine, the command
                line and the HTTP server).
            engine: "keras" (this model), "compiled" (this model's decoder step compiled
                ahead of time, :mod:`transformerkit.decoding.aot_step`) or "ctranslate2"
                (the run's CTranslate2 export,
                written into the run directory on first use; see
                :mod:`transformerkit.export.runtime` for how the options map), or a
                ``transformerkit.export.runtime.CTranslate2Engine``; None: the run's
                (``runtime.engine``).
            precision: the products of the model's ``Dense`` layers in ``float32``,
                ``bfloat16`` (faster products where the CPU has AVX512-BF16 or AMX units;
                each within bfloat16 rounding), ``int8`` (dynamic quantization, per-channel
                weights) or ``auto`` (bfloat16 where the CPU has bfloat16 units, else
                float32: :mod:`transformerkit.precisions`); None: the run's
                (``runtime.precision``, float32 unless :func:`load` set it). The rest (softmax,
                LayerNorm, the search) stays float32; docs/decoding.md, "Precision".
                bfloat16 and int8 need the PyTorch backend with its fast paths and the keras
                engine (CTranslate2's is chosen at export: ``--quantization``).

        Empty texts raise ``ValueError``; texts longer than the model's ``max_length`` tokens
        are truncated with a warning.
        """
        from transformerkit.decoding.texts import as_text_list

        self._require("transformer", "translate")
        texts, single = as_text_list(texts)
        options = self.search_options(options, keywords, "translate()")
        engine, precision = self._call_runtime(engine, precision)
        if engine not in _MODEL_ENGINES:
            results = engine.translate(texts, options)
        else:
            from transformerkit.decoding.translate import translate_texts

            results = translate_texts(self._decoding_model(engine), self.source_tokenizer,
                                      self.target_tokenizer, texts, options, precision,
                                      _MODEL_ENGINES[engine])
        return results[0] if single else results

    def translate_batches(self, texts, options=None, engine=None, precision=None,
                          **keywords):
        """Like :meth:`translate` for a list, but returns an iterator of ``(indices,
        results)`` per batch, each as soon as it is decoded (used by the CLI to stream); the
        arguments are checked before it is returned."""
        self._require("transformer", "translate_batches")
        options = self.search_options(options, keywords, "translate_batches()")
        engine, precision = self._call_runtime(engine, precision)
        if engine not in _MODEL_ENGINES:
            return engine.translate_batches(texts, options)
        from transformerkit.decoding.translate import translate_batches

        return translate_batches(self._decoding_model(engine), self.source_tokenizer,
                                 self.target_tokenizer, texts, options, precision,
                                 _MODEL_ENGINES[engine])

    @property
    def search(self):
        """How this run translates unless a call says otherwise: its config's ``search:``
        section (:class:`~transformerkit.decoding.options.SearchOptions`): the declared
        defaults for a trained run, the checkpoint's generation settings for an imported
        one."""
        return self.config.search

    def search_options(self, options=None, keywords=None, what="translate()"):
        """The options a translation runs with: ``options`` (a ``SearchOptions``; None:
        :attr:`search`) with ``keywords`` (its fields) replacing its values; a clear error
        naming ``what`` for an unknown keyword or a value out of range."""
        from transformerkit.decoding.options import SearchOptions, resolve

        return resolve(SearchOptions, self.search if options is None else options,
                       keywords or {}, what)

    def _call_runtime(self, engine, precision):
        """``(engine, precision)`` of a call: ``"keras"`` or the CTranslate2 engine object,
        and the precision; each None is the run's (:attr:`runtime`), the pair checked by
        :class:`~transformerkit.decoding.options.RuntimeOptions` (a clear ``ValueError``
        for a bad name, or bfloat16/int8 with CTranslate2)."""
        given = False  # an engine object; a name needs no CTranslate2 (an optional extra)
        if engine is not None and not isinstance(engine, str):
            from transformerkit.export.runtime import CTranslate2Engine

            given = isinstance(engine, CTranslate2Engine)
        changes = {"engine": "ctranslate2" if given else engine, "precision": precision}
        runtime = self.runtime.replace(**{k: v for k, v in changes.items() if v is not None})
        self.check_runtime(runtime)
        if runtime.engine in _MODEL_ENGINES:
            return runtime.engine, runtime.precision
        return (engine if given else self._engine(runtime)), runtime.precision

    def check_runtime(self, runtime):
        """A clear ``ValueError`` now where ``runtime``'s precision cannot run here
        (bfloat16/int8 without the PyTorch backend's fast paths)."""
        if runtime.engine in _MODEL_ENGINES:
            from transformerkit.kernels.lowprec import resolve

            resolve(runtime.precision)

    # -- generation -------------------------------------------------------------------------
    def generate(self, prompt, options=None, engine=None, precision=None, **keywords):
        """Continue ``prompt`` (str) with a GPT run; returns prompt + continuation.

        ``options``: a :class:`transformerkit.decoding.GenerationOptions` (None: the run's
        own, :attr:`generation`), or its fields as keywords replacing the run's:
        ``max_new_tokens`` (200; None: ``max_length`` less the prompt, else until the
        context is full), ``temperature`` (1.0; 0 is greedy; an imported GPT-2's
        default is its generation config's: greedy unless ``do_sample``), ``top_k`` /
        ``top_p`` (restrict the draw), ``seed`` (the same seed gives the same text),
        ``no_repeat_ngram_size`` (no token n-gram twice, the prompt's
        counted), ``stop_at_eos``. An empty prompt raises ``ValueError``; a prompt longer
        than the model's ``max_length`` keeps its end, with a warning. ``engine``: as in
        :meth:`translate` (CTranslate2 generates within ``max_length`` tokens only, and
        without ``no_repeat_ngram_size``); ``precision``: as in :meth:`translate`.
        """
        options = self._generation_options(options, keywords, "generate")
        engine, precision = self._call_runtime(engine, precision)
        if engine not in _MODEL_ENGINES:
            return engine.generate(prompt, options)
        from transformerkit.decoding.sampling import generate_ids

        ids, eos_id = self._prompt_ids(prompt), self.source_tokenizer.eos_id
        new = generate_ids(self._decoding_model(engine), ids, options.new_tokens(len(ids)),
                           min_new_tokens=options.min_new_tokens,
                           temperature=options.temperature, top_k=options.top_k,
                           top_p=options.top_p, seed=options.seed,
                           eos_id=eos_id if options.stop_at_eos else None, precision=precision,
                           use_cache=_MODEL_ENGINES[engine],
                           no_repeat_ngram_size=options.no_repeat_ngram_size)
        return prompt + self.source_tokenizer.decode([i for i in new if i != eos_id])

    def generate_stream(self, prompt, options=None, engine=None, precision=None,
                        **keywords):
        """:meth:`generate`'s continuation while it is made: a generator of text pieces,
        each the new text since the last, empty where a token adds none (an end token, part
        of a character); ``prompt + "".join(pieces)`` is what :meth:`generate` returns with
        the same options, greedy and seeded sampling alike.

        The arguments are :meth:`generate`'s, checked before the generator is returned.
        Closing the generator (``pieces.close()``, or a ``for`` loop left with ``break`` once
        the generator is dropped) stops the decoding within one token. On PyTorch a piece
        comes per token; on JAX and TensorFlow, whose decoding loop is one compiled call,
        per chunk of a few tokens (:mod:`transformerkit.decoding.streaming`: the same text
        there too, up to a near-tie of two tokens' scores); with ``engine="ctranslate2"``
        per token, from ``Generator.generate_tokens``.

        Example:
        >>> for piece in run.generate_stream("To be", max_new_tokens=40, seed=1):
        ...     print(piece, end="", flush=True)
        """
        options = self._generation_options(options, keywords, "generate_stream")
        engine, precision = self._call_runtime(engine, precision)
        if engine not in _MODEL_ENGINES:
            return engine.generate_stream(prompt, options)
        from transformerkit.decoding.streaming import stream_ids
        from transformerkit.decoding.texts import text_pieces

        ids = self._prompt_ids(prompt)
        new_ids = stream_ids(self._decoding_model(engine), ids, options.new_tokens(len(ids)),
                             min_new_tokens=options.min_new_tokens,
                             temperature=options.temperature, top_k=options.top_k,
                             top_p=options.top_p, seed=options.seed,
                             eos_id=self.source_tokenizer.eos_id if options.stop_at_eos
                             else None, precision=precision,
                             use_cache=_MODEL_ENGINES[engine],
                             no_repeat_ngram_size=options.no_repeat_ngram_size)
        return text_pieces(self.source_tokenizer, new_ids)

    @property
    def generation(self):
        """How this GPT run continues a prompt unless a call says otherwise: its config's
        ``generation:`` section (:class:`~transformerkit.decoding.options.GenerationOptions`):
        the declared defaults for a trained run, the checkpoint's generation settings for an
        imported one (``converters/generation.py``)."""
        return self.config.generation

    def _generation_options(self, options, keywords, method):
        from transformerkit.decoding.options import GenerationOptions, resolve

        self._require("gpt", method)
        return resolve(GenerationOptions, self.generation if options is None else options,
                       keywords, f"{method}()")

    def _prompt_ids(self, prompt):
        """The ids of a generation's ``prompt`` (a non-empty str)."""
        from transformerkit.decoding.texts import check_text

        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        check_text(prompt, "the prompt")
        ids = self.source_tokenizer.encode(prompt)
        if not ids:
            raise ValueError("the prompt is empty: give at least one character or token")
        return ids

    def _engine(self, runtime):
        """The run's CTranslate2 engine with ``runtime``'s threads
        (:func:`~transformerkit.export.runtime.engine_for`)."""
        from transformerkit.export.runtime import engine_for

        return engine_for(self, runtime.threads)

    # -- encoders ---------------------------------------------------------------------------
    def classify(self, texts, probabilities=False, batch_size=64):
        """The class name of one text (a str) or of each text of a list, with an encoder
        classifier run. ``probabilities=True`` returns instead ``{class name: probability}``
        per text (the softmax of the class logits).

        Empty texts raise ``ValueError``; texts longer than the model's ``max_length`` tokens
        are cut, with a warning.
        """
        from transformerkit.decoding.classify import class_probabilities
        from transformerkit.decoding.texts import as_text_list

        self._require("encoder", "classify")
        if self.labels is None:
            raise TypeError(f"classify() needs a classifier run; {self.run_dir} holds an "
                            "encoder without a classifier head (use embed)")
        texts, single = as_text_list(texts)
        table = class_probabilities(self.model, self.source_tokenizer, texts,
                                    batch_size=batch_size)
        if probabilities:
            results = [{label: float(p) for label, p in zip(self.labels, row, strict=True)}
                       for row in table]
        else:
            results = [self.labels[i] for i in table.argmax(axis=-1)]
        return results[0] if single else results

    def embed(self, texts, pooling="mean", normalize=False, batch_size=64):
        """Sentence embeddings of an encoder run (or of a translation run's encoder): float32
        NumPy ``(d_model,)`` for one text, ``(len(texts), d_model)`` for a list.
        ``pooling``: "mean" over the real tokens or "cls" (the first token's state, an
        encoder's ``[BOS]``/``[CLS]``); ``normalize``: unit L2 norm. See
        :func:`transformerkit.decoding.classify.embed_texts`."""
        from transformerkit.decoding.classify import embed_texts

        if self.kind == "gpt":
            raise TypeError(f"embed() needs an encoder or a translation run; {self.run_dir} "
                            "holds a gpt")
        from transformerkit.decoding.texts import as_text_list

        texts, single = as_text_list(texts)
        vectors = embed_texts(self.model, self.source_tokenizer, texts, pooling=pooling,
                              batch_size=batch_size, normalize=normalize)
        return vectors[0] if single else vectors

    # -- attention --------------------------------------------------------------------------
    def score(self, sources, targets):
        """The model's log-probability ``log p(target | source)`` of each pair: the sum over
        the target's tokens and its end token of the log-softmax (one teacher-forced pass,
        ``decoding.scoring.sequence_log_probs``); a list of floats (a float for one pair).
        ``translate --scores`` prints it for each translation."""
        from transformerkit.data.padding import pad_batch
        from transformerkit.decoding.scoring import sequence_log_probs
        from transformerkit.decoding.texts import as_text_list, encode_sources

        self._require("transformer", "score")
        sources, single = as_text_list(sources)
        targets, single_target = as_text_list(targets)
        if single != single_target:
            raise TypeError("give one source and one target text, or a list of each")
        for i, target in enumerate(targets):
            if not isinstance(target, str):
                raise TypeError(f"target {i} is {type(target).__name__}, not str")
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        limit = self.model.max_length
        source_ids = pad_batch(encode_sources(sources, self.source_tokenizer, limit))
        outputs = [self.target_tokenizer.encode(t)[:limit - 1] for t in targets]
        scores = [float(s) for s in sequence_log_probs(self.model, source_ids, outputs)]
        return scores[0] if single else scores

    def attention(self, source, target=None):
        """Attention weights of every layer and head for one example, as NumPy.

        Transformer: ``source`` text and ``target`` text (default: the greedy translation).
        The decoder reads ``[BOS] + target`` and predicts ``target + [EOS]``. Returns::

            {"source_tokens": [...],          # source pieces + "</s>"
             "target_input_tokens": [...],    # "<s>" + target pieces (decoder queries read)
             "target_output_tokens": [...],   # target pieces + "</s>" (what each row predicts)
             "encoder": (layers, heads, src, src),
             "decoder_self": (layers, heads, tgt, tgt),
             "cross": (layers, heads, tgt, src)}

        GPT: ``source`` is the text; returns ``{"tokens": [...], "self": (layers, heads, len,
        len)}``.
        """
        if self.kind == "gpt":
            ids = self.source_tokenizer.encode(source)[: self.model.max_length]
            if not ids:
                raise ValueError("the text is empty")
            scores = self.model.attention_scores(np.array([ids], "int32"))
            return {"tokens": token_labels(self.source_tokenizer, ids),
                    "self": _stack(scores["self"])}
        self._require("transformer", "attention")
        from transformerkit.decoding.texts import encode_sources

        source_ids = encode_sources([source], self.source_tokenizer, self.model.max_length)[0]
        tgt = self.target_tokenizer
        if target is None:
            target = self.translate(source, beam_size=1,
                                    max_new_tokens=self.model.max_length - 1)
        target_ids = tgt.encode(target)[: self.model.max_length - 1]
        if len(tgt.encode(target)) > len(target_ids):
            warnings.warn("the target is longer than the model's max_length; truncated",
                          stacklevel=2)
        decoder_input = [tgt.bos_id] + target_ids
        scores = self.model.attention_scores(np.array([source_ids], "int32"),
                                             np.array([decoder_input], "int32"))
        return {"source_tokens": token_labels(self.source_tokenizer, source_ids),
                "target_input_tokens": token_labels(tgt, decoder_input),
                "target_output_tokens": token_labels(tgt, target_ids + [tgt.eos_id]),
                "encoder": _stack(scores["encoder"]),
                "decoder_self": _stack(scores["decoder_self"]),
                "cross": _stack(scores["cross"])}


def _stack(per_layer):
    """List of ``(1, heads, q, k)`` per layer -> ``(layers, heads, q, k)`` float32 NumPy."""
    from keras import ops

    return np.stack([ops.convert_to_numpy(s)[0] for s in per_layer]).astype("float32")


def _versions(model):
    from transformerkit.models.base import weight_versions

    return weight_versions(model)


# the engines that decode with the run's own model -> the step they take (make_steps' use_cache)
_MODEL_ENGINES = {"keras": True, "compiled": "compiled"}
SPECIAL_LABELS = dict(enumerate(SPECIAL_TOKENS))  # id -> "<pad>", "<s>", "</s>", "<unk>"


def token_labels(tokenizer, ids):
    """Readable labels for ids: each piece detokenized on its own, a leading space shown
    as "▁", special ids by name: the tokenizer's own special ids (an imported GPT-2's
    ``<|endoftext|>``; its ids 2 and 3 are ordinary tokens), else ids 0-3."""
    special = {int(getattr(tokenizer, f"{name}_id", i)): SPECIAL_LABELS[i]
               for i, name in enumerate(("pad", "bos", "eos", "unk"))}
    labels = []
    for i in ids:
        i = int(i)
        if i in special:
            spelled = getattr(tokenizer, "id_to_token", None)
            labels.append(spelled(i) if spelled is not None else special[i])
            continue
        text = tokenizer.decode([i])
        labels.append(text.replace(" ", "▁").replace("\n", "\\n") if text else "?")
    return labels
