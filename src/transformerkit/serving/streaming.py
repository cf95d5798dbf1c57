"""``POST /generate`` with ``"stream": true``: the continuation as server-sent events while
the model makes it.

The events (``text/event-stream``; each ``data`` is one line of JSON)::

    event: token             one per token (per chunk of tokens on JAX / TensorFlow):
    data: {"text": " the"}   the new text, "" where the token adds none yet
    ...
    event: done              last: the whole text, as the unstreamed answer's
    data: {"model": "poet", "text": "<prompt + continuation>"}

    event: error             instead of ``done`` when the generation fails once the
    data: {"error": "...", "status": 500}   stream has begun

The decoding runs as one job of the application's :class:`~.batching.Batcher`, so still one
model call at a time: the worker thread iterates ``Run.generate_stream`` (on PyTorch the
search itself runs on a thread of its own meanwhile,
:mod:`transformerkit.decoding.streaming`) and hands each piece to the event loop
(``loop.call_soon_threadsafe``). The response starts with the first piece: until then the
request can still fail as a plain JSON error (422 an input the model refuses, 429 queue
full, 503 no first piece within the server's ``--timeout``); from then on the timeout no
longer applies, since the length of a stream is bounded by its ``max_new_tokens``. A client
that goes away (Starlette cancels the response when the connection closes) sets a flag the
job reads between pieces: the decoding stops within a token or so and the worker takes the
next job.
"""

import asyncio
import json
import logging
import threading

from fastapi.responses import StreamingResponse

from transformerkit.serving.errors import RequestError

logger = logging.getLogger(__name__)
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering

EXAMPLE = ('event: token\ndata: {"text": "o"}\n\nevent: token\ndata: {"text": "r"}\n\n'
           'event: done\ndata: {"model": "poet", "text": "To be or"}\n\n')
OPENAPI_RESPONSE = {200: {
    "description": 'the prompt and its continuation; with "stream": true, server-sent '
                   'events: "token" ({"text": new text}) per piece, then "done" ({"model", '
                   '"text": the whole text}), or "error" ({"error", "status"}) if the '
                   'generation fails after the stream began',
    "content": {"text/event-stream": {"example": EXAMPLE, "schema": {  # one event
        "type": "object", "required": ["event", "data"],
        "properties": {"event": {"type": "string", "enum": ["token", "done", "error"]},
                       "data": {"type": "string", "description": "a JSON object"}}}}}}}


def event(name, data):
    """One server-sent event: ``event: NAME`` and ``data:`` the JSON of ``data``."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def stream_generation(submit, name, run, prompt, options, engine, record=None):
    """The ``StreamingResponse`` of a streamed ``/generate``, once its first piece is made.

    Args:
        submit: ``model_routes.submit`` bound to the batcher: ``submit(inputs, call,
            started=event)`` -> the job's outputs, its refusals as ``RequestError``.
        name, run: the model's name and its ``Run``; ``prompt`` and ``options`` (a
            ``GenerationOptions``) checked already; ``engine`` as ``Run.generate``'s.
        record: None, or ``record(prompt, text)``, called on the model's thread with the
            text made (what was streamed, to its end or to the client's leaving).

    Raises the job's ``RequestError`` when it fails before its first piece.
    """
    loop = asyncio.get_running_loop()
    pieces = asyncio.Queue()
    started = asyncio.Event()  # the first piece is out: the batcher's timeout ends
    gone = threading.Event()  # the client went away: the job stops

    def deliver(piece):  # on the event loop
        pieces.put_nowait(piece)
        started.set()

    def call(prompts):  # on the batcher's worker thread
        made = []
        generator = run.generate_stream(prompts[0], options, engine=engine)
        try:
            for piece in generator:
                if gone.is_set():
                    break
                made.append(piece)
                loop.call_soon_threadsafe(deliver, piece)
        finally:
            generator.close()  # stops the decoding
        text = prompts[0] + "".join(made)
        if record is not None:
            record(prompts[0], text)
        return [text]

    job = asyncio.ensure_future(submit([prompt], call, started=started))
    first = asyncio.ensure_future(started.wait())
    try:
        await asyncio.wait({job, first}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        gone.set()
        job.cancel()
        raise
    finally:
        first.cancel()
    if not started.is_set():  # the job failed (or ended without a piece): nothing streams
        gone.set()  # a job still running (past the timeout) stops
        job.result()  # raises the job's error as a plain JSON answer
    return StreamingResponse(_events(name, job, pieces, gone), media_type="text/event-stream",
                             headers=HEADERS)


async def _events(name, job, pieces, gone):
    """The events of a stream: its pieces as they come, then ``done`` (or ``error``)."""
    try:
        while True:
            while not pieces.empty():
                yield event("token", {"text": pieces.get_nowait()})
            if job.done():
                break
            waiting = asyncio.ensure_future(pieces.get())
            try:
                await asyncio.wait({job, waiting}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
            if waiting.done() and not waiting.cancelled():
                yield event("token", {"text": waiting.result()})
        try:
            (text,) = job.result()
        except RequestError as error:
            yield event("error", {"error": str(error), "status": error.status})
            return
        except Exception as error:  # a fault of the server, logged as uvicorn would
            logger.exception("the streamed generation failed")
            yield event("error", {"error": f"internal error: {type(error).__name__}: {error}",
                                  "status": 500})
            return
        yield event("done", {"model": name, "text": text})
    finally:  # the client went away, or the stream ended: the job stops
        gone.set()
        job.cancel()
