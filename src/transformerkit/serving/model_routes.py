"""The routes that call a model: ``POST /translate``, ``POST /generate``, ``POST /attention``
(bodies: :mod:`.schemas`; request checks: :mod:`.checks`).

Every model call goes through the application's :class:`~.batching.Batcher`: ``/translate``
requests for the same model and search options share one ``Run.translate`` call (a seeded
draw runs alone: what it draws depends on what else is in its batch); ``/generate`` and
``/attention`` run alone; a streamed ``/generate`` too (:mod:`.streaming`). The texts that
``/translate`` and ``/generate`` calls produce, and their tokens, are counted in the
application's metrics (:mod:`.metrics`) on the model's thread, right after the call:
re-encoding a batch's outputs (about 50 us a sentence with a BPE of 8000 pieces) stays off
the event loop.
"""

import functools

import numpy as np
from fastapi import APIRouter

from transformerkit.serving.batching import QueueFull
from transformerkit.serving.checks import (
    check_text,
    check_texts,
    generation_options,
    search_options,
)
from transformerkit.serving.dependencies import Metrics, ModelCalls, Registry, ServerLimits
from transformerkit.serving.errors import RequestError
from transformerkit.serving.schemas import (
    AttentionRequest,
    AttentionResponse,
    GenerateRequest,
    GenerateResponse,
    TranslateRequest,
    TranslateResponse,
)
from transformerkit.serving.streaming import OPENAPI_RESPONSE, stream_generation

router = APIRouter()


async def submit(batcher, inputs, call, key=None, started=None):
    """``call``'s outputs for ``inputs`` from ``batcher``; its refusals as HTTP errors: 429
    queue full, 503 timeout, 422 an input the library refused (``started``: as
    :meth:`~.batching.Batcher.submit`'s)."""
    try:
        return await batcher.submit(inputs, call, key, started)
    except QueueFull as err:
        raise RequestError(429, str(err)) from None
    except TimeoutError as err:
        raise RequestError(503, str(err)) from None
    except (ValueError, TypeError) as err:  # the library's own checks of the input
        raise RequestError(422, str(err)) from None


@router.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True)
async def translate(request: TranslateRequest, registry: Registry, batcher: ModelCalls,
                    limits: ServerLimits, metrics: Metrics):
    name, run = registry.pick(request.model, "transformer", "/translate")
    check_texts(request.texts, run, limits)
    options = search_options(request, limits, run)
    key = None if options.seed is not None else (name, options)

    def call(texts):
        results = run.translate(texts, options, engine=registry.engine)
        metrics.outputs(name, best_of(results, options), run.target_tokenizer)
        return results

    results = await submit(batcher, request.texts, call, key)
    if options.n_best == 1:
        return {"model": name, "translations": results}
    return {"model": name, "translations": best_of(results, options),
            "n_best": [[{"text": t, "score": float(s)} for t, s in found]
                       for found in results]}


def best_of(results, options):
    """The best translation of each text from ``Run.translate``'s ``results``."""
    return results if options.n_best == 1 else [found[0][0] for found in results]


@router.post("/generate", response_model=GenerateResponse, responses=OPENAPI_RESPONSE)
async def generate(request: GenerateRequest, registry: Registry, batcher: ModelCalls,
                   limits: ServerLimits, metrics: Metrics):
    name, run = registry.pick(request.model, "gpt", "/generate")
    check_text(request.prompt, "the prompt", run, limits)
    options = generation_options(request, limits, run)

    def record(prompt, text):  # on the model's thread, after the generation
        metrics.outputs(name, [text[len(prompt):]], run.source_tokenizer)  # prompt + new

    if request.stream:
        return await stream_generation(functools.partial(submit, batcher), name, run,
                                       request.prompt, options, registry.engine, record)

    def call(prompts):
        text = run.generate(prompts[0], options, engine=registry.engine)
        record(prompts[0], text)
        return [text]

    (text,) = await submit(batcher, [request.prompt], call)
    return {"model": name, "text": text}


@router.post("/attention", response_model=AttentionResponse, response_model_exclude_none=True)
async def attention(request: AttentionRequest, registry: Registry, batcher: ModelCalls,
                    limits: ServerLimits):
    name, run = registry.pick(request.model, None, "/attention")
    check_text(request.source, "the source", run, limits)
    if request.target is not None:
        if run.kind == "gpt":
            raise RequestError(422, "a GPT run takes no target: send the text as source")
        check_text(request.target, "the target", run, limits, target=True)
    allowed = ("self",) if run.kind == "gpt" else ("cross", "encoder", "decoder_self")
    kinds = list(dict.fromkeys(request.kinds or allowed[:1]))
    if not set(kinds) <= set(allowed):
        raise RequestError(422, f"a {run.kind} run has attention kinds "
                                f"{', '.join(allowed)}; got {', '.join(kinds)}")

    def call(sources):
        target = request.target
        if run.kind == "transformer" and target is None:
            target = run.translate(sources[0], beam_size=1,
                                   max_new_tokens=run.model.max_length - 1)
        return [(target, run.attention(sources[0], target))]

    ((target, weights),) = await submit(batcher, [request.source], call)
    first = weights[kinds[0]]
    out = {"model": name, "target": target, "layers": first.shape[0],
           "heads": first.shape[1],
           "attention": {k: np.round(weights[k], 4).tolist() for k in kinds}}
    for key in ("source_tokens", "target_input_tokens", "target_output_tokens", "tokens"):
        if key in weights:
            out[key] = weights[key]
    return out
