"""Every private Keras or PyTorch API transformerkit uses, in one place.

The shortcuts of :mod:`transformerkit.fastpath` reach a few internals for which Keras 3 and
PyTorch have no public equivalent. They were tested with the versions in :data:`TESTED`
(``pyproject.toml`` pins Keras to that minor version). Each is looked up here when first
needed; if an installed release lacks one, :func:`available` says so with a one-time
warning and the caller takes the plain Keras path instead of crashing. Private attributes
of Keras objects (a compiled model's loss tracker, a built optimizer's accumulators) are
read through :func:`attribute`, which answers None (and warns once) where one is missing.

=========================  ===========================================================
internal                   used by, and why
=========================  ===========================================================
``get_autocast_scope``     ``layers/calls.py``: a direct sub-layer call must not skip
                           an enclosing mixed-precision autocast scope
``AutocastScope``          ``kernels/cast_once.py``: the mixed-precision training
                           step's scope, a subclass casting each weight once per step
                           (without it, Keras' scope casts at every use)
``in_stateless_scope``     ``training/optimizers.py``: inside a stateless scope the
                           update must go through Keras (no in-place kernels)
``torch._foreach_norm``,   ``training/optimizers.py``: global-norm clipping in two
``torch._foreach_mul_``    kernels
``torch._fused_adam_``,    ``training/optimizers.py``: the Adam / AdamW update in one
``torch._fused_adamw_``    kernel per parameter group
optimizer hooks            ``training/optimizers.py``, ``training/gpt_recipe.py``: the
                           overridden ``_clip_gradients``, ``_apply_weight_decay``,
                           ``_backend_update_step``, ``_use_weight_decay`` and a built
                           Adam's moments ``_momentums`` / ``_velocities`` (without
                           them, Keras' own update)
model train-step parts     ``training/step.py``: ``Model._clear_losses``,
                           ``Model._compute_loss`` and a compiled model's
                           ``_loss_tracker`` (the pieces of Keras' own ``train_step``);
                           without them the step is Keras' own
saving references          ``training/processes.py``: ``saving_lib.get_attr_skipset``
                           and ``global_state.set_global_attribute``, to build the
                           objects ``model.save`` compares against before several JAX
                           processes share a distribution (without them a save by rank 0
                           alone may wait for the other processes)
oneDNN linear kernels      ``kernels/products.py``: ``torch.ops.mkldnn._reorder_linear_weight``
                           packs a weight once into oneDNN's blocked layout for inference
                           and ``torch.ops.mkldnn._linear_pointwise`` multiplies by it (the
                           kernels of PyTorch's own frozen-graph linear), faster than
                           ``addmm`` for decoding's products on AMD CPUs
                           (``kernels/products.py``); ``Tensor._version`` tells when a
                           packed weight is stale (without it the weights are packed on every call);
                           ``_linear_pointwise`` also computes the training step's large
                           ``Dense`` products and their input gradients (``_OneDNNLinear``,
                           faster than ``mm`` there, measured with its commit);
                           ``kernels/lowprec.py`` packs bfloat16 weights with the same
                           two kernels (where oneDNN refuses bfloat16: emulated)
int8 dynamic products      ``kernels/lowprec.py``: ``torch.quantize_per_channel``
                           (deprecated), ``torch.ops.quantized.linear_prepack`` and
                           ``torch.ops.quantized.linear_dynamic``, the kernels of
                           ``torch.ao``'s dynamic ``Linear``, for ``precision int8``
                           (without them the same arithmetic runs in float32)
optimizer accumulators     ``training/step.py: GradientAllReduce``: a built optimizer's
                           ``_accumulated_gradients``, ``_iterations`` (the micro-batch
                           count) and ``_get_variable_index``, to exchange gradients once
                           per update (without them each micro-batch's gradient is
                           all-reduced, with the same result)
int8 rows of compiled      ``kernels/lowprec.py``: ``torch.ops.quantized_decomposed``'s
steps                      ``quantize_per_tensor``, ``dequantize_per_tensor`` and
                           ``dequantize_per_channel`` (registered by importing
                           ``torch.ao.quantization.fx._decomposed``), which Inductor's
                           freezing replaces by a packed int8 product: the
                           compiled engine's ``precision int8`` (without
                           them the int8 values widened to bfloat16)
AOTInductor                ``decoding/aot_packages.py`` (the packages of ``aot_step`` and
                           ``aot_search``): ``torch._inductor.aoti_compile_and_package``
                           compiles an exported program (the decoder step, the encoder
                           pass, a beam search's work) into a package and
                           ``aoti_load_package`` loads it (PyTorch's documented AOTInductor
                           entry points, in a private module; without them the eager code
                           runs, with a warning); the loader those load with,
                           ``torch._C._aoti.AOTIModelPackageLoader``, made directly (without
                           importing Inductor: 2 s of a one-sentence translation; without
                           it, ``aoti_load_package``), whose ``boxed_run`` runs a package
                           on its flat inputs (without it the eager code runs); and
                           ``torch._C._aoti.AOTIModelContainerRunnerCpu``, which runs a
                           CPU package's library where ``aot_packages`` extracted it
                           once (the package loader copies the whole library out of the
                           archive at every load: 0.3 to 0.9 s a process for a GPT-2
                           124M float32 package; without it, the package loader);
                           ``aot_packages.quiet_configs`` sets Inductor's options
                           ``max_autotune_report_choices_stats`` (False) and
                           ``autotune_num_choices_displayed`` (0) where
                           ``torch._inductor.config`` has them (without them, a JSON line
                           and a table per tuned product on stderr while a package compiles)
``Layer._flatten_layers``  ``models/base.py: compute_in_float32``: every layer of a model
                           trained in ``mixed_bfloat16``, to set it to compute in float32
                           for decoding (without it the model decodes at its training
                           policy, through Keras' casts: correct, and slower)
=========================  ===========================================================
"""

import importlib
import warnings

TESTED = {"keras": "3.15", "torch": "2.13"}

# name -> (module, attribute) of a private function
_FUNCTIONS = {
    "get_autocast_scope": ("keras.src.backend", "get_autocast_scope"),
    "autocast_scope": ("keras.src.backend", "AutocastScope"),
    "in_stateless_scope": ("keras.src.backend.common.stateless_scope", "in_stateless_scope"),
    "foreach_norm": ("torch", "_foreach_norm"),
    "foreach_mul_": ("torch", "_foreach_mul_"),
    "fused_adam_": ("torch", "_fused_adam_"),
    "fused_adamw_": ("torch", "_fused_adamw_"),
    "saving_attr_skipset": ("keras.src.saving.saving_lib", "get_attr_skipset"),
    "set_global_attribute": ("keras.src.backend.common.global_state", "set_global_attribute"),
    "onednn_pack": ("torch", "ops.mkldnn._reorder_linear_weight"),
    "onednn_linear": ("torch", "ops.mkldnn._linear_pointwise"),
    "int8_quantize": ("torch", "quantize_per_channel"),
    "int8_prepack": ("torch", "ops.quantized.linear_prepack"),
    "int8_linear": ("torch", "ops.quantized.linear_dynamic"),
    # importing it registers the operators ``torch.ops.quantized_decomposed.*``
    "quantized_decomposed": ("torch.ao.quantization.fx._decomposed", "quantized_decomposed_lib"),
    "aoti_compile_and_package": ("torch._inductor", "aoti_compile_and_package"),
    "aoti_load_package": ("torch._inductor", "aoti_load_package"),
    "aoti_package_loader": ("torch", "_C._aoti.AOTIModelPackageLoader"),
    "aoti_runner_cpu": ("torch", "_C._aoti.AOTIModelContainerRunnerCpu"),
}
# name -> (module, class, private members that our code overrides or reads)
_MEMBERS = {
    "optimizer_hooks": ("keras", "optimizers.Adam",
                        ("_clip_gradients", "_apply_weight_decay", "_backend_update_step",
                         "_use_weight_decay", "_get_variable_index")),
}
# name -> (the Keras class whose instances have it, private attribute), read by attribute()
_ATTRIBUTES = {
    "clear_losses": ("keras.Model", "_clear_losses"),
    "compute_loss": ("keras.Model", "_compute_loss"),
    "loss_tracker": ("keras.Model", "_loss_tracker"),  # set by Model.__init__
    "accumulated_gradients": ("keras.optimizers.Optimizer", "_accumulated_gradients"),
    "micro_batches": ("keras.optimizers.Optimizer", "_iterations"),  # iterations: updates
    "variable_index": ("keras.optimizers.Optimizer", "_get_variable_index"),
    "adam_momentums": ("keras.optimizers.Adam", "_momentums"),  # set by Adam.build
    "adam_velocities": ("keras.optimizers.Adam", "_velocities"),
    "flatten_layers": ("keras.Model", "_flatten_layers"),
}
# what Keras' own train_step is made of, for the PyTorch shortcut of training/step.py
TRAIN_STEP_PARTS = ("clear_losses", "compute_loss", "loss_tracker")
_found = {}


def get(name):
    """The private function ``name`` (a key of ``_FUNCTIONS``), or None when missing."""
    if name not in _found:
        module, attribute = _FUNCTIONS[name]
        try:
            value = importlib.import_module(module)
            for part in attribute.split("."):
                value = getattr(value, part)
        except (ImportError, AttributeError, RuntimeError):
            value = None
        _found[name] = value
        if value is None:
            _warn(f"{module}.{attribute}")
    return _found[name]


def available(name):
    """Whether every private member listed under ``name`` exists (a key of ``_MEMBERS`` or
    ``_FUNCTIONS``); warns once when not."""
    if name in _FUNCTIONS:
        return get(name) is not None
    if name not in _found:
        module, path, members = _MEMBERS[name]
        owner = importlib.import_module(module)
        for part in path.split("."):
            owner = getattr(owner, part)
        missing = [m for m in members if not hasattr(owner, m)]
        _found[name] = not missing
        if missing:
            _warn(", ".join(f"{module}.{path}.{m}" for m in missing))
    return _found[name]


def attribute(owner, name):
    """The private attribute ``name`` (a key of ``_ATTRIBUTES``) of the Keras object
    ``owner`` (bound, for a method), or None when ``owner`` lacks it; warns once per name."""
    value = getattr(owner, _ATTRIBUTES[name][1], None)
    if value is None and ("attribute", name) not in _found:
        _found["attribute", name] = False
        _warn(".".join(_ATTRIBUTES[name]))
    return value


def tensor_version(tensor):
    """PyTorch's count of in-place writes to ``tensor`` (``Tensor._version``), or None where
    the release lacks it (then nothing cached from the tensor is reused: packed weights and
    cast copies are made again at every use)."""
    return getattr(tensor, "_version", None)


def _warn(what):
    warnings.warn(f"transformerkit: {what} is missing in the installed release (tested: "
                  f"Keras {TESTED['keras']}, PyTorch {TESTED['torch']}); using the plain Keras "
                  "path instead of the PyTorch shortcut that needs it", RuntimeWarning,
                  stacklevel=3)
