"""``train.precision: auto`` (the default): bfloat16 only where the CPU has bfloat16 dot
products that oneDNN may use (no ``ONEDNN_MAX_CPU_ISA`` cap below them) and the model is wide
enough, float32 elsewhere; recorded in ``metrics.json``. The rule is checked as each CPU
family of ``tests/support/cpu_families.py`` (its flags injected, whatever the host) under each cap;
each cap is also run in a process of its own, as CI runs the kernel families
(``make test-kernels``)."""

import json
import os
import subprocess
import sys

import keras
import pytest
from cpu_families import FAMILIES, flags_seen, has, host_has, inject
from tiny_run import tiny_config

from transformerkit.config import resolve
from transformerkit.training import precision
from transformerkit.training.precision import AUTO_MIN_D_MODEL, resolve_precision

TORCH = keras.backend.backend() == "torch"
# oneDNN's cap -> whether bfloat16 products stay native under it
CAPS = {"AVX2": False, "AVX512_CORE": False, "AVX512_CORE_BF16": True,
        "AVX512_CORE_AMX": True, None: True}


def _cuda():
    import torch

    return torch.cuda.is_available()


def test_explicit_precisions_mean_themselves_and_others_are_errors():
    for name in ("float32", "mixed_bfloat16", "mixed_float16"):
        assert resolve_precision(name) == (name, f"train.precision: {name}")
    with pytest.raises(ValueError, match="auto or one of"):
        resolve_precision("bfloat16")
    assert resolve({}).train.precision == "auto"  # the default
    assert resolve({"train": {"precision": "float32"}}).train.precision == "float32"
    assert resolve({"train": {"mixed_precision": True}}).train.precision_policy == \
        "mixed_bfloat16"


@pytest.mark.skipif(not TORCH, reason="the CPU rule is PyTorch's")
@pytest.mark.parametrize("cap", list(CAPS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_follows_the_cpu_family_the_onednn_cap_and_the_width(monkeypatch, family, cap):
    """As each CPU family (injected, whatever the host): mixed_bfloat16 where the family has
    bfloat16 units, the cap keeps oneDNN's bfloat16 instructions and d_model is at least
    ``AUTO_MIN_D_MODEL``; float32 elsewhere, the reason naming what decided."""
    import torch

    if _cuda():
        pytest.skip("a GPU decides")
    cpu = inject(monkeypatch, family)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap.lower() if cap == "AVX2" else cap)
    native = cpu.has("bfloat16") and CAPS[cap] and torch.backends.mkldnn.is_available()
    wide = resolve_precision("auto", 256, "torch")
    assert wide.used == ("mixed_bfloat16" if native else "float32"), wide
    assert wide.reason.startswith("auto: ")
    if not cpu.has("bfloat16"):
        assert "no bfloat16 units" in wide.reason
    elif not CAPS[cap]:
        assert f"ONEDNN_MAX_CPU_ISA={cap}" in wide.reason
    narrow = resolve_precision("auto", AUTO_MIN_D_MODEL - 1, "torch")
    assert narrow.used == "float32"
    if native:
        assert f"d_model {AUTO_MIN_D_MODEL - 1}" in narrow.reason
    else:
        assert narrow.reason == wide.reason  # the units decide before the width
    at_the_limit = resolve_precision("auto", AUTO_MIN_D_MODEL, "torch")
    assert at_the_limit.used == wide.used


def test_auto_is_float32_on_jax_and_tensorflow_cpus():
    backend = keras.backend.backend()
    if TORCH or precision._accelerator_bfloat16(backend) is not None:
        pytest.skip("needs the JAX or TensorFlow backend on a CPU")
    chosen = resolve_precision("auto", 512)
    assert chosen.used == "float32" and backend in chosen.reason


@pytest.mark.skipif(not TORCH, reason="the CPU rule is PyTorch's")
@pytest.mark.parametrize("cap", list(CAPS))
def test_auto_under_each_onednn_cap_in_its_own_process(cap):
    """A real cap set before PyTorch starts, with the flags the process sees: the host's
    (``/proc/cpuinfo``), or the family ``make test-kernels`` injects."""
    if _cuda():
        pytest.skip("a GPU decides")
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA",
                                                           "DNNL_MAX_CPU_ISA")}
    if cap is not None:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    code = ("import json; from transformerkit.training.precision import resolve_precision; "
            "print(json.dumps(resolve_precision('auto', 256, 'torch')._asdict()))")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300, check=True)
    chosen = json.loads(result.stdout.strip().splitlines()[-1])
    native = CAPS[cap] and has(flags_seen(env), "bfloat16")  # the host's, or a family's
    assert chosen["used"] == ("mixed_bfloat16" if native else "float32"), chosen


@pytest.mark.slow
@pytest.mark.skipif(not TORCH, reason="the cast-once step is PyTorch's")
@pytest.mark.parametrize("cap", ["AVX2", "AVX512_CORE", "AVX512_CORE_BF16"])
def test_bfloat16_step_tests_pass_under_each_onednn_cap(cap):
    """The bfloat16 step's tests (exact against Keras' step, within bounds of the plain
    path) and the float16 ones with oneDNN capped: emulated and native bfloat16 kernels."""
    if cap != "AVX2" and not host_has("avx512"):  # the hardware, not a family's flags
        pytest.skip("no AVX-512 on this CPU")
    here = os.path.dirname(os.path.abspath(__file__))
    # the CPU's kernels under the cap: a GPU, if any, is hidden
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=cap, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         os.path.join(here, "test_bfloat16_step.py"), os.path.join(here, "test_precision.py")],
        env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]


def test_train_records_the_precision_it_used(tmp_path):
    """The default ``auto`` on the tiny model (d_model 16: float32 on every machine) and an
    explicit ``mixed_bfloat16``: ``metrics.json`` says which and why."""
    from transformerkit.training.trainer import train

    metrics = train(tiny_config(tmp_path, epochs=1), tmp_path / "auto")
    if _cuda():  # a GPU: bfloat16 where it has it, whatever the width
        import torch

        gpu_bfloat16 = torch.cuda.is_bf16_supported()
        assert metrics["precision"]["used"] == ("mixed_bfloat16" if gpu_bfloat16 else "float32")
    else:
        assert metrics["precision"]["used"] == "float32"
        if TORCH:  # the width decides where bfloat16 units are usable, else their absence
            from transformerkit import precisions

            usable, why = precisions.bfloat16_units()
            assert ("d_model 16" if usable else why) in metrics["precision"]["reason"]
    with open(tmp_path / "auto" / "metrics.json") as f:
        assert json.load(f)["precision"] == metrics["precision"]
    mixed = train(tiny_config(tmp_path, epochs=1, precision="mixed_bfloat16"),
                  tmp_path / "mixed")
    assert mixed["precision"] == {"used": "mixed_bfloat16",
                                  "reason": "train.precision: mixed_bfloat16"}
