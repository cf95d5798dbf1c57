"""The checks of a request that its body's types cannot say: each refusal a
:class:`~.errors.RequestError` (422) naming the rule and how to meet it.

The options' own rules (types, ranges, combinations) are those of
:class:`~transformerkit.decoding.options.SearchOptions` and
:class:`~transformerkit.decoding.options.GenerationOptions`, checked by building them; a text's
emptiness and its Unicode by the decoders' ``check_text``. What is the server's own: the
bounds of :class:`~.limits.Limits`, and a text longer than the model's ``max_length`` is
refused, where the Python API would cut it with a warning.
"""

import dataclasses

from transformerkit.decoding.options import GenerationOptions, SearchOptions
from transformerkit.decoding.texts import check_text as decoders_check_text
from transformerkit.serving.errors import RequestError


def _options(options_class, fields):
    try:
        return options_class(**fields)
    except (TypeError, ValueError) as err:
        raise RequestError(422, str(err)) from None


def check_max_new_tokens(value, limits):
    if value is not None and value > limits.max_new_tokens:
        raise RequestError(422, f"max_new_tokens={value} is more than this server allows "
                                f"({limits.max_new_tokens}, --max-new-tokens)")


def search_options(request, limits, run):
    """The :class:`SearchOptions` of a ``TranslateRequest`` to ``run``: the run's own
    (``Run.search``: its config's ``search:`` section) with the fields the request sets,
    within ``limits`` (decoded in batches of up to ``max_batch_texts``)."""
    check_max_new_tokens(request.max_new_tokens, limits)
    given = request.model_dump(exclude={"texts", "model"}, exclude_unset=True)
    fields = {**dataclasses.asdict(run.search), **given}
    if fields["temperature"] is None:  # sampling's options mean nothing to a search
        fields.update(top_k=None, top_p=None, seed=None)
    options = _options(SearchOptions, {**fields, "batch_size": limits.max_batch_texts})
    if options.width > limits.max_beam_size:
        raise RequestError(422, f"beam_size / n_best {options.width} is more than this "
                                f"server allows ({limits.max_beam_size}, --max-beam-size)")
    return options


def generation_options(request, limits, run):
    """The :class:`GenerationOptions` of a ``GenerateRequest`` to ``run``: the run's own
    (``Run.generation``: its config's ``generation:`` section) with the fields the request
    sets, within ``limits``: a ``max_new_tokens`` the request asks for above the server's
    is refused, the run's own (a request that leaves it out) is held to it."""
    given = request.model_dump(exclude={"prompt", "model", "stream"}, exclude_unset=True)
    check_max_new_tokens(given.get("max_new_tokens"), limits)
    fields = {**dataclasses.asdict(run.generation), **given}
    if "max_new_tokens" not in given and fields["max_new_tokens"] is not None:
        fields["max_new_tokens"] = min(fields["max_new_tokens"], limits.max_new_tokens)
    return _options(GenerationOptions, fields)


def check_texts(texts, run, limits):
    """The ``texts`` of a ``/translate`` request: few enough, each one checked."""
    if len(texts) > limits.max_texts:
        raise RequestError(422, f"{len(texts)} texts; this server takes at most "
                                f"{limits.max_texts} per request (--max-texts)")
    for i, text in enumerate(texts):
        check_text(text, f"text {i}", run, limits)


def check_text(text, what, run, limits, target=False):
    """Refuse an empty (unless ``target``: a translation may be empty) or non-Unicode text,
    one of more than ``limits.max_chars`` characters, and, for a Transformer, one of more
    tokens than the model's ``max_length`` (a GPT keeps the end of a long prompt)."""
    try:
        decoders_check_text(text, what, empty=None if target else "send some text")
    except ValueError as err:
        raise RequestError(422, str(err)) from None
    if len(text) > limits.max_chars:
        raise RequestError(422, f"{what} has {len(text)} characters; this server takes at "
                                f"most {limits.max_chars} (--max-chars)")
    if run.kind != "transformer":
        return
    tokenizer = run.target_tokenizer if target else run.source_tokenizer
    tokens = len(tokenizer.encode(text)) + 1  # + the end (source) or start (target) token
    if tokens > run.max_length:
        raise RequestError(422, f"{what} has {tokens} tokens (with the "
                                f"{'start' if target else 'end'} token); the model takes "
                                f"at most {run.max_length}: split it")
