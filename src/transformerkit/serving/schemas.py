"""Request and response bodies of the HTTP API (pydantic models; FastAPI derives the OpenAPI
schema from them).

Requests are strict: a field of the wrong type is refused rather than converted ("4" is not
a beam size; 4.0 is, as JSON Schema's ``integer`` says), and an unknown field is refused
rather than ignored (a misspelt option would otherwise be silently left at its default); NaN
and infinities are not numbers here. The bounds that depend on the server's options
(:class:`~transformerkit.serving.limits.Limits`) and on the model (its ``max_length``) are
checked by the routes. The translation and
generation options are the fields of :mod:`transformerkit.decoding.options`, the same as the
command line's flags and ``Run.translate``'s keywords; a translation option a request leaves
out is the run's own (its config's ``search:`` or, for a GPT, ``generation:`` section: an
imported run searches as its checkpoint's generation config says), so the schema's defaults
are those of a trained run.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

from transformerkit.decoding.options import (
    GenerationOptions,
    SearchOptions,
    fields_of,
    optional,
    value_type,
)

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
_MODEL_FIELD = Field(None, description="the model's name (GET /models); default: the first "
                                       "that serves this route")


def _integral_number(value):
    """A float with no fraction as the int it is: JSON has one kind of number, and JSON
    Schema's ``integer`` (what the OpenAPI schema says) takes ``4.0``. Anything else is
    left to the strict check (``4.5``, ``"4"``, ``true`` are refused)."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value



def _option_fields(options_class, leave_out=()):
    """Pydantic fields for the fields of ``options_class`` (``decoding/options.py``): the
    same types, defaults, ranges, allowed values and meanings as the command line's flags."""
    found = {}
    for f in fields_of(options_class):
        if f.name in leave_out:
            continue
        meta = f.metadata
        kind = Literal[meta["choices"]] if meta["choices"] else value_type(f)
        integer = kind is int
        kind = kind | None if optional(f) else kind
        if integer:  # around the whole type, so the bounds stay on the integer (schema too)
            kind = Annotated[kind, BeforeValidator(_integral_number)]
        found[f.name] = (kind,
                         Field(f.default, ge=meta["minimum"], le=meta["maximum"],
                               gt=meta["above"], description=meta["help"]))
    return found


class _TranslateFields(BaseModel):
    model_config = _STRICT

    texts: list[str] = Field(min_length=1, description="source sentences, one per item")
    model: str | None = _MODEL_FIELD


# every SearchOptions field but batch_size (the server batches requests itself, --max-batch-texts)
TranslateRequest = create_model("TranslateRequest", __base__=_TranslateFields,
                                 **_option_fields(SearchOptions, leave_out=("batch_size",)))


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="length-penalised log-probability")


class TranslateResponse(BaseModel):
    model: str
    translations: list[str] = Field(description="the best translation of each text")
    n_best: list[list[Hypothesis]] | None = Field(
        None, description="with n_best > 1: per text, the n best, best first")


class _GenerateFields(BaseModel):
    model_config = _STRICT

    prompt: str = Field(min_length=1, description="text to continue")
    model: str | None = _MODEL_FIELD
    stream: bool = Field(False, description="answer with server-sent events "
                                            "(text/event-stream) while the text is made")


GenerateRequest = create_model("GenerateRequest", __base__=_GenerateFields,
                               **_option_fields(GenerationOptions))


class GenerateResponse(BaseModel):
    model: str
    text: str = Field(description="the prompt and its continuation")


AttentionKind = Literal["cross", "encoder", "decoder_self", "self"]


class AttentionRequest(BaseModel):
    model_config = _STRICT

    source: str = Field(min_length=1, description="source sentence (GPT: the text)")
    target: str | None = Field(None, description="target sentence (default: the model's "
                                                 "greedy translation)")
    model: str | None = _MODEL_FIELD
    kinds: list[AttentionKind] | None = Field(
        None, description="which attention: cross, encoder, decoder_self (Transformer), "
                          "self (GPT); default cross, or self for a GPT")


class AttentionResponse(BaseModel):
    model: str
    target: str | None = Field(None, description="the target the decoder read (Transformer)")
    source_tokens: list[str] | None = None
    target_input_tokens: list[str] | None = None
    target_output_tokens: list[str] | None = None
    tokens: list[str] | None = Field(None, description="GPT: the text's tokens")
    layers: int
    heads: int
    attention: dict[str, list[list[list[list[float]]]]] = Field(
        description="kind -> weights (layers, heads, queries, keys); cross: queries are the "
                    "target_input_tokens, keys the source_tokens")


class ErrorResponse(BaseModel):
    error: str = Field(description="what was wrong, and how to fix it")
    status: int
    details: list[dict] | None = None
