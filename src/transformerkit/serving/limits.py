"""What one request may ask of the server: :class:`Limits`, every bound in one place
(``transformerkit serve`` has an option per field).

``max_body_bytes`` is enforced by :class:`BodySizeLimit`, a pure ASGI middleware that counts
the bytes of a body as they arrive (``Content-Length`` or chunked) and answers a JSON 413 once
they pass the limit (Starlette's own ``RequestBodyLimitMiddleware`` answers plain text); the
other bounds by the routes.
"""

import json
from dataclasses import dataclass, field


def _limit(default, help_text):
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class Limits:
    """Bounds on requests and on the server's work (each field's ``metadata["help"]`` says
    what it bounds; ``transformerkit serve`` has an option per field, ``--max-texts`` ...).
    """

    max_texts: int = _limit(64, "texts in one /translate request")
    max_chars: int = _limit(1000, "characters in one text, prompt or source")
    max_new_tokens: int = _limit(256, "the largest max_new_tokens a request may ask for")
    max_beam_size: int = _limit(16, "the largest beam size or n-best")
    max_body_bytes: int = _limit(1 << 20, "bytes in one request body (more: 413)")
    queue_size: int = _limit(256, "requests waiting for the model (more: 429)")
    timeout: float = _limit(60.0, "seconds a request may wait and run (longer: 503)")
    batch_window_ms: float = _limit(10.0, "milliseconds a batch waits for more requests "
                                          "to share it")
    max_batch_texts: int = _limit(64, "texts in one model call")

    def __post_init__(self):
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"serving limit {name} must be positive, got {value!r}")


class BodySizeLimit:
    """ASGI middleware: a request body larger than ``max_bytes`` gets a 413 JSON error.

    A declared ``Content-Length`` over the limit is refused before anything is read;
    otherwise the bytes are counted chunk by chunk as the application reads them, and once
    they pass the limit the 413 is sent and the application is told the client has gone
    (what it answers then is dropped).
    """

    def __init__(self, app, max_bytes):
        self.app = app
        self.max_bytes = int(max_bytes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received = 0
        started = refused = False

        async def counting_receive():
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if not started and not refused:
                        await self._refuse(send)
                        refused = True
                    # the application stops reading, as if the client had gone
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            nonlocal started
            if refused:  # the 413 is the answer; drop what the application says after it
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counting_receive, guarded_send)

    async def _refuse(self, send):
        body = json.dumps({"error": f"the request body is larger than {self.max_bytes} bytes "
                                    "(--max-body-bytes)", "status": 413}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
