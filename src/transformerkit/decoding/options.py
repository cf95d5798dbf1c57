"""The search and sampling options, each declared once: its type, default, check and meaning.

:class:`SearchOptions` is how ``translate`` turns source sentences into target sentences
(greedy search, beam search, or sampling); :class:`GenerationOptions` how a GPT continues a
prompt. Everything that takes these options is derived from the declarations here, so an
option has one default everywhere:

- the ``translate``/``generate``/``evaluate`` command-line flags (:func:`flag_name`,
  ``cli/parser.py``);
- the keywords of ``Run.translate`` / ``Run.generate`` (:func:`from_keywords`);
- the request bodies of the HTTP server (``serving/schemas.py`` builds its pydantic models
  from :func:`fields_of`);
- the CTranslate2 runtime (``export/runtime.py``), which maps each option to its own argument.

Each field is declared with :func:`transformerkit.declared.option` (also the models' and
the run config's helper): its default, ``help``, range or choices, its command-line
``flag`` when that is not ``--`` + the name with dashes, and the ``label`` its errors call
it by (default: its name). Building an instance checks every value
(:func:`transformerkit.declared.check`; a ``TypeError`` or ``ValueError`` naming the
option): ints are ints (not bools), numbers are finite, each value is in its range.

The run config's ``search:`` section (``config/loading.py``) is a :class:`SearchOptions`:
a run's own default search (an imported checkpoint's generation settings), which the
command line, ``Run.translate`` and the server start from.

:class:`RuntimeOptions` says where a run computes (the engine, the precision of its
products, threads, which weights): the same flags, ``load``/``Run`` keywords, server
settings and docs table are made from it, and its checks hold the rules between them
(which precisions each engine takes).

Plain Python, no Keras, importing only the leaves :mod:`transformerkit.declared` and
:mod:`transformerkit.precisions`: the command line builds its parser from this module, and
the run config (a lower layer) reads it as a leaf.
"""

import dataclasses
import functools
from dataclasses import dataclass

from transformerkit.declared import check, nullable, option, value_type
from transformerkit.precisions import DECODE_PRECISIONS

optional = nullable  # the name the command line and the HTTP schemas import

STOPPING_RULES = ("early", "exact", "heuristic")
PENALTIES = ("gnmt", "power")


def check_field(f, value):
    """``value`` of field ``f`` checked and normalised (an int as ``float`` where a number is
    expected); a clear ``TypeError``/``ValueError`` naming the option (its ``label``, else
    its name) otherwise."""
    value, problem = check(f, value)
    if problem:
        raise problem.error(problem.message(f.metadata["label"] or f.name))
    return value


class _Checked:
    """Checks every field on construction (``__post_init__``) and offers :meth:`replace`."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, check_field(f, getattr(self, f.name)))

    def replace(self, **changes):
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class SearchOptions(_Checked):
    """How a ``Transformer`` translates: beam search (``beam_size`` > 1), greedy search
    (``beam_size`` 1) or sampling (``temperature`` set). Paper section 6.1: beam size 4,
    length penalty 0.6. ``penalty``, ``stopping``, ``forced_eos`` and ``renormalize`` also
    express ``transformers``' beam search (``length_penalty``, ``early_stopping``,
    ``forced_eos_token_id``, ``renormalize_logits``), so that an imported checkpoint
    searches as its generation config says."""

    beam_size: int = option(4, minimum=1, flag="--beam",
                            help="beam size; 1 = greedy search")
    # at most 10: ((5+len)/6)^alpha and len^alpha stay float32 for any length a model reads
    alpha: float = option(0.6, minimum=0.0, maximum=10.0, label="alpha (length penalty)",
                          help="length penalty exponent of beam search: a finished "
                               "hypothesis scores log p / penalty(len) (see penalty)")
    penalty: str = option("gnmt", choices=PENALTIES,
                          help="the length penalty's form: gnmt = ((5+len)/6)^alpha (Wu et "
                               "al. 2016), power = len^alpha (transformers' and "
                               "CTranslate2's length_penalty); len counts the end token")
    n_best: int = option(1, minimum=1, help="return the n best translations with their scores "
                                            "(beam search; the beam widens to n)")
    max_new_tokens: int | None = option(None, minimum=1, help="longest translation in tokens "
                                                              "(none: the model's max_length)")
    min_new_tokens: int = option(0, minimum=0,
                                 help="the end token is not chosen before this many tokens "
                                      "(transformers' min_new_tokens, CTranslate2's "
                                      "min_decoding_length)")
    no_repeat_ngram_size: int = option(0, minimum=0,
                                       help="no n-gram of this many tokens occurs twice in an "
                                            "output (0: off; fairseq's --no-repeat-ngram-size, "
                                            "transformers' and CTranslate2's "
                                            "no_repeat_ngram_size)")
    batch_size: int = option(64, minimum=1, help="sentences decoded together")
    stopping: str = option("early", choices=STOPPING_RULES,
                           help="when a sentence's beam search ends: early = once beam_size "
                                "hypotheses have ended (CTranslate2's rule, transformers' "
                                "early_stopping=True), exact = when no live beam can win "
                                "(transformers' 'never'), heuristic = when no live beam, "
                                "scored at its current length, beats beam_size ended ones "
                                "(transformers' default, early_stopping=False); exact and "
                                "heuristic: keras engine only")
    forced_eos: bool = option(False, help="the last token a length cap allows is the end "
                                          "token, with log-probability 0 (transformers' "
                                          "forced_eos_token_id)")
    renormalize: bool = option(False, help="beam search rules PAD and BOS out before the "
                                           "softmax, so the other tokens' probabilities sum "
                                           "to 1 (transformers' renormalize_logits; "
                                           "CTranslate2 always does); false: after it")
    max_len_a: float | None = option(1.2, minimum=0.0,
                                     help="each output has at most max_len_a * source tokens "
                                          "+ max_len_b tokens (none: no cap)")
    max_len_b: int | None = option(10, minimum=0, help="see max_len_a (none: no cap)")
    temperature: float | None = option(None, minimum=0.0,
                                       help="sample instead of searching, at this temperature "
                                            "(0 = greedy)")
    top_k: int | None = option(None, minimum=1, help="sampling: draw from the k likeliest "
                                                     "tokens")
    top_p: float | None = option(None, above=0.0, maximum=1.0,
                                 help="sampling: draw from the smallest set of tokens of this "
                                      "probability mass (nucleus)")
    seed: int | None = option(None, help="sampling: the same seed gives the same output")

    def __post_init__(self):
        super().__post_init__()
        if self.temperature is not None and self.n_best > 1:
            raise ValueError(f"n_best={self.n_best} lists come from beam search; sampling "
                             "(temperature set) gives one translation per text")
        a, b = self.max_len_a, self.max_len_b
        if (a is not None or b is not None) and (a or 0.0) + (b or 0) < 1:
            raise ValueError(f"max_len_a={a} with max_len_b={b} allow no output token; "
                             "their sum must be at least 1 (both none: no cap)")

    @property
    def width(self):
        """Hypotheses a beam search keeps: ``max(beam_size, n_best)``."""
        return max(self.beam_size, self.n_best)

    @property
    def samples(self):
        """Whether this is sampling (``temperature`` set) rather than a search."""
        return self.temperature is not None

    @property
    def searches_beams(self):
        """Whether this is a beam search (more than one hypothesis) rather than greedy."""
        return not self.samples and self.width > 1


@dataclass(frozen=True, kw_only=True)
class GenerationOptions(_Checked):
    """How a ``GPT`` continues a prompt: sampling at ``temperature`` (0 = greedy)."""

    max_new_tokens: int | None = option(200, minimum=1,
                                        help="tokens to generate (none: max_length's, else "
                                             "until the context is full)")
    max_length: int | None = option(None, minimum=1,
                                    help="where max_new_tokens is none: the most tokens of "
                                         "prompt and continuation together (transformers' "
                                         "max_length of a decoder-only model; a longer "
                                         "prompt is an error); none: no such cap")
    min_new_tokens: int = option(0, minimum=0,
                                 help="the end-of-text token is not chosen before this many "
                                      "new tokens")
    temperature: float = option(1.0, minimum=0.0, help="sampling temperature; 0 = greedy")
    top_k: int | None = option(None, minimum=1, help="draw from the k likeliest tokens")
    top_p: float | None = option(None, above=0.0, maximum=1.0,
                                 help="draw from the smallest set of tokens of this "
                                      "probability mass (nucleus)")
    no_repeat_ngram_size: int = option(0, minimum=0,
                                       help="no n-gram of this many tokens occurs twice in the "
                                            "text, prompt included (0: off; within the "
                                            "context window when generating beyond it)")
    seed: int | None = option(None, help="the same seed gives the same text")
    stop_at_eos: bool = option(True, help="stop at the end-of-text token")

    def new_tokens(self, prompt_length):
        """The most new tokens after a prompt of ``prompt_length`` tokens: ``max_new_tokens``
        where it is set, else ``max_length`` less the prompt, else None (until the context
        is full). A ``ValueError`` where the prompt alone fills ``max_length`` (as
        ``transformers``' ``generate`` raises)."""
        if self.max_new_tokens is not None or self.max_length is None:
            return self.max_new_tokens
        if prompt_length >= self.max_length:
            raise ValueError(f"the prompt has {prompt_length} tokens and max_length is "
                             f"{self.max_length} (prompt and continuation together): leaves "
                             "no new token; set max_new_tokens or a larger max_length")
        return self.max_length - prompt_length


ENGINES = ("keras", "compiled", "ctranslate2")
# the precisions the CTranslate2 engine takes at run time: its own is chosen at export
CTRANSLATE2_PRECISIONS = ("float32", "auto")


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions(_Checked):
    """Where and how a run computes its translations and generations: the engine, the
    precision of the keras engine's products, the CTranslate2 engine's threads, and which
    weights are loaded. ``transformerkit.load(run_dir, **fields)``, the ``translate`` /
    ``generate`` / ``evaluate`` / ``serve`` flags and the server's settings are made from
    these declarations."""

    engine: str = option("keras", choices=ENGINES,
                         help="keras: the run's model; compiled: its decoder step compiled "
                              "ahead of time by AOTInductor (PyTorch; built on first use, "
                              "cached on disk); ctranslate2: the run's CTranslate2 export "
                              "(RUN/ctranslate2, written on first use)")
    precision: str = option("float32", choices=DECODE_PRECISIONS,
                            help="the Dense products of the keras and compiled engines: "
                                 "float32, bfloat16 (faster products on CPUs with AVX512-BF16 "
                                 "or AMX), int8 (int8 weights; each input row quantized too, "
                                 "except in the compiled engine's steps of 1-4 rows) or auto "
                                 "(bfloat16 where the CPU has bfloat16 "
                                 "units, else float32); CTranslate2's is chosen at export")
    threads: int = option(0, minimum=0,
                          help="CPU threads of every engine: 0, the cores this process may "
                               "use (its CPU affinity); N sets PyTorch's threads (keras and "
                               "compiled engines) or CTranslate2's intra_threads")
    checkpoint: str = option("model",
                             help="which weights: model (the final ones), best (best "
                                  "validation score), averaged (transformerkit average), a "
                                  "file in RUN/checkpoints or a .keras path")

    def __post_init__(self):
        super().__post_init__()
        if self.engine == "ctranslate2" and self.precision not in CTRANSLATE2_PRECISIONS:
            raise ValueError(f"precision {self.precision} applies to the keras engine; "
                             "CTranslate2's precision is chosen at export (transformerkit "
                             "export --quantization)")
        if not self.checkpoint:
            raise ValueError("checkpoint must name the weights: model, best, averaged, a file "
                             "in RUN/checkpoints or a .keras path")


def fields_of(options_class):
    """The declared fields of :class:`SearchOptions` or :class:`GenerationOptions`."""
    return dataclasses.fields(options_class)


def flag_name(f):
    """The command-line flag of field ``f``: ``--beam`` for ``beam_size``, else
    ``--max-new-tokens`` for ``max_new_tokens``."""
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def from_keywords(options_class, keywords, what):
    """``options_class(**keywords)``, with an unknown keyword named as an error of ``what``
    (``"translate()"``) and the options it does take."""
    names = {f.name for f in dataclasses.fields(options_class)}
    unknown = sorted(set(keywords) - names)
    if unknown:
        raise TypeError(f"{what} got unknown option(s) {', '.join(unknown)}; the options are "
                        f"{', '.join(sorted(names))}")
    try:  # each value with its type: True and 1 (equal, of one hash) are checked apart
        key = tuple(sorted((name, type(value), value) for name, value in keywords.items()))
        return _checked_options(options_class, key)
    except TypeError as error:  # an unhashable value: checked (and reported) uncached
        if "unhashable" not in str(error):
            raise
    return options_class(**keywords)


@functools.lru_cache(maxsize=256)
def _checked_options(options_class, key):
    """``options_class(**keywords)`` for ``key`` (:func:`from_keywords`), made once: the
    options are frozen, and checking every field took about 0.1 ms, a tenth of a one-word
    compiled translation's host work. A value that fails its check raises every time (an
    exception is not cached)."""
    return options_class(**{name: value for name, _, value in key})


def resolve(options_class, options, keywords, what):
    """The options a call runs with: ``options`` (an instance of ``options_class``, or None
    for the declared defaults) with ``keywords`` (field names) replacing its values; an
    unknown keyword or a value out of range is a clear error naming ``what``."""
    if options is None:
        return from_keywords(options_class, keywords, what)
    if not isinstance(options, options_class):
        raise TypeError(f"{what}: options must be a {options_class.__name__}, got "
                        f"{type(options).__name__}")
    if not keywords:
        return options
    return from_keywords(options_class, {**dataclasses.asdict(options), **keywords}, what)


def markdown_reference(options_class):
    """A Markdown table of ``options_class``'s fields: the command-line flag, the keyword
    (``Run.translate`` / ``Run.generate``, the HTTP request field), the type with its
    allowed values, the default and the meaning. ``docs/decoding.md`` embeds the tables of
    :class:`SearchOptions` and :class:`GenerationOptions`, and a test checks that they are
    this text, so the documentation says what the code declares."""
    rows = ["| flag | keyword | type | default | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(options_class):
        default = ("none" if f.default is None else str(f.default).lower()
                   if isinstance(f.default, bool) else f.default)
        flag = f"`{flag_name(f)}`"
        if value_type(f) is bool:  # argparse's BooleanOptionalAction: --x / --no-x
            flag += f", `--no-{flag_name(f)[2:]}`"
        rows.append(f"| {flag} | `{f.name}` | {_allowed(f)} | `{default}` | "
                    f"{f.metadata['help']} |")
    return "\n".join(rows) + "\n"


def _allowed(f):
    """``int >= 1``, ``number in (0, 1]``, ``early | exact``; ``, or none`` when None is
    allowed."""
    meta, kind = f.metadata, value_type(f)
    if meta["choices"] is not None:
        text = " \\| ".join(f"`{choice}`" for choice in meta["choices"])
    else:
        text = {int: "int", float: "number", str: "string", bool: "true/false"}[kind]
        low, high, above = meta["minimum"], meta["maximum"], meta["above"]
        if high is not None:
            left = f"({above:g}" if above is not None else f"[{low:g}"
            text += f" in {left}, {high:g}]"
        elif above is not None:
            text += f" > {above:g}"
        elif low is not None:
            text += f" >= {low:g}"
    return text + (", or none" if optional(f) else "")
