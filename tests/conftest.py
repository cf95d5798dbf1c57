"""Shared test setup: thread limits, seeding, backend autodiff helpers, the backend probe.

In-process tests run on the default backend (PyTorch unless ``KERAS_BACKEND`` is set);
cross-backend checks run ``tests/support/backend_probe.py`` once per backend in subprocesses,
through the session fixture :func:`probe_results`.

Layout: ``tests/`` mirrors ``src/transformerkit/`` (one folder per package; tests of the
top-level modules and of the project as a whole here, the benchmarks' in ``tests/bench``).
Pytest imports test files with ``--import-mode=importlib`` (pyproject.toml), so two folders
may hold files of the same name and test files never import each other; what several tests
share is a helper module in ``tests/support`` (``tolerances.py``, ``reference.py``,
``tiny_run.py``, ``near_ties.py``, the probe scripts, ...), importable from every folder
because this file puts that folder on ``sys.path`` first.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

_SUPPORT = str(Path(__file__).resolve().parent / "support")
if _SUPPORT not in sys.path:  # the helpers, from any folder
    sys.path.insert(0, _SUPPORT)

from paths import SUPPORT_DIR  # noqa: E402

# Small models on a shared 2-core machine: one thread per process is faster and fair.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
             "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Token caches and cached tokenizers of the tests' runs go to a scratch folder, never the
# user's ~/.cache (one folder per session: xdist workers inherit it from the controller).
if "TRANSFORMERKIT_CACHE" not in os.environ:
    import tempfile

    os.environ["TRANSFORMERKIT_CACHE"] = tempfile.mkdtemp(prefix="transformerkit-test-cache-")
# What :func:`build_once` builds (trained runs shared by several test files) goes to one
# folder for the whole test run, the same for every pytest-xdist worker; the process that
# made it removes it at the end.
if "TRANSFORMERKIT_TESTS_BUILT" not in os.environ:
    import tempfile

    os.environ["TRANSFORMERKIT_TESTS_BUILT"] = tempfile.mkdtemp(prefix="transformerkit-test-runs-")
    _REMOVE_BUILT = True
else:
    _REMOVE_BUILT = False
BUILT = Path(os.environ["TRANSFORMERKIT_TESTS_BUILT"])

# Whether the caller chose the backend (xdist workers inherit the marker from the controller).
if "KERAS_BACKEND" not in os.environ:
    os.environ["TRANSFORMERKIT_TESTS_DEFAULT_BACKEND"] = "1"

from transformerkit.backend import choose_default_backend  # noqa: E402

# Before Keras is first imported: PyTorch unless KERAS_BACKEND names another backend. (This
# call also keeps import sorters from moving the Keras imports above it.)
choose_default_backend()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from backends import BACKENDS, FAST_XLA_COMPILE  # noqa: E402

if keras.backend.backend() == "torch":
    import torch

    torch.set_num_threads(1)


def pytest_configure(config):
    # Keras' torch backend converts tensors with np.array(tensor); NumPy 2 warns on every call.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")


def pytest_terminal_summary(terminalreporter):
    """Say how many cases the property tests ran (``fuzz_cases`` recorded by
    ``tests/test_input_fuzz.py``; reports carry it from pytest-xdist workers too)."""
    cases = {}
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            for key, value in getattr(report, "user_properties", ()):
                if key == "fuzz_cases":
                    cases[report.nodeid] = value
    if cases:
        terminalreporter.write_line(f"fuzz: {sum(cases.values())} cases in {len(cases)} "
                                    "property tests")
    built = [json.loads(path.read_text()) for path in sorted(BUILT.glob("*.built.json"))]
    if built:
        terminalreporter.write_line("built once for the whole run (build_once): " + ", ".join(
            f"{b['name']} {b['seconds']:.1f} s ({b['by']})" for b in built))


@pytest.fixture(scope="session")
def data_dir():
    """The shared data folder (``paths.SHARED_DATA``: ``$TRANSFORMERKIT_DATA``, else
    ``../shared/data`` beside the checkout) as a string; fails, naming the variable, when it
    lacks Multi30k or tiny Shakespeare."""
    from paths import SHARED_DATA

    for needed in ("multi30k/train.de", "tinyshakespeare/input.txt"):
        if not (SHARED_DATA / needed).is_file():
            pytest.fail(f"{needed} not found under {SHARED_DATA}; set TRANSFORMERKIT_DATA")
    return str(SHARED_DATA)


@pytest.fixture(scope="session")
def build_once():
    """``build_once(name, build) -> folder``: ``build(folder)`` runs once for the whole test
    run, whichever test asks first, and every later call (from any test file, in any
    pytest-xdist worker) gets the same finished folder. A file lock per name makes the other
    workers wait for the first; a build that failed is retried in an emptied folder."""
    import fcntl
    import shutil
    import time

    def once(name, build):
        folder = BUILT / name
        with open(BUILT / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = BUILT / f"{name}.built.json"
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                start = time.monotonic()
                build(folder)
                done.write_text(json.dumps({
                    "name": name, "seconds": time.monotonic() - start,
                    "by": os.environ.get("PYTEST_XDIST_WORKER", "main process")}))
        return folder

    return once


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state (weights, dropout, NumPy)."""
    keras.utils.set_random_seed(1234)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def input_gradient(fn, x):
    """Gradient of the scalar ``fn(x)`` with respect to the float array ``x``, computed by
    the current backend's own autodiff (torch autograd, ``jax.grad``, ``tf.GradientTape``)."""
    x = np.asarray(x, np.float32)
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        leaf = torch.tensor(x, requires_grad=True)
        fn(leaf).backward()
        return leaf.grad.detach().cpu().numpy()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(fn)(jax.numpy.asarray(x)))
    import tensorflow as tf

    leaf = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(leaf)
        value = fn(leaf)
    return tape.gradient(value, leaf).numpy()


@pytest.fixture(scope="session")
def grad_of():
    return input_gradient


# -- the cross-backend probe ----------------------------------------------------------------

# The probes take a while (mostly XLA compiling under JAX), so they start in the background
# as soon as the collected tests are known to need them, and run beside the other tests.
# Under pytest-xdist the first worker to collect starts them (a file lock decides) and the
# others find the results in the session's shared temporary directory.
PROBE_TIMEOUT_S = 900
_probe_state = {}


def _probe_dir(config):
    basetemp = getattr(config.option, "basetemp", None)
    if os.environ.get("PYTEST_XDIST_WORKER") and basetemp:
        workdir = Path(basetemp).parent / "backend_probe"  # shared by the workers
    else:  # one process: a private directory, removed when the session ends
        import tempfile

        workdir = Path(tempfile.mkdtemp(prefix="transformerkit-probe-"))
        _probe_state["remove"] = workdir
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def pytest_unconfigure(config):
    if _REMOVE_BUILT:
        import shutil

        shutil.rmtree(BUILT, ignore_errors=True)
    if "remove" in _probe_state:  # a single-process session: nobody else needs the probes
        import shutil
        import signal

        for process in _probe_state.get("processes", []):
            if process.poll() is None:  # the session ended early (-x, Ctrl-C)
                os.killpg(process.pid, signal.SIGTERM)
                process.wait()
        shutil.rmtree(_probe_state.pop("remove"), ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if config.option.collectonly or "workdir" in _probe_state:
        return
    if any("probe_results" in getattr(item, "fixturenames", ()) for item in items):
        _probe_state["workdir"] = workdir = _probe_dir(config)
        _start_probes(workdir)


def _start_probes(workdir):
    """Prepare weights and inputs and start one probe subprocess per backend, unless another
    process of this session already did. Each probe runs under ``sh``, which writes its exit
    status to ``probe_{backend}.rc`` when it ends: the process that started the probes may
    itself have finished (an xdist worker that ran out of tests) before they do."""
    import fcntl

    with open(workdir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (workdir / "started").exists():
            return
        try:
            _launch_probes(workdir, _prepare_probe_files(workdir))
        except Exception as error:  # reported by the tests that need the probes
            (workdir / "error.txt").write_text(f"could not start the probes: {error!r}")
            raise
        finally:
            (workdir / "started").write_text("")


def _prepare_probe_files(workdir):
    from backend_probe import PROBE_MODELS, build_model, model_inputs, probe_inputs
    from reference import randomize_weights

    inputs = probe_inputs(np.random.default_rng(7))
    np.savez(workdir / "inputs.npz", **{f"{name}/{key}": value for name, arrays in inputs.items()
                                        for key, value in arrays.items()})
    weights = {}
    for index, entry in enumerate(PROBE_MODELS):
        model = build_model(entry)
        model(model_inputs(entry, inputs[entry["name"]]))
        randomize_weights(model, seed=index)
        for variable in model.weights:
            weights[f"{entry['name']}/{variable.path}"] = keras.ops.convert_to_numpy(variable)
        model.save_weights(str(workdir / f"{entry['name']}.local.weights.h5"))
    np.savez(workdir / "weights.npz", **weights)
    spec = {"models": PROBE_MODELS, "inputs": str(workdir / "inputs.npz"),
            "weights": str(workdir / "weights.npz"), "workdir": str(workdir)}
    (workdir / "spec.json").write_text(json.dumps(spec))
    return workdir / "spec.json"


def _launch_probes(workdir, spec_path):
    wrapper = '"$0" "$1" "$2" "$3" > "$4" 2>&1; echo $? > "$5.tmp" && mv "$5.tmp" "$5"'
    processes = _probe_state.setdefault("processes", [])
    for backend in BACKENDS:
        env = dict(os.environ, KERAS_BACKEND=backend)
        env.setdefault("XLA_FLAGS", FAST_XLA_COMPILE)
        processes.append(subprocess.Popen(
            ["sh", "-c", wrapper, sys.executable, str(SUPPORT_DIR / "backend_probe.py"),
             str(spec_path), str(workdir / f"probe_{backend}.npz"),
             str(workdir / f"probe_{backend}.log"), str(workdir / f"probe_{backend}.rc")],
            env=env, stdin=subprocess.DEVNULL, start_new_session=True))


def _wait_for_probes(workdir):
    """Wait until every probe has ended; fail the test with its log if one failed."""
    import time

    deadline = time.monotonic() + PROBE_TIMEOUT_S
    rc_files = [workdir / f"probe_{backend}.rc" for backend in BACKENDS]
    while not all(f.exists() for f in rc_files):
        if (workdir / "error.txt").exists():
            pytest.fail((workdir / "error.txt").read_text(), pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"backend probes did not finish in {PROBE_TIMEOUT_S} s ({workdir})")
        time.sleep(0.5)
    for backend, rc_file in zip(BACKENDS, rc_files, strict=True):
        if rc_file.read_text().strip() != "0":
            log = (workdir / f"probe_{backend}.log").read_text()
            pytest.fail(f"backend_probe.py failed under {backend}:\n{log[-6000:]}",
                        pytrace=False)


@pytest.fixture(scope="session")
def probe_results(request):
    """What the probes computed, plus this process's copies of the probe models:

    ``{"inputs": {name: arrays}, "local": {name: model}, "local_backend": str,
    "results": {backend: {key: array}}, "workdir": Path}``.
    Keys in the results: ``{name}/logits``, ``{name}/loss``, ``{name}/grad/{path}``,
    ``{name}/cached_logits``, ``{name}/h5_logits`` (our .weights.h5 loaded there); each
    backend also wrote ``{workdir}/{name}.{backend}.weights.h5``.
    """
    from backend_probe import (
        PROBE_MODELS,
        build_model,
        load_npz_weights,
        model_inputs,
        probe_inputs,
    )

    if "workdir" not in _probe_state:  # collected without the hook (should not happen)
        _probe_state["workdir"] = _probe_dir(request.config)
        _start_probes(_probe_state["workdir"])
    workdir = _probe_state["workdir"]
    _wait_for_probes(workdir)
    inputs = probe_inputs(np.random.default_rng(7))
    weights = dict(np.load(workdir / "weights.npz"))
    local = {}
    for entry in PROBE_MODELS:
        model = build_model(entry)
        model(model_inputs(entry, inputs[entry["name"]]))
        load_npz_weights(model, weights, entry["name"])
        local[entry["name"]] = model
    results = {backend: dict(np.load(workdir / f"probe_{backend}.npz")) for backend in BACKENDS}
    return {"inputs": inputs, "local": local, "local_backend": keras.backend.backend(),
            "results": results, "workdir": workdir}
