"""``transformerkit serve``: load the runs once, warm them up, serve them with uvicorn."""

import logging
import os

log = logging.getLogger("transformerkit.serve")


def run_names(run_dirs):
    """A name per run directory: its folder name, with ``-2``, ``-3`` ... for repeats."""
    names = []
    for path in run_dirs:
        base = os.path.basename(os.path.normpath(os.fspath(path))) or "run"
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.append(name)
    return names


def load_runs(run_dirs, checkpoint="model", engine="keras"):
    """``{name: Run}`` for ``run_dirs``, each loaded once (``transformerkit.load``: Keras
    safe mode) and warmed up with one short request on ``engine`` (for "ctranslate2" this
    writes the run's export first if it is missing)."""
    import transformerkit

    runs = {}
    for name, path in zip(run_names(run_dirs), run_dirs, strict=True):
        run = transformerkit.load(path, checkpoint=checkpoint)
        log.info("loaded %s as %r: %s", path, name, run)
        if run.kind == "transformer":
            run.translate(["a"], beam_size=1, max_new_tokens=2, engine=engine)
        elif run.kind == "gpt":
            run.generate("a", max_new_tokens=2, engine=engine)
        else:
            raise ValueError(f"{path} holds a {run.kind} run; serve takes transformer and gpt "
                             "runs")
        runs[name] = run
    return runs


def serve(run_dirs, host="127.0.0.1", port=8000, engine="keras", checkpoint="model",
          limits=None, cors_origins=(), api_keys=(), no_auth=False):
    """Load ``run_dirs`` and serve them until interrupted (Ctrl-C); ``cors_origins`` as
    for :func:`~transformerkit.serving.app.create_app`; the API keys are ``api_keys`` and
    those of ``$TRANSFORMERKIT_API_KEYS``, required on a host other than loopback unless
    ``no_auth`` (:func:`~transformerkit.serving.auth.keys_for_host`)."""
    from transformerkit.serving.auth import is_loopback, keys_for_host

    keys = keys_for_host(host, api_keys, no_auth)  # in a moment: before Keras is imported

    import uvicorn

    from transformerkit.serving.app import check_origins, create_app

    cors_origins = check_origins(cors_origins)  # before the runs load
    runs = load_runs(run_dirs, checkpoint=checkpoint, engine=engine)
    app = create_app(runs, limits=limits, engine=engine, cors_origins=cors_origins,
                     api_keys=keys)
    log.info("serving %s on http://%s:%d (engine %s)", ", ".join(runs), host, port, engine)
    if keys:
        log.info("API keys: on (%d %s); every route but / and /health needs "
                 "Authorization: Bearer KEY", len(keys), "key" if len(keys) == 1 else "keys")
    else:  # a warning where other machines may connect (--no-auth)
        log.log(logging.INFO if is_loopback(host) else logging.WARNING,
                "API keys: off; anyone who can reach %s may call the API", host)
    uvicorn.run(app, host=host, port=port, log_level="warning")
