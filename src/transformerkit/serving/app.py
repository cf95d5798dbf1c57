"""The HTTP API over loaded runs: :func:`create_app`.

Routes (every error is a JSON ``{"error": ..., "status": ...}`` that says what was wrong):

- ``GET /``: the page (``page/index.html``, self-contained), the only file served;
- ``GET /health``, ``GET /models`` (each run's config summary and metrics);
- ``POST /translate``, ``POST /generate``, ``POST /attention`` (bodies: :mod:`.schemas`);
- ``GET /openapi.json``: the OpenAPI schema (no ``/docs``: its viewer loads from a CDN).

Browsers let a page call the API only from the server's own origin (its page at ``/``);
``cors_origins`` names other origins whose pages may (Starlette's ``CORSMiddleware``).

Model calls go through one :class:`~.batching.Batcher`: ``/translate`` requests for the same
model and search options share one ``Run.translate`` call; ``/generate`` and
``/attention`` run alone. Status codes: 404 unknown model, 413 body too large, 422 invalid
request (types, unknown fields, empty or too long texts, limits), 400 body not JSON or not
UTF-8, 415 a body not sent as ``Content-Type: application/json`` (FastAPI reads JSON only
from JSON requests: a browser form cannot post to the API from another site), 429 queue
full, 503 timeout.
"""

import contextlib
import importlib.resources
import json
import urllib.parse

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException

import transformerkit
from transformerkit.decoding.options import GenerationOptions, SearchOptions
from transformerkit.serving.batching import Batcher, QueueFull
from transformerkit.serving.limits import BodySizeLimit, Limits
from transformerkit.serving.schemas import (
    AttentionRequest,
    AttentionResponse,
    ErrorResponse,
    GenerateRequest,
    GenerateResponse,
    TranslateRequest,
    TranslateResponse,
)

ENGINES = ("keras", "ctranslate2")
# the page may run its own inline script and style and talk to this server, nothing else
PAGE_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'")
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 404, 413, 415, 422, 429, 503)}


class RequestError(Exception):
    """A request the server cannot serve: ``status`` and a message for the client."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def page_html():
    """The page's HTML (package data: ``transformerkit/serving/page/index.html``)."""
    page = importlib.resources.files("transformerkit.serving") / "page" / "index.html"
    return page.read_text(encoding="utf-8")


def run_summary(name, run, engine):
    """What ``GET /models`` says of one run: kind, size, config summary, metrics."""
    from transformerkit.run_directory import RunDirectory

    metrics = {}
    if run.run_dir is not None:
        with contextlib.suppress(OSError, ValueError):
            with open(RunDirectory(run.run_dir).metrics, encoding="utf-8") as f:
                metrics = json.load(f)
    data = run.config.data
    return {"name": name, "kind": run.kind, "engine": engine,
            "parameters": int(run.model.count_params()),
            "max_length": int(run.model.max_length),
            "model": {k: v for k, v in run.config.model.items() if v is not None},
            "data": {k: getattr(data, k) for k in ("dataset", "source_lang", "target_lang",
                                                   "tokenizer", "vocab_size")},
            "metrics": metrics}


def check_origins(origins):
    """``origins`` as a list if each is ``*`` or ``scheme://host[:port]`` (what a browser
    sends as ``Origin``), else a ``ValueError`` naming the bad one."""
    origins = list(origins or ())
    for origin in origins:
        if origin == "*":
            continue
        parts = urllib.parse.urlsplit(origin) if isinstance(origin, str) else None
        if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
                or origin != f"{parts.scheme}://{parts.netloc}" or parts.username):
            raise ValueError(f"CORS origin {origin!r} is not '*' or scheme://host[:port] "
                             "(for example https://app.example.com or http://localhost:3000)")
    return origins


def create_app(runs, limits=None, engine="keras", cors_origins=()):
    """A FastAPI application serving ``runs``.

    Args:
        runs: ``{name: transformerkit.api.Run}``; the first is the default model.
        limits: a :class:`~.limits.Limits` (default: its defaults).
        engine: "keras" or "ctranslate2", passed to ``Run.translate`` / ``Run.generate``
            (attention always comes from the Keras model).
        cors_origins: origins (``https://host[:port]``, or ``*`` for any) whose pages may
            call the API from a browser; none by default (the server's own page only).
    """
    if not runs:
        raise ValueError("create_app needs at least one run")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    cors_origins = check_origins(cors_origins)
    limits = limits or Limits()
    runs = dict(runs)
    summaries = [run_summary(name, run, engine) for name, run in runs.items()]
    page = page_html()
    batcher = Batcher(window_s=limits.batch_window_ms / 1000, max_batch=limits.max_batch_texts,
                      queue_size=limits.queue_size, timeout_s=limits.timeout)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="transformerkit", version=transformerkit.__version__,
                  description="Translate, generate and look at attention with trained runs.",
                  docs_url=None, redoc_url=None, lifespan=lifespan, responses=_ERRORS)
    app.state.batcher = batcher
    app.state.limits = limits
    app.add_middleware(BodySizeLimit, max_bytes=limits.max_body_bytes)
    if cors_origins:  # added last, so outermost: errors (413 too) carry its headers
        app.add_middleware(CORSMiddleware, allow_origins=cors_origins,
                           allow_methods=["GET", "POST"], allow_headers=["Content-Type"],
                           max_age=600)
    _add_error_handlers(app)

    def pick(name, kind, route):
        """``(name, run)`` of the requested model; ``kind`` None takes any kind."""
        if name is None:
            name = next(iter(runs))
        if name not in runs:
            raise RequestError(404, f"no model named {name!r}; this server has: "
                                    f"{', '.join(runs)} (GET /models)")
        run = runs[name]
        if kind is not None and run.kind != kind:
            other = "/generate" if run.kind == "gpt" else "/translate"
            raise RequestError(422, f"model {name!r} is a {run.kind} run; {route} needs a "
                                    f"{kind} run (use {other})")
        return name, run

    def check_text(text, what, run, target=False):
        """Refuse (422) an empty (unless ``target``), too long or non-Unicode text."""
        if not text.strip() and not target:
            raise RequestError(422, f"{what} is empty: send some text")
        if len(text) > limits.max_chars:
            raise RequestError(422, f"{what} has {len(text)} characters; this server takes at "
                                    f"most {limits.max_chars} (--max-chars)")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RequestError(422, f"{what} is not valid Unicode: lone surrogate "
                                    f"{text[err.start]!r} at character {err.start}") from None
        if run.kind != "transformer":  # a GPT keeps the end of a long prompt
            return
        tokenizer = run.target_tokenizer if target else run.source_tokenizer
        tokens = len(tokenizer.encode(text)) + 1  # + the end (source) or start (target) token
        if tokens > run.model.max_length:
            raise RequestError(422, f"{what} has {tokens} tokens (with the "
                                    f"{'start' if target else 'end'} token); the model takes "
                                    f"at most {run.model.max_length}: split it")

    def check_max_new_tokens(value):
        if value is not None and value > limits.max_new_tokens:
            raise RequestError(422, f"max_new_tokens={value} is more than this server allows "
                                    f"({limits.max_new_tokens}, --max-new-tokens)")

    async def submit(inputs, call, key=None):
        try:
            return await batcher.submit(inputs, call, key)
        except QueueFull as err:
            raise RequestError(429, str(err)) from None
        except TimeoutError as err:
            raise RequestError(503, str(err)) from None
        except (ValueError, TypeError) as err:  # the library's own checks of the input
            raise RequestError(422, str(err)) from None

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index():
        return HTMLResponse(page, headers={"Content-Security-Policy": PAGE_POLICY})

    @app.head("/health", include_in_schema=False)  # for monitors that probe with HEAD
    @app.get("/health")
    async def health():
        return {"status": "ok", "models": list(runs), "engine": engine,
                "waiting": len(batcher.waiting), "batches": batcher.batches}

    @app.get("/models")
    async def models():
        return {"default": next(iter(runs)), "models": summaries}

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True)
    async def translate(request: TranslateRequest):
        name, run = pick(request.model, "transformer", "/translate")
        if len(request.texts) > limits.max_texts:
            raise RequestError(422, f"{len(request.texts)} texts; this server takes at most "
                                    f"{limits.max_texts} per request (--max-texts)")
        for i, text in enumerate(request.texts):
            check_text(text, f"text {i}", run)
        check_max_new_tokens(request.max_new_tokens)
        fields = request.model_dump(exclude={"texts", "model"})
        if fields["temperature"] is None:  # sampling's options mean nothing to a search
            fields.update(top_k=None, top_p=None, seed=None)
        try:
            options = SearchOptions(batch_size=limits.max_batch_texts, **fields)
        except (TypeError, ValueError) as err:
            raise RequestError(422, str(err)) from None
        if options.width > limits.max_beam_size:
            raise RequestError(422, f"beam_size / n_best {options.width} is more than this "
                                    f"server allows ({limits.max_beam_size}, --max-beam-size)")
        # a seeded draw depends on what else is in its batch: it runs alone, reproducibly
        key = None if options.seed is not None else (name, options)

        def call(texts):
            return run.translate(texts, options, engine=engine)

        results = await submit(request.texts, call, key)
        if request.n_best == 1:
            return {"model": name, "translations": results}
        return {"model": name, "translations": [found[0][0] for found in results],
                "n_best": [[{"text": t, "score": float(s)} for t, s in found]
                           for found in results]}

    @app.post("/generate", response_model=GenerateResponse)
    async def generate(request: GenerateRequest):
        name, run = pick(request.model, "gpt", "/generate")
        check_text(request.prompt, "the prompt", run)
        check_max_new_tokens(request.max_new_tokens)

        try:
            options = GenerationOptions(**request.model_dump(exclude={"prompt", "model"}))
        except (TypeError, ValueError) as err:
            raise RequestError(422, str(err)) from None

        def call(prompts):
            return [run.generate(prompts[0], options, engine=engine)]

        (text,) = await submit([request.prompt], call)
        return {"model": name, "text": text}

    @app.post("/attention", response_model=AttentionResponse, response_model_exclude_none=True)
    async def attention(request: AttentionRequest):
        name, run = pick(request.model, None, "/attention")
        check_text(request.source, "the source", run)
        if request.target is not None:
            if run.kind == "gpt":
                raise RequestError(422, "a GPT run takes no target: send the text as source")
            check_text(request.target, "the target", run, target=True)
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

        ((target, weights),) = await submit([request.source], call)
        first = weights[kinds[0]]
        out = {"model": name, "target": target, "layers": first.shape[0],
               "heads": first.shape[1],
               "attention": {k: np.round(weights[k], 4).tolist() for k in kinds}}
        for key in ("source_tokens", "target_input_tokens", "target_output_tokens", "tokens"):
            if key in weights:
                out[key] = weights[key]
        return out

    return app


def is_json_media_type(content_type):
    """Whether a ``Content-Type`` header names JSON (``application/json`` or
    ``application/*+json``, any parameters), as FastAPI decides to parse a body."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def _add_error_handlers(app):
    def error(status, message, details=None, headers=None):
        body = {"error": message, "status": status}
        if details is not None:
            body["details"] = details
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(RequestError)
    async def request_error(request, err):
        headers = {"Retry-After": "1"} if err.status in (429, 503) else None
        return error(err.status, str(err), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err):
        problems = err.errors()
        if any(tuple(problem.get("loc", ())) == ("body",) for problem in problems):
            content_type = request.headers.get("content-type")
            if not is_json_media_type(content_type):
                return error(415, "send the body as JSON with the header Content-Type: "
                                  f"application/json (got {content_type or 'none'})")
            return error(422, 'the body must be a JSON object, such as {"texts": ["..."]}')
        for problem in problems:
            if problem.get("type") == "json_invalid":
                reason = problem.get("ctx", {}).get("error", "")
                return error(400, f"the body is not valid JSON: {reason} at byte "
                                  f"{problem['loc'][-1]}")
        details = [{"field": ".".join(str(p) for p in problem["loc"][1:]) or "body",
                    "problem": problem["msg"]} for problem in problems]
        message = "; ".join(f"{d['field']}: {d['problem']}" for d in details)
        return error(422, f"invalid request: {message}", details)

    @app.exception_handler(Exception)
    async def server_fault(request, err):  # logged by uvicorn with its traceback
        return error(500, f"internal error: {type(err).__name__}: {err}")

    @app.exception_handler(HTTPException)
    async def http_error(request, err):
        message = str(err.detail)
        if err.status_code == 400 and isinstance(err.__cause__, UnicodeDecodeError):
            cause = err.__cause__
            message = (f"the body is not valid UTF-8: byte {cause.object[cause.start]:#04x} at "
                       f"position {cause.start}; send UTF-8 encoded JSON")
        elif err.status_code == 400 and "parsing the body" in message:
            message = "the body could not be read as JSON: send UTF-8 encoded JSON"
        return error(err.status_code, message, headers=getattr(err, "headers", None))
