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

The PyTorch functions used are listed in :mod:`transformerkit.internals`.
"""

import contextlib
import os
import shutil
import sys
import tempfile
import time
import warnings

from transformerkit import internals
from transformerkit.files import user_cache_directory


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
            # and from unpickling its pytree specs (PyTorch's deprecation, not our call)
            warnings.filterwarnings("ignore", ".*isinstance.treespec, LeafSpec.. is deprecated",
                                    FutureWarning)
            internals.get("aoti_compile_and_package")(
                program, package_path=partial,
                inductor_configs=dict(configs or {}))  # a copy: the compiler adds to it
        os.chmod(partial, 0o644)  # mkstemp's file is the owner's only
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def load_or_build(path, build, name, building, eager):
    """The call of the package at ``path`` (:func:`load`); where there is none, or it fails
    to load, ``build(path)`` writes it first. ``name`` names the package in the rebuilding
    line and the warning ("the compiled step"), ``building`` what is compiled in the lines
    around a build ("the decoder step (small steps)"), ``eager`` what runs instead where it
    cannot be had ("decoding with the eager step"): one warning then, and None."""
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
    PyTorch loads, or where neither loader is there (:mod:`transformerkit.internals`)."""
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


def _unavailable(name, reason, eager):
    warnings.warn(f"transformerkit: {name} is unavailable ({reason}); {eager}", RuntimeWarning,
                  stacklevel=5)
    return None
