"""The decoder step compiled ahead of time: PyTorch's AOTInductor, one native call per step.

An eager step (:class:`~.eager_steps.EagerSteps`) is the model's own ``decode_step``: about 200
PyTorch calls, each dispatched from Python, which at the few rows of a greedy search cost
more than their arithmetic. Here the same method is captured once with ``torch.export``
and compiled by AOTInductor (``torch._inductor.aoti_compile_and_package``) into a shared
library that the loop calls once per step:

- **the same math**: ``decode_step`` with its position given as a 0-d tensor, whose
  value the graph reads as a symbolic int: the same code writes the new key and value into
  the caches in place and attends over their filled prefix;
- **weights as constants**: plain tensors (``step_weights(precision, packed=False)``),
  frozen (``freezing``), so the compiler packs the products' weights for its own kernels:
  float32 ``(kernel, bias)``, or at ``precision="bfloat16"`` bfloat16 ones whose ``addmm``
  Inductor runs on oneDNN's bfloat16 kernels (AVX512-BF16 or AMX units: the rounding of
  the eager bfloat16 step, its input, weight and output to bfloat16 with float32 sums;
  where the CPU has no such units, float32 products of the rounded weights, as the eager
  step emulates them);
- **dynamic shapes**: the rows, the cache length and the source length vary, so one graph
  serves greedy search, sampling and beam search of any width. Packages are built per row
  bucket (:data:`BUCKETS`): a step of at most :data:`SMALL_ROWS` rows runs a package
  whose products were chosen by measuring Inductor's own small-matrix kernels at 2 rows
  (``max_autotune``; several times faster there than the library's), a larger step one
  made for many rows (the packed library products; the small-row kernels are slower
  there): ``bench/results/decode_compiled_rows.epyc-avx512bf16.md``;
- **the cross-attention memory**: in the many-rows package one per sentence, as in the
  eager step: a beam search's ``copies`` adjacent rows of a sentence (its beams) query its
  one copy, their number read from the shapes (``rows // sentences``, the sentences a
  dimension of their own), which saves reading a copy per beam (about 4 % of a beam 4
  search of 64 sentences). The small-rows package takes one memory per row: its example
  has as many sentences as rows, since ``torch.export`` specializes a dimension of size 1
  and a separate sentences dimension would move its products' tuning from 2 rows to 4; a
  beam's memories are repeated for its rows there, once per change of the sentences;
- **cached on disk** by what the package depends on (:func:`package_key`: the weights'
  digest, the model's options, the bucket, the PyTorch version and the CPU's flags), written
  atomically; a package that fails to load is rebuilt.

Where AOTInductor or its C++ compiler is missing, or the model cannot be captured,
:class:`CompiledSteps` says so once, in one line, and runs the eager step instead.

Every step runs the package, a beam search's first step (one row per sentence, copied to
its beams) included; a beam search's own work of the step runs as a package too
(:meth:`CompiledSteps.search_work`, :mod:`.aot_search`). An encoder-decoder's batch starts
with a package of its own (:data:`ENCODER`): the encoder pass and every decoder block's
cross-attention keys and values (:func:`~.eager_steps.source_memories`, the eager code,
captured with the sentences and the source length dynamic; where that code would read the
ids' values to skip the padding mask or the zeroing of sources without tokens, a captured
graph takes the branch right for any ids: :func:`transformerkit.fastpath.exporting`).
A GPT's prompt has one too (:data:`PREFILL`): its shared prefix in one pass
(``decode_prefill``, the eager code, captured with the rows and the prompt's length dynamic),
which writes its keys and values in place into the caches' first positions, handed to it as
contiguous views of that length. Only a model's stand-in runs it (:mod:`.aot_files`: a long
prompt without Keras): with the model loaded, its eager pass over a prompt is nearly as fast
(GPT-2 124M, one row and thread: 120.3 against 110.5 ms for 64 positions, 334.7 against 329.7
for 190, ``bench/results/prompt_pass.*``), and loading a second package would hold a second
copy of the weights.
Greedy search's choice is part of the small-rows package: besides the logits it returns each
row's best id among those a bias row allows (:func:`~.common.best_allowed`, the token rules
of :class:`~.common.TokenRules` as 0 / -inf), which the greedy loop takes
(:meth:`CompiledSteps.step_choosing`) where its rules are the same for every row, in place of
about ten eager calls a step (the rules, the arg-max over the vocabulary, the casts). The
many-rows package leaves the choice to the loop: there its eager calls cost little beside the
step, and an arg-max over every row inside the graph (one pass over all the logits that
beam search and sampling, whose steps have many rows, would not use) cost more (about
0.25 ms a 64-row step).

A search that reorders its rows (a beam search's beams, the sentences or prompts it drops
when they finish) reorders no cache: the state is a :class:`TabledCaches`, the caches and a
table naming the cache row that holds each row's key and value at each position
(``decode_step``'s ``cache_rows``), and :meth:`CompiledSteps.reorder` gathers the table's
rows (a few kilobytes) where the eager step copies every filled position of every cache
(``EagerSteps.reorder``: megabytes a step at 64 sentences of beam 4). A row's new position
is written into the cache row it owns from then on (the table's identity from the filled
positions on); the attention reads each key and value through the table in the compiled
loop that reads it.

At ``precision="int8"`` the products' weights are int8, quantized per output channel
(:func:`~transformerkit.kernels.lowprec.plain_int8`), and every package quantizes each input
row on its own scale, as the keras engine's int8 does
(:func:`~transformerkit.kernels.lowprec.rows_quantized_int8`): Inductor replaces the quantize and
dequantize operators by an int8 product (uint8 by int8, int32 sums), its own C++ template
(VNNI's 8-bit dot products where the CPU has them) or oneDNN's, whichever its timing at
the bucket's rows picked. At one row that took about half the time of the weight-only
product it replaced (int8 weights by bfloat16 rows, ``_weight_int8pack_mm``:
``docs/decoding.md``).

Each package picks its products' kernels by timing candidates at its example's rows
(``max_autotune``). The small-rows package times Inductor's own C++ kernels only
(``max_autotune_gemm_backends``): with the library's among the candidates, the build-time
timings picked the library's slower one-row kernels for some products in one build and not
the next (``docs/decoding.md``). The many-rows package times both (the library's float32
and bfloat16 products win at 64 rows, Inductor's int8 template mostly does).

The PyTorch functions used (``torch.export.export``, ``torch._inductor.
aoti_compile_and_package``, ``torch._inductor.aoti_load_package``) are listed in
:mod:`transformerkit.internals`.
"""

import dataclasses
import hashlib
import json
import os
import typing
import weakref

from transformerkit import precisions
from transformerkit.decoding import aot_packages
from transformerkit.decoding.aot_packages import cache_directory
from transformerkit.decoding.common import best_allowed
from transformerkit.decoding.eager_steps import EagerSteps, source_memories
from transformerkit.special_tokens import PAD_ID
from transformerkit.token_ids import check_token_ids

_TENSOR = object()  # marks a weight leaf held as a buffer
# model -> {directory: (the weights' versions, the compiled step or None)}
_RUNNERS = weakref.WeakKeyDictionary()
_INDICES = []  # CompiledSteps._index_tensor: the scalar tensor of each position, made once
_DIGESTS = weakref.WeakKeyDictionary()  # model -> (its weights' versions, their digest)
SMALL_ROWS = 4  # the most rows a step runs with the small-rows package
# bucket -> (rows of the example the products are chosen for, Inductor's options, rows a
# sentence of the example: 1, the graph takes one memory per row; 2, one per sentence,
# whether the package also makes greedy search's choice)
BUCKETS = {"small": (2, {"freezing": True, "max_autotune": True,
                       "max_autotune_gemm_backends": "CPP"}, 1, True),
           "large": (64, {"freezing": True, "max_autotune": True,
                          "max_autotune_gemm_backends": "ATEN,CPP",
                          "autotune_num_choices_displayed": 0}, 2, False)}
ENCODER = "encoder"  # the package of the encoder pass (any number of sentences and positions)
ENCODER_CONFIGS = {"freezing": True}
PREFILL = "prefill"  # a GPT's package of a prompt in one pass (any number of rows and positions)
PREFILL_CONFIGS = {"freezing": True}
# the packages that are not a row bucket's step: their kind (a package's file name) and options
WHOLE_PASSES = {ENCODER: ENCODER_CONFIGS, PREFILL: PREFILL_CONFIGS}
_BUILDING = {ENCODER: "the encoder pass", PREFILL: "the prompt's pass"}  # in the build lines
PRECISIONS = ("float32", "bfloat16", "int8")  # the products' precisions a package can have
FORMAT = 9  # the layout of a package's inputs and outputs, or the form of its captured code
# (8: the caches' rows read through a table; 9: the self-attention's query scaled before its
# products); a change makes every cached package stale
INT8_FORM = 3  # int8 packages' products (3: every package quantizes each input row); a change
# makes the cached int8 packages stale
KERNEL_CAPS = precisions.KERNEL_CAPS  # the environment's caps a package's code depends on


def weights_digest(model):
    """The sha256 hex digest of ``model``'s weights: each one's shape, dtype and bytes, in the
    model's structural order; computed once while the weights are unchanged (their in-place
    version counters)."""
    from transformerkit.models.base import weight_versions

    model._ensure_built()  # a model built lazily lists its weights once built
    versions = weight_versions(model)
    known = _DIGESTS.get(model)
    if known is not None and known[0] == versions and None not in versions:
        return known[1]
    digest = hashlib.sha256()
    for variable in model.weights:
        value = variable.value.detach().cpu().contiguous()
        digest.update(f"{tuple(value.shape)} {value.dtype}".encode())
        digest.update(value.numpy().tobytes())
    _DIGESTS[model] = (versions, digest.hexdigest())
    return digest.hexdigest()


def model_description(model):
    """What a package depends on of ``model`` besides its weights: its class and options (not
    Keras' ``get_config``: that holds the object's name, and a second model "transformer_1"
    of the same weights must share a package; its dtype policy's serialization imports
    modules for seconds)."""
    return {"class": type(model).__name__, "options": dataclasses.asdict(model.options)}


def package_key(model, bucket="small", precision="float32", weights=None, description=None):
    """The hex digest naming ``model``'s step package for the row ``bucket`` (or the
    :data:`ENCODER`'s) and the products' ``precision``: its weights' bytes (``weights``: their
    :func:`weights_digest` where already known, since a model's packages share it), its
    :func:`model_description` (``description``, where ``model`` is None: a model not loaded),
    the package format and options, PyTorch's version, the CPU's flags, the kernel caps
    in the environment (:data:`KERNEL_CAPS`; a package runs the kernels chosen for the CPU
    and caps it was built under) and PyTorch's intra-op threads
    (:func:`~.aot_packages.kernel_threads`: a package's own kernels run as many as there were
    when it was built)."""
    import torch

    weights = weights or weights_digest(model)
    description = description or model_description(model)
    digest = hashlib.sha256()
    packaged = ([bucket, WHOLE_PASSES[bucket]] if bucket in WHOLE_PASSES
                else BUCKETS[bucket])
    if precision == "int8":
        packaged = [*packaged, INT8_FORM]
    digest.update(json.dumps({"format": FORMAT, "bucket": packaged,
                              "precision": precision,
                              "torch": torch.__version__,
                              "class": description["class"],
                              "options": description["options"],
                              "cpu": sorted(precisions.cpu_flags()),
                              "vendor": precisions.cpu_vendor(),
                              "caps": {k: os.environ.get(k) for k in KERNEL_CAPS},
                              "threads": aot_packages.kernel_threads()},
                             sort_keys=True, default=str).encode())
    digest.update(weights.encode())
    return digest.hexdigest()[:32]


def package_path(directory, bucket, precision, weights, description):
    """Where the package of a model's ``bucket`` at ``precision`` is kept in ``directory``:
    named by :func:`package_key` from its ``weights`` digest and ``description``."""
    kind = bucket if bucket in WHOLE_PASSES else "step"
    key = package_key(None, bucket, precision, weights, description)
    return os.path.join(directory, f"{kind}-{key}.pt2")


def _weights_module(model, precision, forward, encoder=False):
    """A ``torch.nn.Module`` for ``torch.export`` calling ``forward(weights, *inputs)`` with
    ``model``'s step weights (at ``precision``, unpacked: :meth:`step_weights`) held as
    buffers; the encoder's only where ``encoder``; int8 weights in the form that quantizes
    each input row (:func:`~transformerkit.kernels.lowprec.rows_quantized_weights`)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from transformerkit.kernels.lowprec import rows_quantized_weights

    weights = dict(model.step_weights(precision, packed=False))
    if not encoder:
        weights.pop("encoder", None)
    weights = rows_quantized_weights(weights)
    leaves, spec = tree_flatten(weights)

    class Captured(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self._constants = [_TENSOR if isinstance(leaf, torch.Tensor) else leaf
                               for leaf in leaves]
            for i, leaf in enumerate(leaves):
                if isinstance(leaf, torch.Tensor):
                    self.register_buffer(f"weight_{i}", leaf.detach(), persistent=False)

        def forward(self, *inputs):
            values = [getattr(self, f"weight_{i}") if constant is _TENSOR else constant
                      for i, constant in enumerate(self._constants)]
            return forward(tree_unflatten(values, spec), *inputs)

    return Captured().eval()


def _step_module(model, precision="float32", chooses=False):
    """``model.decode_step`` as a module for ``torch.export`` (:func:`_weights_module`), one
    memory for the ``rows // sentences`` adjacent rows of each sentence; where ``chooses``,
    followed by greedy search's choice: ``(logits, best_allowed(logits, bias))``."""

    def step(weights, tokens, index, caches, cache_rows, memories, bias=None):
        # a symbolic int: the beams of a sentence, from the rows and the sentences
        copies = 1 if memories is None else tokens.shape[0] // memories[0][0].shape[0]
        logits = model.decode_step(tokens, index, caches, weights, memories, copies,
                                   cache_rows)
        return (logits, best_allowed(logits, bias)) if chooses else (logits,)

    return _weights_module(model, precision, step)


def _encoder_module(model, precision="float32"):
    """The encoder pass and the cross-attention memories of a batch
    (:func:`~.eager_steps.source_memories`, the eager code) as a module for
    ``torch.export``: ``(sentences, source_len)`` ids -> one ``(keys, values, bias, keep)``
    per decoder block."""

    def encode(weights, source_ids):
        return source_memories(model, source_ids, weights)

    return _weights_module(model, precision, encode, encoder=True)


def _prefill_module(model, precision="float32"):
    """A GPT's prompt in one pass (``model.decode_prefill``, the eager code) as a module for
    ``torch.export``: ``(rows, length)`` ids and the caches' first ``length`` positions
    (written in place) -> the last position's output ``(rows, d_model)``, which nothing
    reads (a program needs an output)."""

    def prefill(weights, tokens, caches):
        return (model.decode_prefill(tokens, caches, weights)[:, -1],)

    return _weights_module(model, precision, prefill)


def _prefill_inputs(model):
    """A prompt of 2 rows of 3 positions and its caches of 3 positions, and their dynamic
    dimensions (the rows, and the length the ids and the caches share)."""
    import torch

    rows, length = 2, 3
    ids = torch.tensor([[4, 5, 6], [7, 8, 9]], dtype=torch.long).clamp(max=model.vocab_size - 1)
    row_dim = torch.export.Dim("rows", min=1, max=4096)
    length_dim = torch.export.Dim("length", min=1, max=model.max_length)
    caches = [(torch.zeros(length, rows, model.num_heads, model.key_dim),
               torch.zeros(length, rows, model.num_heads, model.value_dim))
              for _ in range(model.num_layers)]
    cache_dims = [({0: length_dim, 1: row_dim}, {0: length_dim, 1: row_dim})
                  for _ in caches]
    return (ids, caches), ({0: row_dim, 1: length_dim}, cache_dims)


def _encoder_inputs(model):
    """Source ids of 2 sentences of 3 positions, one padded, and their dynamic dimensions."""
    import torch

    ids = torch.tensor([[4, 5, 3], [6, 3, PAD_ID]], dtype=torch.long)
    ids = ids.clamp(max=model.source_vocab_size - 1)
    sentences = torch.export.Dim("sentences", min=1, max=4096)
    source = torch.export.Dim("source_len", min=1, max=model.max_length)
    return (ids,), ({0: sentences, 1: source},)


def _example_inputs(model, seq2seq, rows=2, copies=1, chooses=False):
    """Inputs of the step's signature (``rows`` rows, ``copies`` a sentence, 5 cache
    positions of ``rows + 1`` cache rows and their table, 3 source positions, where
    ``chooses`` the choice's bias row) and their dynamic dimensions (``copies`` 1: the
    sentences are the rows; else a dimension of their own)."""
    import torch

    length, source_len, batch, slots = 5, 3, rows // copies, rows + 1
    heads = model.num_heads
    layers = model.num_decoder_layers if seq2seq else model.num_layers
    row_dim = torch.export.Dim("rows", min=1, max=4096)
    slot_dim = torch.export.Dim("slots", min=1, max=4096)
    sentences = (row_dim if copies == 1
                 else torch.export.Dim("sentences", min=1, max=4096))
    cache_len = torch.export.Dim("cache_len", min=2, max=model.max_length + 1)
    tokens = torch.full((rows,), 3, dtype=torch.long)
    index = torch.tensor(1, dtype=torch.long)
    caches = [(torch.zeros(length, slots, heads, model.key_dim),
               torch.zeros(length, slots, heads, model.value_dim)) for _ in range(layers)]
    cache_dims = [({0: cache_len, 1: slot_dim}, {0: cache_len, 1: slot_dim})
                  for _ in range(layers)]
    table = torch.arange(rows).flip(0).expand(length, rows).contiguous()
    table_dims = {0: cache_len, 1: row_dim}
    bias = ((torch.zeros(1, model.target_vocab_size if seq2seq else model.vocab_size),)
            if chooses else ())
    if not seq2seq:
        return ((tokens, index, caches, table, None, *bias),
                ({0: row_dim}, None, cache_dims, table_dims, None, *(None for _ in bias)))
    source = torch.export.Dim("source_len", min=1, max=model.max_length)
    memories = [(torch.zeros(batch, heads, source_len, model.key_dim),
                 torch.zeros(batch, heads, source_len, model.value_dim),
                 torch.zeros(batch, 1, 1, source_len), torch.ones(batch, 1, 1, 1))
                for _ in range(layers)]
    memory_dims = [({0: sentences, 2: source}, {0: sentences, 2: source},
                    {0: sentences, 3: source}, {0: sentences}) for _ in range(layers)]
    return ((tokens, index, caches, table, memories, *bias),
            ({0: row_dim}, None, cache_dims, table_dims, memory_dims, *(None for _ in bias)))


def export_step(model, bucket, precision="float32"):
    """``model``'s step (or, for :data:`ENCODER`, its encoder pass) with its products at
    ``precision``, as the row ``bucket``'s package captures it: ``torch.export``'s program,
    its rows, cache length and source length dynamic (the graph
    ``bench/openvino_step.py`` also hands to OpenVINO)."""
    import torch

    if bucket == ENCODER:
        module, (inputs, dims) = _encoder_module(model, precision), _encoder_inputs(model)
    elif bucket == PREFILL:
        module, (inputs, dims) = _prefill_module(model, precision), _prefill_inputs(model)
    else:
        rows, _, copies, chooses = BUCKETS[bucket]
        module = _step_module(model, precision, chooses)
        inputs, dims = _example_inputs(model, hasattr(model, "decoder_blocks"), rows, copies,
                                       chooses)
    with torch.no_grad():
        # the module's forward takes *inputs: one tuple, whose dimensions are ``dims``
        return torch.export.export(module, inputs, dynamic_shapes=(dims,), strict=False)


def build_package(model, bucket, path, precision="float32"):
    """Capture ``model``'s step with its products at ``precision`` (:func:`export_step`) and
    compile it for the row ``bucket`` into the package ``path`` (written atomically)."""
    import torch

    configs = WHOLE_PASSES[bucket] if bucket in WHOLE_PASSES else BUCKETS[bucket][1]
    program = export_step(model, bucket, precision)
    with torch.no_grad():
        aot_packages.compile_program(program, path, configs)


class TabledCaches(typing.NamedTuple):
    """The compiled engine's decoding state: the caches and where each row's positions are
    in them. A beam search that reorders its beams, or drops finished sentences, gathers the
    table (a few kilobytes) in place of the caches' filled positions (megabytes a step at
    64 sentences); a step reads each key and value through it in the loop that reads them
    (``MultiHeadAttention.step``'s ``cache_rows``; a tenth of a beam 4 search's time had been
    the caches' copies: ``docs/decoding.md``)."""

    caches: list  # one (keys, values) per block, (max_len, slots, heads, dim), slots >= rows
    rows: object  # (max_len, rows) int64: the caches' row of each row's position


class CompiledSteps(EagerSteps):
    """:class:`~.eager_steps.EagerSteps` whose ``step`` calls the AOTInductor package of the
    model's ``decode_step`` (the module docstring). The first batch loads the packages from
    :func:`cache_directory`, building them there first if needed (with a line on stderr
    giving the time); where that fails the eager step runs, with a one-line warning saying
    why."""

    def __init__(self, model, precision="float32", directory=None):
        if precision not in PRECISIONS:
            raise ValueError(f"the compiled step runs {' or '.join(PRECISIONS)}; got "
                             f"precision {precision}")
        super().__init__(model, precision)
        self.directory = directory or cache_directory()
        self._run = None  # the package of the batch being decoded (start)

    def runner(self):
        """The model's :class:`Packages` (None where the small-rows one cannot be had: the
        eager step), kept for the model while its weights are unchanged (their in-place
        version counters)."""
        from transformerkit.models.base import weight_versions

        versions = weight_versions(self.model)
        loaded = _RUNNERS.setdefault(self.model, {})
        where = (self.directory, self.precision)
        if where not in loaded or loaded[where][0] != versions or None in versions:
            packages = Packages(self.model, self.directory, self.precision)
            loaded[where] = (versions, packages if packages.get("small") else None)
        return loaded[where][1]

    def start(self, *args, **kwargs):
        """:meth:`EagerSteps.start`, with every memory's ``keep`` a tensor (the package's
        inputs have one fixed form) and the package looked up once per batch."""
        self._run = self.runner()
        state, (weights, memories, copies) = super().start(*args, **kwargs)
        if memories is not None:
            memories = [memory if memory[3] is not None
                        else (*memory[:3], memory[0].new_ones((memory[0].shape[0], 1, 1, 1)))
                        for memory in memories]
        self._memories = self._row_memories = None
        return TabledCaches(state, self._identity(state, state[0][0].shape[1])), \
            (weights, memories, copies)

    @staticmethod
    def _identity(caches, rows):
        """The table of ``caches`` whose ``rows`` rows each own their row:
        ``(max_len, rows)`` int64, ``table[p, r] = r`` (contiguous, as a package reads it)."""
        import torch

        keys = caches[0][0]
        return torch.arange(rows, device=keys.device).expand(keys.shape[0], rows).contiguous()

    def first_step_of_copies(self, buffer, state, static):
        """:meth:`EagerSteps.first_step_of_copies` on the caches of ``state``, whose rows
        then own their rows (a search's first step)."""
        logits, _ = super().first_step_of_copies(buffer, state.caches, static)
        return logits, state

    def reorder(self, state, rows, filled):
        """Beam search (and a search dropping finished rows): the new rows ``rows`` take
        their positions ``0..filled-1`` from those rows of the table; the caches stay as they
        are. From ``filled`` on, row ``r`` owns the caches' row ``r``: the next step writes
        its position ``filled`` there (no row reads that position of any other row)."""
        import torch

        table = state.rows
        rows = torch.as_tensor(rows, device=table.device).long()
        new = table.new_empty((table.shape[0], rows.shape[0]))
        torch.index_select(table[:filled], 1, rows, out=new[:filled])
        new[filled:] = torch.arange(rows.shape[0], device=table.device)
        return TabledCaches(state.caches, new)

    def _start_seq2seq(self, source_ids, max_len, copies=1):
        """:meth:`EagerSteps._start_seq2seq` with the encoder pass and the memories computed
        by the encoder's package (the eager code where there is none)."""
        encode = None if self._run is None else self._run.get(ENCODER)
        if encode is None:
            return super()._start_seq2seq(source_ids, max_len, copies)
        import torch

        from transformerkit.decoding.loop_ops import tensor_device

        model = self.model
        ids = torch.as_tensor(check_token_ids(source_ids, model.source_vocab_size,
                                              model.max_length, "source_ids"),
                              device=tensor_device()).long()
        memories = encode(ids)
        state = self._empty_caches(ids.shape[0] * copies, max_len, memories[0][2])
        # no weights: the packages hold theirs (a step without a package fetches them)
        return state, (None, memories, copies)

    def step_choosing(self, buffer, index, state, static, bias):
        """:meth:`step` and greedy search's choice in the same native call: ``(logits,
        best_allowed(logits, bias) (rows,) int32, state)`` (:func:`~.common.best_allowed`;
        ``bias`` ``(1, vocab)`` float32, 0 where an id is allowed, -inf where not: a
        :class:`~.common.TokenRules` row), the choice None where the step's package does
        not make it (many rows: the caller chooses)."""
        import torch

        tokens = (buffer if isinstance(buffer, torch.Tensor)
                  else torch.as_tensor(buffer))[:, index].long()
        logits, best = self._decode(tokens, index, state, static, bias)
        return logits, best, state

    def _decode(self, tokens, index, caches, static, bias=None):
        """The package's step (the eager one where there is none): every step of a
        search, the first of a beam search's copies included. ``caches``: a
        :class:`TabledCaches`, or caches whose rows own their rows. Returns the logits; with
        a ``bias`` row, ``(logits, best_allowed(logits, bias) or None)``: None where the
        bucket's package does not choose (or the step runs eagerly)."""
        if isinstance(caches, TabledCaches):
            caches, table = caches
        else:
            table = self._identity(caches, tokens.shape[0])
        package = None
        if self._run is not None:
            bucket = self._run.bucket(tokens.shape[0])
            package = self._run.get(bucket)
        if package is None:
            logits = self._eager_decode(tokens, index, caches, static, table)
            return logits if bias is None else (logits, None)
        _, memories, copies = static
        if BUCKETS[bucket][2] == 1:  # a package that takes one memory per row
            memories = self._per_row(memories, copies)
        position = self._index_tensor(index)
        if bias is None:
            return package(tokens, position, caches, table, memories,
                           self._no_bias(tokens.device))[0]
        return package(tokens, position, caches, table, memories, bias)

    @staticmethod
    def _index_tensor(index):
        """``torch.tensor(index)``, made once per position for the process (the loop asks
        for one a step; a package only reads it)."""
        try:
            return _INDICES[index]
        except IndexError:
            import torch

            _INDICES.extend(torch.tensor(i) for i in range(len(_INDICES), index + 1))
            return _INDICES[index]

    def _no_bias(self, device):
        """The bias row of a step whose choice is not used (every id allowed), on
        ``device``."""
        zeros = getattr(self, "_zeros", None)
        if zeros is None or zeros.device != device:
            import torch

            zeros = self._zeros = torch.zeros(1, self.vocab_size, device=device)
        return zeros

    def _eager_decode(self, tokens, index, caches, static, table):
        """The eager step, where this batch's row bucket has no package (the weights
        fetched here where the batch started without them), through the caches' ``table``."""
        weights, memories, copies = static
        model = self._eager_model()
        if weights is None:
            weights = model.step_weights(self.precision)
        return model.decode_step(tokens, index, caches, weights, memories, copies, table)

    def _eager_model(self):
        """The model whose eager step stands in for a missing package."""
        return self.model

    def search_work(self, work, settings):
        """A beam search's work of a step (``work``, for the search ``settings``) as one
        native call: :func:`~.aot_search.compiled_search_work` (``work`` itself where this
        batch's step runs eagerly)."""
        if self._run is None:
            return work
        from transformerkit.decoding.aot_search import compiled_search_work

        return compiled_search_work(work, settings, self.directory)

    def _per_row(self, memories, copies):
        """``memories`` (one per sentence) with each repeated for its ``copies`` rows, made
        again only when a search's ``select_sources`` has changed them."""
        if memories is None or copies == 1:
            return memories
        if self._memories is not memories:
            self._memories = memories
            self._row_memories = [tuple(t.repeat_interleave(copies, 0) for t in memory)
                                  for memory in memories]
        return self._row_memories


class Packages:
    """A model's step packages by row bucket, each loaded (or built) when a step first
    needs it: a one-sentence translation never loads the many-rows one."""

    def __init__(self, model, directory, precision="float32"):
        self.model, self.directory, self.precision = model, directory, precision
        self._loaded = {}

    def get(self, bucket):
        """The loaded package of ``bucket`` as a step function (None, warned once, where it
        cannot be had)."""
        if bucket not in self._loaded:
            model, precision = self.model, self.precision
            path = package_path(self.directory, bucket, precision, weights_digest(model),
                                model_description(model))
            run = aot_packages.load_or_build(
                path, lambda path: build_package(model, bucket, path, precision),
                "the compiled step", _BUILDING.get(bucket, f"the decoder step ({bucket} steps)"),
                "decoding with the eager step")
            self._loaded[bucket] = None if run is None else package_call(bucket, run)
        return self._loaded[bucket]

    @staticmethod
    def bucket(rows):
        """The bucket of a step of ``rows`` rows."""
        return "small" if rows <= SMALL_ROWS else "large"


def package_call(bucket, run):
    """A loaded package's flat call ``run`` (:func:`~.aot_packages.load`) as the step of a
    row ``bucket`` (``(tokens, index, caches, cache_rows, memories, bias) -> (logits, best
    or None)``), as the encoder pass (``source_ids -> memories``) or as a GPT's prompt pass
    (``(tokens, caches) -> None``, the caches written in place)."""
    if bucket == ENCODER:
        return _encoder_call(run)
    if bucket == PREFILL:
        return _prefill_call(run)
    return _flat_call(run, BUCKETS[bucket][3])


def _flat_call(run, chooses):
    """``package(tokens, index, caches, cache_rows, memories, bias)``, its ``(logits, best)``
    (``best`` None where the package does not ``chooses``: ``bias`` is not passed), without
    the package's own call's per-step work (parsing its input and output specs, flattening
    and unflattening them: about a third of a one-row step): the tensors handed to its
    loader's ``boxed_run`` (``run``) in ``torch.export``'s flattening order."""

    def step(tokens, index, caches, cache_rows, memories, bias):
        flat = [tokens, index, *_flat_caches(caches), cache_rows]
        for memory in memories or ():
            flat.extend(memory)
        if chooses:
            flat.append(bias)
            return run(flat)
        return run(flat)[0], None

    return step


def _prefill_call(run):
    """``package(tokens, caches)``: a prompt ``(rows, length)`` written into ``caches``
    (each ``(length, rows, heads, dim)``, contiguous) in place (through the loader's
    ``boxed_run``, ``run``, as :func:`_flat_call`)."""

    def prefill(tokens, caches):
        run([tokens, *_flat_caches(caches)])

    return prefill


def _flat_caches(caches):
    """The caches' tensors in ``torch.export``'s flattening order: each block's keys, then
    its values."""
    return [t for pair in caches for t in pair]


def _encoder_call(run):
    """``package(source_ids)``: the memories, one ``(keys, values, bias, keep)`` per decoder
    block (through the loader's ``boxed_run``, ``run``, as :func:`_flat_call`)."""

    def encode(source_ids):
        flat = run([source_ids])
        return [tuple(flat[i:i + 4]) for i in range(0, len(flat), 4)]

    return encode
