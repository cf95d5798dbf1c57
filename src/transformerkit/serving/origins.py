"""The origins whose web pages may call the API from a browser (``--cors-origin``):
:func:`check_origins`, a light module so that ``serve`` checks them before anything heavy
is imported or started."""

import urllib.parse


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
