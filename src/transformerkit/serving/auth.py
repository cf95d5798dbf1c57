"""Who may call the server: API keys, sent as ``Authorization: Bearer KEY``.

- :class:`BearerAuth`, a pure ASGI middleware: when keys are set, every request but those
  for the open paths (``/health``, which monitors probe, and ``/``, the page, which holds no
  data and must load in a browser to ask for the key) needs one of the keys, else a 401;
- :func:`read_keys`: the keys of ``--api-key`` values and of the ``TRANSFORMERKIT_API_KEYS``
  environment variable (a file with one key per line, or a comma-separated list), checked
  (:func:`check_keys`);
- :func:`keys_for_host`: the keys ``transformerkit serve`` uses, refusing to listen
  beyond this machine with none unless ``--no-auth`` says so; it runs before any model loads.

A key is printable ASCII without spaces (``!`` to ``~``) and at least
:data:`MIN_KEY_LENGTH` characters long (``secrets.token_urlsafe(32)`` makes a good one).
Errors name where a bad key came from, never the key itself.
"""

import hmac
import ipaddress
import json
import os

ENV_VAR = "TRANSFORMERKIT_API_KEYS"
MIN_KEY_LENGTH = 16
OPEN_PATHS = frozenset({"/", "/health"})
REFUSAL = "this server needs an API key: send the header Authorization: Bearer KEY"
_CHALLENGE = b'Bearer realm="transformerkit"'
_MAKE_ONE = "python -c \"import secrets; print(secrets.token_urlsafe(32))\" makes one"


class BearerAuth:
    """ASGI middleware: a request outside :data:`OPEN_PATHS` passes only with the header
    ``Authorization: Bearer KEY`` for one of ``keys``; otherwise a 401 JSON error with
    ``WWW-Authenticate: Bearer realm="transformerkit"``, the same answer whether the header
    is missing, malformed or holds a wrong key.

    The scheme is matched without regard to case, followed by exactly one space and the key
    (RFC 6750's form); a request with several ``Authorization`` headers is refused. The
    sent key is compared with every key by ``hmac.compare_digest``, without stopping at a
    match, so the time taken tells neither which key matched nor how much of one did (only
    whether the lengths differ).
    WebSocket connections need a key too (refused with close code 1008).
    """

    def __init__(self, app, keys):
        self.app = app
        self.keys = tuple(key.encode("ascii") for key in check_keys(keys, "api_keys"))
        if not self.keys:
            raise ValueError("BearerAuth needs at least one key")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan" or scope["path"] in OPEN_PATHS or self.allows(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await _refuse(send)

    def allows(self, scope):
        """Whether the request's headers carry one of the keys."""
        sent = [value for name, value in scope.get("headers") or () if name == b"authorization"]
        token = b""
        if len(sent) == 1 and sent[0][:7].lower() == b"bearer ":
            token = sent[0][7:]
        matched = False
        for key in self.keys:  # every key, always
            matched |= hmac.compare_digest(token, key)
        return matched


def document_keys(app):
    """Say in ``app``'s OpenAPI schema that its routes but the open ones need a key: an HTTP
    bearer security scheme, required by each such operation, which may answer 401."""
    build = app.openapi

    def openapi():
        if app.openapi_schema is None:
            schema = build()  # FastAPI's schema, kept in app.openapi_schema
            schema.setdefault("components", {})["securitySchemes"] = {
                "apiKey": {"type": "http", "scheme": "bearer",
                           "description": "Authorization: Bearer KEY"}}
            for path, operations in schema["paths"].items():
                if path in OPEN_PATHS:
                    continue
                for operation in operations.values():
                    operation["security"] = [{"apiKey": []}]
                    operation.setdefault("responses", {})["401"] = {
                        "description": "no API key, or a wrong one",
                        "content": {"application/json": {
                            "schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
            return schema  # kept by the builder once it is final (the runs loaded)
        return app.openapi_schema

    app.openapi = openapi


async def _refuse(send):
    body = json.dumps({"error": REFUSAL, "status": 401}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", _CHALLENGE)]})
    await send({"type": "http.response.body", "body": body})


def check_keys(keys, source):
    """``keys`` as a tuple of strings without repeats if each is a key (printable ASCII, no
    space, at least :data:`MIN_KEY_LENGTH` characters), else a ``ValueError`` naming
    ``source`` and the key's place (never the key)."""
    if isinstance(keys, (str, bytes)):
        raise ValueError(f"{source}: expected a list of keys, got one {type(keys).__name__}")
    checked = []
    for number, key in enumerate(keys, 1):
        where = f"{source}: key {number}" if len(keys) > 1 else f"{source}: the key"
        if not isinstance(key, str):
            raise ValueError(f"{where} is a {type(key).__name__}, not a string")
        bad = next((c for c in key if not "!" <= c <= "~"), None)
        if bad is not None:
            raise ValueError(f"{where} holds {bad!r} at position {key.index(bad) + 1}; a key "
                             "is printable ASCII without spaces")
        if len(key) < MIN_KEY_LENGTH:
            raise ValueError(f"{where} has {len(key)} characters; use at least "
                             f"{MIN_KEY_LENGTH} ({_MAKE_ONE})")
        if key not in checked:
            checked.append(key)
    return tuple(checked)


def read_keys(api_keys=(), environ=None):
    """The checked keys of ``api_keys`` (the ``--api-key`` values) and of
    ``environ[TRANSFORMERKIT_API_KEYS]`` (``os.environ`` by default), in that order.

    The variable is the path of an existing file (one key per line; blank lines and lines
    starting with ``#`` are skipped), else a comma-separated list of keys. A value that
    starts like a path (``/``, ``./``, ``../``, ``~``) but names no file is an error, so a
    mistyped path never becomes a key; an empty value counts as unset.
    """
    environ = os.environ if environ is None else environ
    keys = list(check_keys(list(api_keys or ()), "--api-key"))
    value = environ.get(ENV_VAR, "").strip()
    if not value:
        return tuple(keys)
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        source = f"{ENV_VAR} (file {value})"
        try:
            with open(path, encoding="utf-8") as lines:
                found = [line.strip() for line in lines]
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{source}: cannot read the keys: {err}") from None
        found = [line for line in found if line and not line.startswith("#")]
        if not found:
            raise ValueError(f"{source} holds no key (one key per line; # starts a comment)")
    elif value.startswith(("/", "./", "../", "~")):
        raise ValueError(f"{ENV_VAR} names no file: {value} (set it to a file with one key "
                         "per line, or to a comma-separated list of keys)")
    else:
        source = ENV_VAR
        found = [key.strip() for key in value.split(",")]
        if "" in found:
            raise ValueError(f"{ENV_VAR} has an empty item; separate keys by single commas")
    return tuple(dict.fromkeys(keys + list(check_keys(found, source))))


def is_loopback(host):
    """Whether ``host`` is this machine only: ``localhost``, 127.0.0.0/8 or ``::1``."""
    host = host.strip().strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # another host name, or 0.0.0.0 and the like
        return False


def keys_for_host(host, api_keys=(), no_auth=False, environ=None):
    """The keys ``transformerkit serve`` checks on ``host``: those of :func:`read_keys`;
    none with ``no_auth``. A ``ValueError`` for keys together with ``no_auth``, and for no
    key on a host other than loopback (:func:`is_loopback`) without ``no_auth``: anyone who
    can reach that address could use the models."""
    keys = read_keys(api_keys, environ)
    if no_auth and keys:
        raise ValueError(f"--no-auth serves without keys, but --api-key or {ENV_VAR} sets "
                         "some: drop one of them")
    if not keys and not no_auth and not is_loopback(host):
        raise ValueError(f"--host {host} lets other machines call the server, and no API key "
                         f"is set: set one with --api-key KEY or {ENV_VAR} (a file with one "
                         "key per line, or a comma-separated list), or pass --no-auth to serve "
                         "without keys")
    return keys
