"""The private-API registry (``transformerkit.internals``), the shortcuts' switch
(``transformerkit.fastpath``) and the import that changes nothing process-wide.

Tolerances (``tests/support/tolerances.py``): the fused Adam and Keras' Adam are two float32 paths
of formulas that differ by the placement of epsilon, computed in float64 here
(:func:`adam_paths_atol`).
"""

import os
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
import tolerances as tol

from transformerkit import fastpath, internals


def test_every_listed_internal_exists_in_the_tested_releases():
    for name in internals._FUNCTIONS:
        if internals._FUNCTIONS[name][0] == "torch" and keras.backend.backend() != "torch":
            continue
        assert internals.get(name) is not None, name
    for name in internals._MEMBERS:
        assert internals.available(name), name


def test_every_listed_private_attribute_exists_on_its_objects():
    """The private attributes read on instances (``internals._ATTRIBUTES``): those of a
    compiled model, and those of an Adam built with gradient accumulation."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    optimizer = keras.optimizers.Adam(0.1, gradient_accumulation_steps=2)
    optimizer.build(model.trainable_variables)
    owners = {"keras.Model": model, "keras.optimizers.Optimizer": optimizer,
              "keras.optimizers.Adam": optimizer}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, (owner, _) in internals._ATTRIBUTES.items():
            assert internals.attribute(owners[owner], name) is not None, name


def test_a_missing_private_attribute_is_none_with_one_warning(monkeypatch):
    monkeypatch.setitem(internals._ATTRIBUTES, "gone", ("keras.Model", "_no_such_attribute"))
    monkeypatch.setattr(internals, "_found", {})
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.warns(RuntimeWarning, match="keras.Model._no_such_attribute is missing"):
        assert internals.attribute(model, "gone") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        assert internals.attribute(model, "gone") is None


def test_a_missing_internal_is_none_with_one_warning(monkeypatch):
    monkeypatch.setitem(internals._FUNCTIONS, "gone", ("keras", "_no_such_function"))
    monkeypatch.setitem(internals._MEMBERS, "gone_members",
                        ("keras", "Model", ("_no_such_member", "fit")))
    monkeypatch.setattr(internals, "_found", {})
    with pytest.warns(RuntimeWarning, match="keras._no_such_function is missing"):
        assert internals.get("gone") is None
    with pytest.warns(RuntimeWarning, match="_no_such_member") as record:
        assert internals.available("gone_members") is False
    assert "fit" not in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        assert internals.get("gone") is None
        assert internals.available("gone_members") is False


ADAM_START = np.linspace(-1, 1, 12).reshape(3, 4)
ADAM_RATE, ADAM_DECAY, ADAM_STEPS = 0.1, 0.1, 3


def adam_paths_atol():
    """The fused update against Keras' on the test's gradients (constant, clipped to a
    global norm of 1): Keras' formula adds epsilon to sqrt(v) before the bias correction,
    the fused one after (``training/optimizers.Adam``), a difference computed in float64;
    plus each path's roundings per step: the clipping (a sum of 12 squares, sqrt, division,
    product, twice in m / sqrt(v)), m and v, the step's powers, sqrt, divisions and
    products on a step of ``lr`` (m_hat / sqrt(v_hat) = 1 for a constant gradient), and
    ``gamma(3) |w|`` for the weight decay and the subtraction (|w| <= |w_0| + 1: three
    steps of 0.1)."""
    beta_1, beta_2, epsilon = 0.9, 0.999, 1e-7  # Keras' defaults
    results = []
    for epsilon_hat in (False, True):
        w, m, v = ADAM_START.copy(), 0.0, 0.0
        for t in range(1, ADAM_STEPS + 1):
            g = 1 / np.sqrt(12)  # every entry of (step + 1) * ones((3, 4)), clipped
            w = w - ADAM_RATE * ADAM_DECAY * w
            m, v = beta_1 * m + (1 - beta_1) * g, beta_2 * v + (1 - beta_2) * g * g
            correction = np.sqrt(1 - beta_2 ** t)
            denominator = ((np.sqrt(v) + epsilon) / correction if epsilon_hat
                           else np.sqrt(v) / correction + epsilon)
            w = w - ADAM_RATE / (1 - beta_1 ** t) * m / denominator
        results.append(w)
    roundings = 2 * (12 + 1 + tol.ELEMENTWISE_ULPS + 2) + 4 * ADAM_STEPS + (
        3 * tol.ELEMENTWISE_ULPS + 6)
    step = ADAM_RATE * tol.gamma(roundings) + tol.gamma(3) * (np.abs(ADAM_START) + 1)
    return np.abs(results[0] - results[1]) + 2 * ADAM_STEPS * step


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the fused update is PyTorch's")
def test_adam_without_its_fused_kernel_falls_back_to_keras(monkeypatch):
    """A release without ``torch._fused_adamw_`` takes Keras' own update (a warning, no crash),
    and both updates agree."""
    from transformerkit.training import Adam

    def trained():
        keras.utils.set_random_seed(0)
        variable = keras.Variable(ADAM_START.astype("float32"))
        optimizer = Adam(ADAM_RATE, weight_decay=ADAM_DECAY, global_clipnorm=1.0)
        for step in range(ADAM_STEPS):
            grad = keras.ops.convert_to_tensor(np.full((3, 4), step + 1.0, "float32"))
            optimizer.apply([grad], [variable])
        return keras.ops.convert_to_numpy(variable), optimizer

    fused, optimizer = trained()
    assert optimizer._fused()
    monkeypatch.setattr(internals, "_found", {**internals._found, "fused_adamw_": None})
    plain, optimizer = trained()
    assert not optimizer._fused()
    tol.assert_within(fused, plain, adam_paths_atol())


def test_the_switch_turns_every_shortcut_off(monkeypatch):
    tensor = keras.ops.ones((2, 3))
    on = fastpath.applies(tensor)
    assert on == (keras.backend.backend() == "torch")
    assert not fastpath.applies(np.ones((2, 3)))  # a NumPy array is no backend tensor
    monkeypatch.setattr(fastpath, "ENABLED", False)
    assert not fastpath.applies(tensor) and not fastpath.applies()


@pytest.mark.parametrize("value,enabled", [("0", False), ("off", False), ("1", True)])
def test_the_environment_sets_the_switch(value, enabled):
    code = "import transformerkit.fastpath as f; print(f.ENABLED)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"TRANSFORMERKIT_FAST_PATHS": value, "PATH": ""}, check=True)
    assert out.stdout.strip() == str(enabled)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_import_keeps_the_c_allocator_and_keep_freed_memory_changes_it():
    """A process that imports the whole library still gives a large freed block back to the
    system; after ``transformerkit.keep_freed_memory()`` it keeps it for reuse."""
    code = textwrap.dedent("""
        import transformerkit, transformerkit.models, transformerkit.training
        import transformerkit.decoding, transformerkit.api

        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096

        def kept_after_free():
            before = rss()
            block = bytearray(256 << 20)  # touched: zero-filled
            del block
            return rss() - before > (128 << 20)

        print(kept_after_free())
        applied = transformerkit.keep_freed_memory()
        print(applied, kept_after_free())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "False"  # the import changed nothing
    if out[1] == "True":  # glibc's mallopt was there
        assert out[2] == "True"


def test_bound_kernel_caches_sets_what_the_user_left_unset(monkeypatch):
    """``serve``'s bound on oneDNN's and ideep's per-shape caches: both variables set to the
    capacity, a value the user chose kept."""
    from transformerkit.allocator import KERNEL_CACHE_VARIABLES, bound_kernel_caches

    for name in KERNEL_CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    assert bound_kernel_caches(32) == ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "32"
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"
    assert bound_kernel_caches(16) == []  # both set now: nothing changes
