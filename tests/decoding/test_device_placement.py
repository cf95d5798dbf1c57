"""Every tensor the package makes lives where Keras keeps the model's (the CPU, or a GPU).

PyTorch puts a tensor made without ``device=`` on its default device, the CPU: on a GPU run
such a tensor meets the model's and the operation fails ("Expected all tensors to be on the
same device"). On a CPU-only machine nothing shows it, so this test watches every torch
function the package calls (``torch.overrides.TorchFunctionMode``) while it trains, decodes
(greedy, beam, n-best, sampling, bfloat16 and int8 products) and generates, and fails on any
tensor factory called from ``src/transformerkit`` without a device: a NumPy array or Python
numbers made into a tensor, a ``zeros``/``arange``/``full``. ``torch.as_tensor(t)`` of a
tensor keeps its device and passes.
"""

import os
import traceback

import keras
import numpy as np
import pytest
from tiny_run import tiny_config

import transformerkit

if keras.backend.backend() != "torch":
    pytest.skip("the device of eager PyTorch tensors", allow_module_level=True)

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

PACKAGE = os.path.dirname(os.path.abspath(transformerkit.__file__))
FACTORIES = {torch.tensor, torch.as_tensor, torch.from_numpy, torch.zeros, torch.ones,
             torch.full, torch.empty, torch.arange, torch.linspace, torch.eye, torch.rand,
             torch.randn, torch.randint}


class ImplicitDevices(TorchFunctionMode):
    """Records ``file:line: function`` of each factory call from the package that leaves the
    device to PyTorch's default."""

    def __init__(self):
        super().__init__()
        self.found = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        keeps_device = func in (torch.tensor, torch.as_tensor) and args \
            and isinstance(args[0], torch.Tensor)
        if func in FACTORIES and kwargs.get("device") is None and not keeps_device:
            caller = next((f for f in reversed(traceback.extract_stack()[:-1])
                           if not f.filename.startswith(os.path.dirname(torch.__file__))), None)
            if caller is not None and caller.filename.startswith(PACKAGE):
                where = os.path.relpath(caller.filename, PACKAGE)
                self.found.add(f"{where}:{caller.lineno}: torch.{func.__name__}")
        return func(*args, **kwargs)


def test_the_audit_catches_a_tensor_made_without_a_device():
    from transformerkit.decoding.loop_ops import TorchLoopOps

    ops = TorchLoopOps()
    with ImplicitDevices() as audit:
        ops.zeros((2,), "int32")
        torch.zeros(2, device=ops.device)  # from this file: not the package's
    assert audit.found == set()
    ops.device = None  # as if the namespace left the device to PyTorch
    with ImplicitDevices() as audit:
        ops.zeros((2,), "int32")
    assert any("loop_ops.py" in line for line in audit.found), audit.found


def test_training_and_every_search_make_their_tensors_on_the_models_device(tmp_path):
    from transformerkit.api import load
    from transformerkit.training.trainer import train

    with ImplicitDevices() as audit:
        train(tiny_config(tmp_path, epochs=1, precision="mixed_bfloat16"), tmp_path / "run")
        run = load(tmp_path / "run")
        texts = ["ein zwei", "drei vier fuenf"]
        run.translate(texts, beam_size=1)
        run.translate(texts, beam_size=3)
        run.translate(texts, beam_size=3, n_best=2)
        run.translate(texts, temperature=0.8, top_k=3, seed=1)
        for precision in ("bfloat16", "int8"):
            run.translate(texts, beam_size=2, precision=precision)
        # a batch of NumPy arrays (padded labels: the step gathers the real positions)
        from transformerkit.training import MaskedCrossEntropy, attach_train_step

        run.model.compile(optimizer="sgd", loss=MaskedCrossEntropy())
        attach_train_step(run.model)
        ids = np.array([[5, 6, 2, 0], [7, 2, 0, 0]], "int32")
        run.model.train_on_batch((ids, ids), ids)
    assert not audit.found, "\n".join(sorted(audit.found))


def test_generation_makes_its_tensors_on_the_models_device():
    from transformerkit.api import Run
    from transformerkit.config import resolve
    from transformerkit.data.tokenizers import CharTokenizer
    from transformerkit.models import GPT

    tokenizer = CharTokenizer.train(["abcdefghijklmnopqrstuvwxyz ."])
    keras.utils.set_random_seed(0)
    model = GPT(tokenizer.vocab_size, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                max_length=24)
    model(np.array([[5, 6]]))
    config = resolve({"model": {"type": "gpt", "num_layers": 1, "d_model": 16,
                                "num_heads": 2, "d_ff": 32, "max_length": 24},
                      "data": {"dataset": "text", "tokenizer": "char"}})
    run = Run(model, config, tokenizer, tokenizer)
    with ImplicitDevices() as audit:
        run.generate("ab", temperature=0, max_new_tokens=8)
        run.generate("ab", seed=3, top_k=5, max_new_tokens=8)
        run.generate("ab", seed=3, top_p=0.9, max_new_tokens=30)
        list(run.generate_stream("ab", seed=2, max_new_tokens=6))
    assert not audit.found, "\n".join(sorted(audit.found))
