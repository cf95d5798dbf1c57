"""The compiled engine without Keras: a weights file's packages, found by the file's digest.

A model's packages (:mod:`.aot_step`) are named by its weights' digest and options, which
take the model loaded; loading it takes Keras, whose import is most of a one-sentence
``transformerkit translate RUN TEXT --engine compiled`` (``bench/compiled_step.py``). So
when :func:`transformerkit.load` loads a ``.keras`` file for the compiled engine,
:func:`record` writes beside the packages what names them: ``files/<the file's
sha256>.json`` holds the weights' digest, the model's class, options and size. A
later load of the same file (the same bytes) finds it (:func:`packaged_model`): where
the packages of a one-sentence answer are built (:data:`NEEDED`: a translation's encoder
pass and small-rows step, a GPT's small-rows step, at the precision asked for), the run
decodes with a :class:`PackagedModel` standing for the model, whose steps
(:class:`PackagedSteps`) call those packages. Neither Keras nor the weights are read.

The stand-in holds no weights. Where a batch needs a package that is not built (the
many-rows step of a larger batch, another precision) or that fails to load, the model is
loaded then, once (:meth:`PackagedModel.loaded`: the run's own, so the run decodes with it
from then on), and the package built as the compiled engine always builds it; where even
that cannot be had, the eager step of the loaded model runs.

A GPT's prompt fills the caches through the step package, one position a call, where its
shared prefix is shorter than :data:`PROMPT_PACKAGE_FROM` positions; a longer one through the
prompt package (:data:`~.aot_step.PREFILL`: ``decode_prefill`` captured), in one native
call, which is loaded from disk, or built as any missing package is (the model loaded once).
Both are the loaded model's cached math, whose engine runs the prefix in one eager pass, to
its round-off. A step costs a position about 16 ms (GPT-2 124M in float32, one thread),
loading the prompt package about 0.3 s and memory for its copy of the weights (about 1 GB
more at the peak for GPT-2 124M in float32), so a short prefix is stepped
(``bench/prompt_pass.py``: the package with its load overtakes stepping between 16 and 32
positions).
"""

import json
import os

from transformerkit.decoding import aot_packages
from transformerkit.decoding.aot_step import (
    ENCODER,
    PRECISIONS,
    PREFILL,
    CompiledSteps,
    Packages,
    model_description,
    package_call,
    package_path,
    weights_digest,
)
from transformerkit.files import atomic_write_text
from transformerkit.token_ids import check_token_ids

FORMAT = 1  # the layout of a record; another is not read
RECORDS = "files"  # the folder of the records, in the packages' folder
# the packages a model's class needs on disk for its stand-in to answer one short request
NEEDED = {"Transformer": (ENCODER, "small"), "GPT": ("small",)}
# the shortest prompt prefix a GPT's stand-in fills with its prompt package (a shorter one goes
# through the step package a position a call): loading the package (GPT-2 124M in float32:
# 0.28 s) costs about as much as stepping 18 positions (bench/results/prompt_pass.*); below 32
# the time it saves is small beside the memory its copy of the weights takes
PROMPT_PACKAGE_FROM = 32


def record_path(directory, file_digest):
    """Where the record of the ``.keras`` file of sha256 ``file_digest`` is kept."""
    return os.path.join(directory, RECORDS, f"{file_digest}.json")


def record(file_digest, model, directory=None):
    """Write the record of a ``.keras`` file (its sha256 ``file_digest``) from which
    ``model`` was loaded: the weights' digest, the model's description (class and options)
    and its number of weights, atomically; unchanged where the same record is there."""
    directory = directory or aot_packages.cache_directory()
    text = json.dumps({"format": FORMAT, "weights": weights_digest(model),
                       **model_description(model), "parameters": int(model.count_params())},
                      sort_keys=True, default=str)
    path = record_path(directory, file_digest)
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_text(path, text)


def read_record(file_digest, directory=None):
    """The record of the file of sha256 ``file_digest`` (a dict), or None where there is
    none, or it is unreadable or of another format."""
    path = record_path(directory or aot_packages.cache_directory(), file_digest)
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("format") != FORMAT \
            or not {"weights", "class", "options"} <= found.keys():
        return None
    return found


def packaged_model(file_digest, precision="float32", directory=None):
    """A :class:`PackagedModel` for the ``.keras`` file of sha256 ``file_digest`` where it
    can decode without its model: a record of the file, a ``Transformer``'s or a ``GPT``'s,
    the packages of a one-sentence answer at ``precision`` on disk (:data:`NEEDED`), the
    PyTorch backend with its shortcuts on and no GPU (the packages are the CPU's). Else
    None: the model is loaded as usual."""
    from transformerkit import fastpath
    from transformerkit.decoding.compiled import backend
    from transformerkit.decoding.loop_ops import tensor_device

    if precision not in PRECISIONS or backend() != "torch" or not fastpath.applies() \
            or tensor_device().type != "cpu":
        return None
    directory = directory or aot_packages.cache_directory()
    found = read_record(file_digest, directory)
    if found is None or found["class"] not in NEEDED:
        return None
    packaged = PackagedModel(found, directory)
    if not all(os.path.exists(packaged.package_path(bucket, precision))
               for bucket in NEEDED[found["class"]]):
        return None
    return packaged


class PackagedModel:
    """A ``Transformer`` or ``GPT`` standing in for its model in the search loops, from its
    file's record (:func:`record`): its shapes (``max_length``, vocabulary sizes, the
    decoder's layers, heads and widths) and :meth:`packages`, the step's packages by row
    bucket.

    Args:
        found: the record (:func:`read_record`).
        directory: the packages' folder.
        load: a function giving the loaded model (the run's: :meth:`transformerkit.api.
            Run.use_packages` sets it), called where a package is missing or the eager
            step must run.
    """

    def __init__(self, found, directory, load=None):
        self.weights = found["weights"]
        self.description = {"class": found["class"], "options": found["options"]}
        self.parameters = found.get("parameters")
        self.directory = directory
        self.load = load
        self._packages = {}  # precision -> _FilePackages
        options = found["options"]
        self.seq2seq = found["class"] == "Transformer"
        self.max_length = options["max_length"]
        self.num_heads = options["num_heads"]
        self.key_dim = options["key_dim"]
        self.value_dim = options["value_dim"]
        if self.seq2seq:
            self.source_vocab_size = options["source_vocab_size"]
            self.target_vocab_size = options["target_vocab_size"]
            self.num_decoder_layers = options["num_decoder_layers"] or options["num_layers"]
        else:
            self.vocab_size = options["vocab_size"]
            self.num_layers = options["num_layers"]

    def __repr__(self):
        return f"PackagedModel({self.description['class']}, weights {self.weights[:12]})"

    def package_path(self, bucket, precision):
        """The path of the package of ``bucket`` at ``precision``
        (:func:`~.aot_step.package_path`)."""
        return package_path(self.directory, bucket, precision, self.weights, self.description)

    def loaded(self):
        """The model itself (loaded by the run on first need; Keras is imported then)."""
        import torch

        if self.load is None:
            raise RuntimeError("this packaged model has no model to load (no run set load)")
        with torch.inference_mode(False):  # asked while decoding: its weights must be able
            return self.load()            # to train and count their versions

    def packages(self, precision):
        """The step's packages at ``precision`` by row bucket (a :class:`~.aot_step.Packages`
        interface), each loaded from its file when first needed."""
        if precision not in self._packages:
            self._packages[precision] = _FilePackages(self, precision)
        return self._packages[precision]

    def _ensure_built(self):
        """Nothing to build (the search loops ask a model to be built before decoding)."""


class _FilePackages:
    """A :class:`PackagedModel`'s packages at one precision: each loaded from its file when a
    step first needs it; where it is not there or fails to load, the loaded model's
    (:class:`~.aot_step.Packages`: built, or None where it cannot be)."""

    bucket = staticmethod(Packages.bucket)

    def __init__(self, packaged, precision):
        self.packaged, self.precision = packaged, precision
        self._loaded = {}

    def get(self, bucket):
        if bucket not in self._loaded:
            path = self.packaged.package_path(bucket, self.precision)
            call = None
            if os.path.exists(path):
                try:
                    call = package_call(bucket, aot_packages.load(path))
                except Exception:  # corrupt: the model's Packages builds it again
                    call = None
            if call is None:
                packaged = self.packaged
                call = Packages(packaged.loaded(), packaged.directory, self.precision).get(bucket)
            self._loaded[bucket] = call
        return self._loaded[bucket]


class PackagedSteps(CompiledSteps):
    """:class:`~.aot_step.CompiledSteps` of a :class:`PackagedModel`: the same steps over the
    packages of its file (the module docstring); where a package cannot be had, the loaded
    model's eager code."""

    def __init__(self, packaged, precision="float32"):
        if precision not in PRECISIONS:
            raise ValueError(f"the compiled step runs {' or '.join(PRECISIONS)}; got "
                             f"precision {precision}")
        self.model, self.precision = packaged, precision
        self.seq2seq = packaged.seq2seq
        self.vocab_size = packaged.target_vocab_size if self.seq2seq else packaged.vocab_size
        self.directory = packaged.directory
        self._run = None

    def runner(self):
        return self.model.packages(self.precision)

    def _start_seq2seq(self, source_ids, max_len, copies=1):
        """The encoder's package on the batch: memories, empty caches; no weights."""
        import torch

        encode = self._run.get(ENCODER)
        if encode is None:  # the loaded model's eager encoder pass
            return self._eager()._start_seq2seq(source_ids, max_len, copies)
        model = self.model
        ids = torch.as_tensor(check_token_ids(source_ids, model.source_vocab_size,
                                              model.max_length, "source_ids")).long()
        memories = encode(ids)
        state = self._empty_caches(ids.shape[0] * copies, max_len, memories[0][2])
        return state, (None, memories, copies)

    def _start_language_model(self, buffer, prefill, max_len):
        """Empty caches, the prompt's shared prefix ``buffer[:, :prefill]`` written into them
        by the step's package one position a call, or from :data:`PROMPT_PACKAGE_FROM`
        positions on by the prompt package (the module docstring); no weights."""
        if prefill >= PROMPT_PACKAGE_FROM:
            fill = self._run.get(PREFILL)  # its file, else built from the loaded model
            if fill is None:  # it cannot be built: the loaded model's eager pass
                return self._eager()._start_language_model(buffer, prefill, max_len)
            return self._fill_prompt(fill, buffer, prefill, max_len)
        return self._step_prompt(buffer, prefill, max_len)

    def _step_prompt(self, buffer, prefill, max_len):
        """Empty caches with ``buffer[:, :prefill]`` written into them by the step's package,
        one position a call; no weights."""
        import torch

        buffer = torch.as_tensor(buffer).long()
        state = self._empty_caches(buffer.shape[0], max_len, torch.empty(0))
        static = (None, None, 1)
        for index in range(prefill):
            self._decode(buffer[:, index], index, state, static)
        return state, static

    def _fill_prompt(self, fill, buffer, prefill, max_len):
        """Empty caches with ``buffer[:, :prefill]`` written into them by the prompt package
        ``fill``; no weights."""
        import torch

        # the ids were checked where they entered (``generate_once``)
        tokens = torch.as_tensor(buffer)[:, :prefill].long().contiguous()
        state = self._empty_caches(tokens.shape[0], max_len, torch.empty(0))
        # the caches' first positions: contiguous views the package writes in place
        fill(tokens, [tuple(t[:prefill] for t in pair) for pair in state])
        return state, (None, None, 1)

    def _eager_model(self):
        """The loaded model (its Keras file read on first use), whose eager step stands in
        for a row bucket without a package."""
        return self.model.loaded()

    def _eager(self):
        """The loaded model's eager steps (:class:`~.eager_steps.EagerSteps`)."""
        from transformerkit.decoding.eager_steps import EagerSteps

        return EagerSteps(self._eager_model(), self.precision)
