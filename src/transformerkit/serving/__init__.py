"""``transformerkit serve``: trained runs behind an HTTP JSON API, with a web page.

- :mod:`~transformerkit.serving.limits`: what one request may ask for, and the middleware
  that refuses bodies over the size limit (413) by counting their bytes;
- :mod:`~transformerkit.serving.batching`: requests that arrive together share one model
  call (a short collection window, a maximum batch size), one batch at a time on a worker
  thread, behind a bounded queue (429 when full) and a per-request timeout (503);
- :mod:`~transformerkit.serving.schemas`: the request bodies (unknown fields are refused);
- :mod:`~transformerkit.serving.app`: the routes (``/translate``, ``/generate``,
  ``/attention``, ``/health``, ``/models``, the page at ``/``) over loaded
  :class:`transformerkit.api.Run` objects;
- :mod:`~transformerkit.serving.server`: load the runs once and serve them with uvicorn.

FastAPI and uvicorn are the ``serve`` extra (``pip install "keras-transformerkit[serve]"``);
importing this package imports neither.
"""
