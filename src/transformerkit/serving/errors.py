"""Every error of the HTTP API as JSON ``{"error": ..., "status": ...}`` that says what was
wrong: :class:`RequestError` for the routes' own refusals, and the handlers
(:func:`add_error_handlers`) that turn FastAPI's and Starlette's errors into the same shape.

Status codes: 400 body not JSON or not UTF-8, 415 a body not sent as ``Content-Type:
application/json`` (FastAPI reads JSON only from JSON requests: a browser form cannot post
to the API from another site), 422 an invalid request, 429 and 503 (with ``Retry-After``)
a full queue and a timeout, 500 a fault of the server.
"""

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException


class RequestError(Exception):
    """A request the server cannot serve: ``status`` and a message for the client."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def is_json_media_type(content_type):
    """Whether a ``Content-Type`` header names JSON (``application/json`` or
    ``application/*+json``, any parameters), as FastAPI decides to parse a body."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def error_response(status, message, details=None, headers=None):
    """The JSON answer of an error: ``{"error": message, "status": status}`` (+ details)."""
    body = {"error": message, "status": status}
    if details is not None:
        body["details"] = details
    return JSONResponse(body, status_code=status, headers=headers)


async def request_error(request, err):
    headers = {"Retry-After": "1"} if err.status in (429, 503) else None
    return error_response(err.status, str(err), headers=headers)


async def invalid_request(request: Request, err):
    """A body FastAPI could not read into the route's request model: 415, 400 or 422."""
    problems = err.errors()
    if any(tuple(problem.get("loc", ())) == ("body",) for problem in problems):
        content_type = request.headers.get("content-type")
        if not is_json_media_type(content_type):
            return error_response(415, "send the body as JSON with the header Content-Type: "
                                       f"application/json (got {content_type or 'none'})")
        return error_response(422, 'the body must be a JSON object, such as {"texts": ["..."]}')
    for problem in problems:
        if problem.get("type") == "json_invalid":
            reason = problem.get("ctx", {}).get("error", "")
            return error_response(400, f"the body is not valid JSON: {reason} at byte "
                                       f"{problem['loc'][-1]}")
    details = [{"field": ".".join(str(p) for p in problem["loc"][1:]) or "body",
                "problem": problem["msg"]} for problem in problems]
    message = "; ".join(f"{d['field']}: {d['problem']}" for d in details)
    return error_response(422, f"invalid request: {message}", details)


async def server_fault(request, err):  # logged by uvicorn with its traceback
    return error_response(500, f"internal error: {type(err).__name__}: {err}")


async def http_error(request, err):
    """Starlette's own errors (404 no such route, 405, 400 unreadable body) as JSON."""
    message = str(err.detail)
    if err.status_code == 400 and isinstance(err.__cause__, UnicodeDecodeError):
        cause = err.__cause__
        message = (f"the body is not valid UTF-8: byte {cause.object[cause.start]:#04x} at "
                   f"position {cause.start}; send UTF-8 encoded JSON")
    elif err.status_code == 400 and "parsing the body" in message:
        message = "the body could not be read as JSON: send UTF-8 encoded JSON"
    return error_response(err.status_code, message, headers=getattr(err, "headers", None))


def add_error_handlers(app):
    """Install the handlers above on ``app``."""
    app.add_exception_handler(RequestError, request_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(Exception, server_fault)
    app.add_exception_handler(HTTPException, http_error)
