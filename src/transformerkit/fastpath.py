"""The one switch and the one predicate of the PyTorch-eager shortcuts.

On the PyTorch backend Keras runs eagerly, and its per-call bookkeeping (``Layer.__call__``,
the ``keras.ops`` wrappers, the generic train step and optimizer update) costs more Python
time than the arithmetic of a small model. Where that bookkeeping is provably moot, this
package calls ``torch`` directly. Every such shortcut sits next to the plain Keras code it
replaces and asks :func:`applies` first:

=============================  ===============================================
shortcut                       where (the plain code is beside it)
=============================  ===============================================
direct sub-layer calls,        ``layers/calls.py``
reshapes, Dense, LayerNorm
inference weights packed for   ``kernels/products.py: inference_linear`` (the decoder
oneDNN (no autograd; float32   step, ``Dense`` under ``torch.no_grad``)
on non-Intel CPUs)
bfloat16 / int8 inference      ``kernels/lowprec.py`` (``--precision``; without the
products                       shortcuts only float32 runs, the others are refused)
dropout                        ``layers/dropout.py``
fused attention kernel         ``layers/attention.py: _fused_attention``
one-position decoder step and  ``layers/attention.py``, ``layers/blocks.py``,
the encoder pass at inference  ``layers/feedforward.py``, ``models/base.py``,
                               ``models/transformer.py`` (``step``,
                               ``inference_call``, ``inference_encode`` next to
                               ``call``; weights from ``step_weights(precision)``)
search-loop bookkeeping        ``decoding/loop_ops.py`` (``keras.ops`` or torch)
masked cross-entropy           ``training/losses.py``
train step                     ``training/step.py: TrainStep`` (beside Keras' step)
mixed precision: each weight   ``kernels/cast_once.py`` (Keras' autocast
cast once per step             scope casts at every use), ``training/step.py``
fused Adam / AdamW, clipping   ``training/optimizers.py``
=============================  ===============================================

:data:`ENABLED` turns all of them off at once (the plain Keras path then runs everywhere);
the environment variable ``TRANSFORMERKIT_FAST_PATHS=0`` sets it for a whole process, as
CI does to run the numerics tests both ways. The private Keras/PyTorch APIs some shortcuts
need are listed in :mod:`transformerkit.internals`.
"""

import os
import sys

ENABLED = os.environ.get("TRANSFORMERKIT_FAST_PATHS", "1").strip().lower() not in (
    "0", "off", "false", "no")


def applies(x=None):
    """Whether a PyTorch-eager shortcut may run: :data:`ENABLED`, the Keras backend is
    PyTorch and, when ``x`` is given, ``x`` is a concrete ``torch.Tensor`` (not a symbolic
    ``KerasTensor`` or a NumPy array). Called on every layer call: kept to a few lookups."""
    if not ENABLED:
        return False
    torch = _torch if _torch is not None else _find_torch()
    return torch is not False and (x is None or isinstance(x, torch.Tensor))


def exporting():
    """Whether ``torch.export`` is capturing the code that asks (the compiled decoding of
    :mod:`transformerkit.decoding.aot_step`): a shortcut that reads a tensor's values to
    choose a branch (no padding, every row has keys) takes the branch that is right for any
    values then, since the graph is traced once for all inputs."""
    torch = _torch if _torch is not None else _find_torch()
    return torch is not False and torch.compiler.is_exporting()


_torch = None  # the torch module on the PyTorch backend, False on others, None: not known yet


def _find_torch():
    """Resolve :data:`_torch` once Keras has chosen its backend (it cannot change after)."""
    global _torch
    keras = sys.modules.get("keras")
    if keras is None:  # not imported yet: the backend it will take, not kept (it may change)
        from transformerkit.backend import choose_default_backend

        if choose_default_backend() != "torch":
            return False
        import torch

        return torch
    if keras.backend.backend() == "torch":
        import torch

        _torch = torch
    else:
        _torch = False
    return _torch
