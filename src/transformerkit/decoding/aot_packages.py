"""AOTInductor packages on disk: where they are kept, how one is written, loaded or rebuilt.

The compiled decoder step (:mod:`.aot_step`) and a beam search's compiled work of a step
(:mod:`.aot_search`) are both ``.pt2`` packages that AOTInductor compiles from a
``torch.export`` program. Each module decides what its package holds and how it is keyed;
this one does what they share:

- :func:`cache_directory`: ``$TRANSFORMERKIT_CACHE/compiled``, else
  ``~/.cache/transformerkit/compiled``;
- :func:`compile_program`: the program compiled into its path atomically (a temporary file
  in the same folder, then ``os.replace``), so a crash or a second process never leaves a
  half-written package where a loader looks;
- :func:`load_or_build`: the package's call, loaded, or built first (a line on stderr
  before and one with the seconds it took after), or built again where the file on disk
  fails to load; where AOTInductor, its C++ compiler or the capture is missing, one warning
  saying why and None (the caller runs its eager code);
- :func:`load`: a package's call over one flat list of tensors in ``torch.export``'s
  flattening order (its flat outputs): PyTorch's package loader's ``boxed_run``, which
  skips the package's own parsing of its input and output specs on every call. The loader
  is made directly (``torch._C._aoti.AOTIModelPackageLoader``): loading through
  ``aoti_load_package`` first imports Inductor and the export archive modules, about 2 s of
  a one-sentence ``translate`` that needs neither. That loader copies the package's
  compiled library (weights included: 657 MB for GPT-2 124M in float32) out of the archive
  into a temporary folder at every load; so a CPU package whose archive holds nothing but
  its library, sources and metadata has its library extracted once, beside it
  (``NAME-CRC.so``, written atomically, named by the library's CRC-32 in the archive so
  that a rebuilt package never runs an old library), and runs from there
  (``torch._C._aoti.AOTIModelContainerRunnerCpu``). The cache then holds each library
  twice; deleting a ``.so`` only costs its next load the extraction.
- :func:`prune`: the cache kept under a size (:func:`cache_limit_bytes`:
  ``$TRANSFORMERKIT_COMPILED_CACHE_GB``, default :data:`DEFAULT_CACHE_LIMIT_GB`, 0 for no
  limit): after each build the packages used least recently (a load marks a package used,
  in its access time) are removed, never one this process has loaded or built. Every
  retrained or fine-tuned checkpoint has packages of its own (one float32 step package of
  GPT-2 124M: 656 MB, and as much again for its extracted library), which would otherwise
  pile up in the cache for good.

The PyTorch functions used are listed in :mod:`transformerkit.internals`.
"""

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import warnings

from transformerkit import internals
from transformerkit.files import user_cache_directory

CACHE_LIMIT_VARIABLE = "TRANSFORMERKIT_COMPILED_CACHE_GB"
DEFAULT_CACHE_LIMIT_GB = 20.0
# a package (``KIND-DIGEST.pt2``) and its extracted library (``KIND-DIGEST-CRC.so``): what
# :func:`prune` may remove, grouped by ``KIND-DIGEST``; a build's or an extraction's
# temporary file (``tempfile.mkstemp``'s ``tmp*``) left by a killed process, once a day old
_PACKAGE_FILE = re.compile(r"^((?:step|encoder|prefill|search)-[0-9a-f]{16,64})"
                           r"(?:\.pt2|-[0-9a-f]{8}\.so)$")
_TEMPORARY_FILE = re.compile(r"^tmp[A-Za-z0-9_]+\.(?:pt2|so)$")
_STALE_TEMPORARY_SECONDS = 86400
_IN_USE = set()  # the package paths this process has loaded: never pruned by it
# Inductor's options that keep its autotuning reports off stderr while a package compiles:
# the JSON line of each product's choices and the table of their times (both on by default)
QUIET_OPTIONS = {"max_autotune_report_choices_stats": False, "autotune_num_choices_displayed": 0}


def cache_directory():
    """Where packages are kept: ``$TRANSFORMERKIT_CACHE/compiled``, else
    ``~/.cache/transformerkit/compiled``."""
    return user_cache_directory("compiled")


def kernel_threads():
    """The threads a package built now runs its own kernels on: Inductor writes PyTorch's
    intra-op thread count at build time into the C++ it generates (its loops' OpenMP regions
    and its GEMM templates' ``num_threads``), whatever a later process asks with
    ``torch.set_num_threads``. So a package is named by it, and a process on another count
    builds its own rather than run one made for 1 thread on 2 (or for 16 on 1)."""
    import torch

    return torch.get_num_threads()


def compile_program(program, path, configs=None):
    """Compile the exported ``program`` with AOTInductor (its ``configs``, e.g.
    ``{"freezing": True}``) into the package ``path``, written atomically."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".pt2", dir=folder)
    os.close(handle)
    try:
        with warnings.catch_warnings():  # Inductor's own, from its int8 lowering's code
            warnings.filterwarnings("ignore", "To copy construct from a tensor",
                                    UserWarning)
            # from its autotuning's output buffers (PyTorch's deprecation, not our call)
            warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
            # and from unpickling its pytree specs (PyTorch's deprecation, not our call)
            warnings.filterwarnings("ignore", ".*isinstance.treespec, LeafSpec.. is deprecated",
                                    FutureWarning)
            internals.get("aoti_compile_and_package")(
                program, package_path=partial,
                inductor_configs=quiet_configs(configs))
        os.chmod(partial, 0o644)  # mkstemp's file is the owner's only
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def quiet_configs(configs=None):
    """A copy of ``configs`` (the compiler adds to what it is given) with Inductor's reports
    of each autotuning (:data:`QUIET_OPTIONS`: by default a JSON line and a table of times per
    tuned product on stderr, in the middle of a command's own output) turned off, each where
    this PyTorch has the option."""
    configs = dict(configs or {})
    from torch._inductor import config

    for option, value in QUIET_OPTIONS.items():
        if hasattr(config, option):
            configs.setdefault(option, value)
    return configs


def load_or_build(path, build, name, building, eager):
    """The call of the package at ``path`` (:func:`load`); where there is none, or it fails
    to load, ``build(path)`` writes it first. ``name`` names the package in the rebuilding
    line and the warning ("the compiled step"), ``building`` what is compiled in the lines
    around a build ("the decoder step (small steps)"), ``eager`` what runs instead where it
    cannot be had ("decoding with the eager step"): one warning then, and None. After a
    build the cache is pruned to its limit (:func:`prune`); a limit that is not a number
    raises ``ValueError`` here, before anything is loaded or built."""
    limit = cache_limit_bytes()
    if os.path.exists(path):
        try:
            return load(path)
        except Exception as error:  # a corrupt or foreign package: built again below
            print(f"transformerkit: rebuilding {name} {path} ({type(error).__name__})",
                  file=sys.stderr)
    if internals.get("aoti_compile_and_package") is None:
        return _unavailable(name, "this PyTorch has no AOTInductor", eager)
    print(f"transformerkit: compiling {building} ...", file=sys.stderr, flush=True)
    try:
        started = time.perf_counter()
        build(path)
        seconds = time.perf_counter() - started
        _IN_USE.add(os.path.abspath(path))
        prune(os.path.dirname(path), limit)
        run = load(path)
    except Exception as error:  # no compiler, or code torch.export cannot capture
        reason = str(error).strip().splitlines()
        return _unavailable(name, f"{type(error).__name__}: {reason[0] if reason else ''}"[:300],
                            eager)
    print(f"transformerkit: compiled {building} in {seconds:.0f} s ({path})", file=sys.stderr,
          flush=True)
    return run


def load(path):
    """The package at ``path`` as its call over a flat list of tensors, giving its flat
    outputs (the loader's ``boxed_run``). Raises where the file is not a package this
    PyTorch loads, or where neither loader is there (:mod:`transformerkit.internals`).
    The package is marked used (its access time, set here; its modification time stays its
    build's: :func:`prune` removes the least recently used first) and kept from this
    process' pruning. A cache limit that is not a number raises ``ValueError``
    (:func:`cache_limit_bytes`) at the first load, not only at the next build."""
    cache_limit_bytes()
    _IN_USE.add(os.path.abspath(path))
    with contextlib.suppress(OSError):  # a read-only cache: nothing is pruned there either
        os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))  # build time kept
    library = _extracted_library(os.fspath(path))
    if library is not None:
        try:
            return internals.get("aoti_runner_cpu")(library, 1).run
        except Exception:  # noqa: BLE001  # a damaged library: the package itself decides
            with contextlib.suppress(OSError):
                os.remove(library)
    loader_class = internals.get("aoti_package_loader")
    if loader_class is not None:  # (path, model name, single-threaded, runners, device index)
        return loader_class(os.fspath(path), "model", False, 1, -1).boxed_run
    load_package = internals.get("aoti_load_package")
    run = getattr(getattr(load_package and load_package(path), "loader", None), "boxed_run",
                  None)
    if run is None:
        raise RuntimeError("this PyTorch has no AOTInductor package loader")
    return run


# what a CPU package's archive may hold besides its one library for it to run from that
# library alone: the generated sources, their metadata and the archive's own markers
_SIDE_FILES = (".cpp", "_metadata.json", "/archive_format", "/archive_version", "/version",
               "/byteorder", "/serialization_id")


def _extracted_library(path):
    """The path of the package ``path``'s compiled library, extracted beside it where it is
    not yet (see the module docstring), or None where the package holds anything more than
    :data:`_SIDE_FILES` and one ``.so`` (a GPU package's kernels, weights kept apart) or
    PyTorch lacks the runner, or where it cannot be written (a full disk, a read-only
    cache). Raises where the file is not a readable archive (a library whose bytes fail
    their CRC-32 included: the package is then built again)."""
    import zipfile

    if internals.get("aoti_runner_cpu") is None:
        return None
    with zipfile.ZipFile(path) as archive:
        entries = archive.infolist()
        libraries = [e for e in entries if e.filename.endswith(".so")]
        if len(libraries) != 1 or any(not e.filename.endswith(_SIDE_FILES)
                                      for e in entries if e not in libraries):
            return None
        library = libraries[0]
        stem = path[:-len(".pt2")] if path.endswith(".pt2") else path
        target = f"{stem}-{library.CRC:08x}.so"
        if os.path.isfile(target) and os.path.getsize(target) == library.file_size:
            return target
        try:
            _write_library(archive, library, target)
        except OSError:  # a full disk, a read-only cache: PyTorch's loader, as before
            return None
    prefix = os.path.basename(stem) + "-"
    folder = os.path.dirname(target) or "."
    for name in os.listdir(folder):  # a rebuilt package's earlier library
        if name.startswith(prefix) and name.endswith(".so") and name != os.path.basename(target):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, name))
    return target


def _write_library(archive, library, target):
    """The ``library`` entry of the open ``archive`` written to ``target`` atomically (a
    temporary file in the same folder, then ``os.replace``)."""
    handle, partial = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target) or ".")
    try:
        with os.fdopen(handle, "wb") as out, archive.open(library) as data:
            shutil.copyfileobj(data, out, 1 << 22)  # checks the CRC-32 as it reads
        os.chmod(partial, 0o755)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def cache_limit_bytes():
    """The most bytes the compiled packages' folder may hold: ``$TRANSFORMERKIT_COMPILED_CACHE_GB``
    gigabytes (10^9 bytes; unset or empty: :data:`DEFAULT_CACHE_LIMIT_GB`; 0: no limit, None
    returned). Raises ``ValueError`` naming the variable where it is not a number >= 0."""
    text = os.environ.get(CACHE_LIMIT_VARIABLE, "").strip()
    try:
        gigabytes = float(text) if text else DEFAULT_CACHE_LIMIT_GB
    except ValueError:
        gigabytes = float("nan")
    if not gigabytes >= 0 or gigabytes == float("inf"):
        raise ValueError(f"{CACHE_LIMIT_VARIABLE} is the compiled packages' cache size in GB, "
                         f"a number >= 0 (0: no limit); got {text!r}")
    return int(gigabytes * 1e9) or None


def prune(directory, limit=None, now=None):
    """Remove the least recently used packages of ``directory`` (each ``.pt2`` with its
    extracted libraries) until it holds at most ``limit`` bytes of them (None: no limit),
    never one this process has loaded or built (:func:`load`);
    and the temporary files of builds a killed process left, a day old. Says on stderr what
    it removed; removes nothing else (other files, folders, a package it cannot stat).
    Returns the paths removed."""
    now = time.time() if now is None else now
    groups, removed = {}, []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        try:
            status = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        match = _PACKAGE_FILE.match(name)
        if match:
            group = groups.setdefault(match.group(1), {"paths": [], "bytes": 0, "used": 0.0})
            group["paths"].append(path)
            group["bytes"] += status.st_size
            group["used"] = max(group["used"], status.st_atime, status.st_mtime)
        elif _TEMPORARY_FILE.match(name) and now - status.st_mtime > _STALE_TEMPORARY_SECONDS:
            removed += _removed([path])
    total = sum(group["bytes"] for group in groups.values())
    freed, packages, latest = 0, 0, None
    if limit:
        for stem, group in sorted(groups.items(), key=lambda item: item[1]["used"]):
            if total - freed <= limit:
                break
            if os.path.abspath(os.path.join(directory, stem + ".pt2")) in _IN_USE:
                continue
            gone = _removed(group["paths"])
            removed += gone
            if gone:
                freed += group["bytes"]
                packages += 1
                latest = group["used"]
    if packages:
        size = f"{freed / 1e9:.1f} GB" if freed >= 1e8 else f"{freed / 1e6:.1f} MB"
        print(f"transformerkit: removed {packages} compiled package(s) of {size} "
              f"not used since {time.strftime('%Y-%m-%d %H:%M', time.localtime(latest))}, "
              f"to keep {directory} under {limit / 1e9:g} GB "
              f"(${CACHE_LIMIT_VARIABLE})", file=sys.stderr, flush=True)
    return removed


def _removed(paths):
    """``paths`` removed (those that could be: another process may have taken one)."""
    gone = []
    for path in paths:
        with contextlib.suppress(OSError):
            os.remove(path)
            gone.append(path)
    return gone


def _unavailable(name, reason, eager):
    warnings.warn(f"transformerkit: {name} is unavailable ({reason}); {eager}", RuntimeWarning,
                  stacklevel=5)
    return None
