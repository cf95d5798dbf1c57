"""Request and response bodies of the HTTP API (pydantic models; FastAPI derives the OpenAPI
schema from them).

Requests are strict: a field of the wrong type is refused rather than converted ("4" is not
a beam size), and an unknown field is refused rather than ignored (a misspelt option would
otherwise be silently left at its default); NaN and infinities are not numbers here. The
bounds that depend on the server's options (:class:`~transformerkit.serving.limits.Limits`)
and on the model (its ``max_length``) are checked by the routes.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
_MODEL_FIELD = Field(None, description="the model's name (GET /models); default: the first")


class TranslateRequest(BaseModel):
    model_config = _STRICT

    texts: list[str] = Field(min_length=1, description="source sentences, one per item")
    model: str | None = _MODEL_FIELD
    beam_size: int = Field(4, ge=1, description="1 = greedy search; more = beam search")
    alpha: float = Field(0.6, ge=0.0, le=10.0, description="GNMT length penalty of beam search")
    n_best: int = Field(1, ge=1, description="more than 1: also return the n best "
                                             "translations with their scores")
    max_new_tokens: int | None = Field(None, ge=1, description="longest translation in "
                                                               "tokens (default: the model's)")
    temperature: float | None = Field(None, ge=0.0, description="set: sample instead of "
                                                                "searching (0 = greedy)")
    top_k: int | None = Field(None, ge=1, description="sampling: draw from the k likeliest")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="sampling: nucleus mass")
    seed: int | None = Field(None, ge=0, description="sampling: the same seed gives the same "
                                                     "output")


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="length-penalised log-probability")


class TranslateResponse(BaseModel):
    model: str
    translations: list[str] = Field(description="the best translation of each text")
    n_best: list[list[Hypothesis]] | None = Field(
        None, description="with n_best > 1: per text, the n best, best first")


class GenerateRequest(BaseModel):
    model_config = _STRICT

    prompt: str = Field(min_length=1, description="text to continue")
    model: str | None = _MODEL_FIELD
    max_new_tokens: int = Field(100, ge=1)
    temperature: float = Field(1.0, ge=0.0, description="0 = greedy")
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, description="the same seed gives the same text")


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
