"""``transformerkit serve``: trained runs behind an HTTP JSON API, with a web page.

- :mod:`~transformerkit.serving.limits`: what one request may ask for, and the middleware
  that refuses bodies over the size limit (413) by counting their bytes;
- :mod:`~transformerkit.serving.batching`: requests that arrive together share one model
  call (a short collection window, a maximum batch size), one batch at a time on a worker
  thread, behind a bounded queue (429 when full) and a per-request timeout (503);
- :mod:`~transformerkit.serving.auth`: who may call the server: API keys sent as
  ``Authorization: Bearer KEY`` (401 otherwise), and the rule that a server reachable from
  other machines has keys unless ``--no-auth`` says otherwise;
- :mod:`~transformerkit.serving.schemas`: the request bodies (unknown fields are refused);
- :mod:`~transformerkit.serving.app`: :func:`~transformerkit.serving.app.create_app`, the
  application over loaded :class:`transformerkit.api.Run` objects; its routes are in
  :mod:`~transformerkit.serving.model_routes` (``/translate``, ``/generate``,
  ``/attention``) and :mod:`~transformerkit.serving.info_routes` (the page at ``/``,
  ``/health``, ``/models``), which find the runs (:mod:`~transformerkit.serving.registry`),
  the batcher and the limits through :mod:`~transformerkit.serving.dependencies`, check
  requests with :mod:`~transformerkit.serving.checks` and answer errors as
  :mod:`~transformerkit.serving.errors` says; a streamed ``/generate`` answers server-sent
  events (:mod:`~transformerkit.serving.streaming`);
- :mod:`~transformerkit.serving.metrics`: the server's Prometheus metrics (``GET /metrics``)
  and the middleware that counts and times every answer;
- :mod:`~transformerkit.serving.lifecycle`: starting -> ready -> draining, and the
  middleware that answers 503 outside "ready" and counts the requests in flight;
- :mod:`~transformerkit.serving.shutdown`: the uvicorn server that drains at SIGTERM;
- :mod:`~transformerkit.serving.workers`: several worker processes (``--workers``);
- :mod:`~transformerkit.serving.server`: load the runs once and serve them with uvicorn.

FastAPI, uvicorn and prometheus-client are the ``serve`` extra (``pip install
"keras-transformerkit[serve]"``); importing this package imports none of them.
"""
