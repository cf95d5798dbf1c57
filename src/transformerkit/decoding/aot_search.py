"""A beam search's work of a step compiled ahead of time: one native call in place of ~60.

After the model's step, a beam search scores every extension (log-softmax plus the
prefix's log-probability, the token rules), keeps the best ``2 * beam`` (a chunked top-k),
writes the new tokens, moves the candidates that end into the finished hypotheses, picks
the next live beams and decides whose search is over (``advance`` in :mod:`.beam`): about
sixty array calls on ``(sentences, 2 * beam)`` and ``(rows, width)`` arrays, each
dispatched from Python, which in a profile of a one-sentence beam 4 search took about three
quarters of the compiled step's own time (about 0.14 ms a step once compiled; the searches'
speed: ``bench/results/decode_compiled_search.*``, the server's:
``serve_latency_compiled_*``).

:func:`compiled_search_work` captures that function, the very one the eager loop runs, with
``torch.export`` (the step's index a 0-d tensor the graph reads as a symbolic int, the
search's settings constants) and compiles it with AOTInductor into a package:

- **dynamic shapes**: the sentences and the buffers' width vary (rows are ``beam``
  sentences' worth); one package serves every batch of one set of settings;
- **keyed** by the settings (beam, length penalty, stopping rule, token rules, vocabulary),
  PyTorch's version, the CPU's flags and kernel caps, and the source of the modules the
  function comes from (a changed search is a new package); built on first use (a line on
  stderr with its time), cached in :func:`~.aot_packages.cache_directory`, rebuilt when it fails
  to load;
- **weights-free**: any model of that vocabulary shares it;
- **scores not written**: the captured function takes its best candidates without writing
  the ``(rows, vocab)`` scores (``top_candidates`` in :mod:`.beam`,
  :func:`~.common.grouped_top_k`: the same numbers, about two thirds of the time at 64
  sentences of beam 4; ``bench/search_work.py``).

Where it cannot be built (no AOTInductor or compiler, a setting the capture cannot read
statically such as ``min_new_tokens`` > 0, which :mod:`.beam` never asks for) the eager
function runs, with a one-line warning; so it does, silently, for buffers narrower than
:func:`least_width` (``no_repeat_ngram_size`` + 1 positions, whose ban is a no-op or one
window).
"""

import functools
import hashlib
import json
import os

from transformerkit import precisions
from transformerkit.decoding import aot_packages

FIELDS = ("alive", "alive_logp", "finished", "finished_score", "finished_logp",
          "finished_length", "max_penalty", "cap", "active")  # the inputs after the logits
CHANGED = FIELDS[:6]  # the fields the work returns, then the parent rows and the flags
FORMAT = 1  # the layout of a package's inputs and outputs
_LOADED = {}  # key -> the package's callable (or None where it cannot be had)


@functools.cache
def _sources_digest(source):
    """The bytes of the modules a search's work is written in: its own file ``source``
    (``beam``) and the helpers it calls (``common``, ``loop_ops``); read once a process
    (every batch of a search asks for its package)."""
    from transformerkit.decoding import common, loop_ops

    digest = hashlib.sha256()
    for path in (source, common.__file__, loop_ops.__file__):
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def package_key(work, settings):
    """The hex digest naming the package of ``work`` for the search ``settings`` (a
    JSON-able dict), the CPU, the kernel caps and the threads it is built for
    (:func:`~.aot_step.package_key`)."""
    import torch

    text = json.dumps({"format": FORMAT, "settings": settings, "torch": torch.__version__,
                       "cpu": sorted(precisions.cpu_flags()),
                       "vendor": precisions.cpu_vendor(),
                       "caps": {k: os.environ.get(k) for k in precisions.KERNEL_CAPS},
                       "threads": aot_packages.kernel_threads(),
                       "sources": _sources_digest(work.__code__.co_filename)},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _module(work):
    """``work(logits, s, index)`` as a ``torch.nn.Module`` of flat tensors."""
    import torch

    from transformerkit.models.base import _position

    class SearchWork(torch.nn.Module):
        def forward(self, logits, index, alive, alive_logp, finished, finished_score,
                    finished_logp, finished_length, max_penalty, cap, active):
            s = dict(alive=alive, alive_logp=alive_logp, finished=finished,
                     finished_score=finished_score, finished_logp=finished_logp,
                     finished_length=finished_length, max_penalty=max_penalty, cap=cap,
                     active=active)
            # the step's index: below the buffers' width less one (the loop's condition)
            position = _position(index, s["alive"].shape[1] - 1)
            new, parent_rows, done = work(logits, s, position)
            return tuple(new[name] for name in CHANGED) + (parent_rows, done)

    return SearchWork().eval()


def least_width(settings):
    """The narrowest buffers a package of ``settings`` takes: 3 positions, and with
    ``no_repeat_ngram_size`` n more than n (the ban's n-gram windows then number at least
    two, so the captured graph needs no branch on the width; narrower buffers, which hold
    at most one whole n-gram, run the work eagerly)."""
    size = settings.get("no_repeat_ngram_size", 0)
    return max(3, size + 1) if size else 3


def _example(beam, vocab, sentences=2, width=6, least=3):
    """Inputs of the work's signature (``sentences`` sentences of ``beam`` rows, buffers of
    ``width`` positions, at least ``least``, the step at index 1) and their dynamic
    dimensions."""
    import torch

    width = max(width, least + 1)
    n = torch.export.Dim("sentences", min=1, max=4096)
    w = torch.export.Dim("width", min=least, max=4096)
    rows = sentences * beam
    logits = torch.randn(rows, vocab)
    alive_logp = torch.zeros(sentences, beam)
    alive_logp[:, 1:] = float("-inf")
    inputs = (logits, torch.tensor(1),
              torch.ones(rows, width, dtype=torch.int32), alive_logp,
              torch.zeros(rows, width, dtype=torch.int32),
              torch.full((sentences, beam), float("-inf")),
              torch.full((sentences, beam), float("-inf")),
              torch.zeros(sentences, beam, dtype=torch.int32),
              torch.ones(sentences), torch.full((sentences,), width - 1, dtype=torch.int32),
              torch.ones(sentences, dtype=torch.bool))
    rows_dim = n * beam if beam > 1 else n
    dims = ({0: rows_dim}, None, {0: rows_dim, 1: w}, {0: n}, {0: rows_dim, 1: w},
            {0: n}, {0: n}, {0: n}, {0: n}, {0: n}, {0: n})
    return inputs, dims


def build_package(work, settings, path):
    """Capture ``work`` for ``settings`` (``beam`` and ``vocab`` read from it) and compile it
    into the package ``path`` (written atomically)."""
    import torch

    inputs, dims = _example(settings["beam"], settings["vocab"], least=least_width(settings))
    with torch.no_grad():
        program = torch.export.export(_module(work), inputs, dynamic_shapes=dims,
                                      strict=False)
        aot_packages.compile_program(program, path)


def compiled_search_work(work, settings, directory):
    """``work`` (``advance`` of :mod:`.beam`: ``(logits, s, index) -> (new s, parent rows,
    over)``) as its package's call, loaded from ``directory`` or built there once per
    process and settings; ``work`` itself where the package cannot be had (warned once)."""
    key = package_key(work, settings)
    if key not in _LOADED:
        package = aot_packages.load_or_build(
            os.path.join(directory, f"search-{key}.pt2"),
            lambda path: build_package(work, settings, path), "the compiled search",
            "the beam search's step work", "its work runs eagerly")
        _LOADED[key] = package
    run = _LOADED[key]
    return work if run is None else _flat_call(run, work, least_width(settings))


def _flat_call(run, eager, least):
    """The package's call as the work's signature; ``eager`` for buffers narrower than
    ``least`` positions (which the package does not take)."""
    import torch

    def work(logits, s, index):
        if s["alive"].shape[1] < least:
            return eager(logits, s, index)
        flat = [logits.float(), torch.tensor(index)] + [s[name] for name in FIELDS]
        out = run(flat)
        new = dict(s, index=index + 1, **dict(zip(CHANGED, out, strict=False)))
        return new, out[len(CHANGED)], out[len(CHANGED) + 1]

    return work
