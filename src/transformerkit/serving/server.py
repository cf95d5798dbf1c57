"""``transformerkit serve``: load the runs once, warm them up, serve them with uvicorn.

The server answers at once (``GET /health``: "starting") and loads its runs in the
background (:func:`build_app`); it drains at SIGTERM (:mod:`.shutdown`); with ``workers``
> 1, each of several processes loads and serves its own copy (:mod:`.workers`).
"""

import dataclasses
import functools
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


def load_runs(run_dirs, runtime=None):
    """``{name: Run}`` for ``run_dirs``, each loaded once (``transformerkit.load``: Keras
    safe mode) with the :class:`~transformerkit.decoding.options.RuntimeOptions`
    ``runtime`` (None: the declared defaults) and warmed up with one short request on its
    engine (for "ctranslate2" this writes the run's export first if it is missing; for the
    keras engine it packs the weights at its precision)."""
    import transformerkit

    runs = {}
    for name, path in zip(run_names(run_dirs), run_dirs, strict=True):
        run = transformerkit.load(path, runtime)
        log.info("loaded %s as %r: %s (%s)", path, name, run, run.runtime)
        if run.kind == "transformer":
            run.translate(["a"], beam_size=1, max_new_tokens=2)
        elif run.kind == "gpt":
            run.generate("a", max_new_tokens=2)
        else:
            raise ValueError(f"{path} holds a {run.kind} run; serve takes transformer and gpt "
                             "runs")
        runs[name] = run
    return runs


def check_runs(run_dirs, checkpoint):
    """A ``FileNotFoundError`` naming the first of ``run_dirs`` that is no run directory or
    lacks the ``checkpoint`` weights: found before the server starts, not in its log."""
    from transformerkit.run_directory import RunDirectory

    for path in run_dirs:
        run = RunDirectory(path)
        if not os.path.isfile(run.config):
            raise FileNotFoundError(f"{path} is not a run directory: no config.yaml in it")
        weights = run.model_file(checkpoint)
        if not os.path.isfile(weights):
            raise FileNotFoundError(f"{path} has no weights {weights} (--checkpoint "
                                    f"{checkpoint})")


def build_app(run_dirs, runtime=None, limits=None, cors_origins=(), api_keys=()):
    """The application ``serve`` runs: :func:`~.app.create_app` with a loader that loads and
    warms ``run_dirs`` with ``runtime`` (:func:`load_runs`) on a thread once the
    application starts."""
    from transformerkit.decoding.options import RuntimeOptions
    from transformerkit.serving.app import create_app

    runtime = runtime or RuntimeOptions()
    loader = functools.partial(load_runs, list(run_dirs), runtime)
    return create_app(loader, limits=limits, engine=runtime.engine, cors_origins=cors_origins,
                      api_keys=api_keys)


def app_from_environment():
    """The application of one worker process of ``serve --workers N`` (uvicorn calls this
    factory, named by import string, in each worker): the worker's share of the CPU
    threads, then :func:`build_app` with the settings ``serve`` passed."""
    from transformerkit.decoding.options import RuntimeOptions
    from transformerkit.serving.limits import Limits
    from transformerkit.serving.workers import share_threads, worker_settings

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = worker_settings()
    runtime = settings["runtime"]
    threads = share_threads(settings.pop("workers"), runtime.get("engine"))
    if threads:
        log.info("worker %d: %d threads", os.getpid(), threads)
        if runtime.get("engine") == "ctranslate2" and not runtime.get("threads"):
            runtime["threads"] = threads  # CTranslate2's intra_threads (0: every core)
    settings["limits"] = Limits(**settings["limits"])
    settings["runtime"] = RuntimeOptions(**runtime)
    return build_app(**settings)


def serve(run_dirs, runtime=None, host="127.0.0.1", port=8000, limits=None, cors_origins=(),
          api_keys=(), no_auth=False, workers=1, shutdown_timeout=25.0):
    """Serve ``run_dirs`` until SIGTERM or SIGINT (Ctrl-C), then drain for at most
    ``shutdown_timeout`` seconds (:mod:`.shutdown`); ``runtime`` (a
    :class:`~transformerkit.decoding.options.RuntimeOptions`; None: its defaults) says the
    engine, precision, threads and weights of every run; ``workers`` processes, each with
    its own copy of the runs (:mod:`.workers`); ``cors_origins`` as for
    :func:`~transformerkit.serving.app.create_app`; the API keys are ``api_keys`` and those
    of ``$TRANSFORMERKIT_API_KEYS``, required on a host other than loopback unless
    ``no_auth`` (:func:`~transformerkit.serving.auth.keys_for_host`). Returns the exit
    status: 0, or 1 if the runs could not be loaded (logged)."""
    from transformerkit.decoding.options import RuntimeOptions
    from transformerkit.serving.auth import is_loopback, keys_for_host

    if runtime is None:
        runtime = RuntimeOptions()
    if not isinstance(runtime, RuntimeOptions):
        raise TypeError(f"runtime must be a RuntimeOptions, got {type(runtime).__name__}")

    keys = keys_for_host(host, api_keys, no_auth)  # in a moment: before Keras is imported
    from transformerkit.allocator import bound_kernel_caches

    bound_kernel_caches()  # before any product runs; the workers inherit it

    import uvicorn

    from transformerkit.serving.limits import Limits
    from transformerkit.serving.origins import check_origins
    from transformerkit.serving.shutdown import (
        CLOSE_GRACE_S,
        DrainingServer,
        exit_if_still_loading,
    )

    if not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"--workers must be a whole number of at least 1, got {workers!r}")
    if not shutdown_timeout >= 0:
        raise ValueError(f"--shutdown-timeout must be 0 or more seconds, got "
                         f"{shutdown_timeout!r}")
    cors_origins = check_origins(cors_origins)  # before anything starts
    check_runs(run_dirs, runtime.checkpoint)
    limits = limits or Limits()
    settings = {"run_dirs": [os.fspath(p) for p in run_dirs],
                "runtime": dataclasses.asdict(runtime), "limits": dataclasses.asdict(limits),
                "cors_origins": cors_origins, "api_keys": list(keys)}
    options = {"host": host, "port": port, "log_level": "warning",
               "timeout_graceful_shutdown": CLOSE_GRACE_S}
    log.info("serving %s on http://%s:%d (engine %s, %d worker process%s); GET /health says "
             "when the runs are loaded", ", ".join(run_names(run_dirs)), host, port,
             runtime.engine,
             workers, "" if workers == 1 else "es")
    if keys:
        log.info("API keys: on (%d %s); every route but / and /health needs "
                 "Authorization: Bearer KEY", len(keys), "key" if len(keys) == 1 else "keys")
    else:  # a warning where other machines may connect (--no-auth)
        log.log(logging.INFO if is_loopback(host) else logging.WARNING,
                "API keys: off; anyone who can reach %s may call the API", host)
    if workers == 1:
        server = DrainingServer(uvicorn.Config(build_app(**settings | {"limits": limits,
                                                                       "runtime": runtime}),
                                               **options), shutdown_timeout)
        server.run()
        exit_if_still_loading(server)
        return server.exit_code
    from transformerkit.serving.workers import run_workers

    config = uvicorn.Config(f"{__name__}:app_from_environment", factory=True, workers=workers,
                            **options)
    return run_workers(config, settings | {"workers": workers}, shutdown_timeout)
