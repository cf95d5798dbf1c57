"""The Adam update (fused on PyTorch) against a float64 NumPy reference of its documented
formula: global-norm clipping, decoupled weight decay on matrices only, the bias-corrected
step, over several steps on a learning-rate schedule.

Tolerances (``tests/support/tolerances.py``): the gradients are given, so nothing is amplified:
each step's float32 roundings act on its terms' sizes, which the float64 reference tracks
(:func:`adam_atol`); Keras' own update (no fused kernel) places epsilon differently, a
documented difference the reference computes. The power check clips each tensor to the
norm on its own instead of the global norm.
"""

import keras
import numpy as np
import pytest
import tolerances as tol

from transformerkit.training.gpt_recipe import MatrixDecayAdam, WarmupCosineSchedule
from transformerkit.training.optimizers import Adam

SHAPES = [(6, 4), (4,), (3, 5), (5,)]  # two matrices (decayed), two vectors (not)
# Roundings of one step on m and v, which they carry to the later steps: two products and a
# sum (m), the square too (v).
CARRIED = 4
# Roundings of one step's update: beta^t twice, sqrt(1 - beta_2^t), sqrt(v), two divisions,
# + epsilon, the step size and its product.
STEP = 3 * tol.ELEMENTWISE_ULPS + 6


def clip_roundings(elements):
    """The global norm (a sum of ``elements`` squares, sqrt), clip / norm and the product;
    its relative error enters m and sqrt(v), so twice into their ratio."""
    return 2 * (elements + 1 + tol.ELEMENTWISE_ULPS + 2)


def _adam(params, grad_steps, rates, beta_1, beta_2, epsilon, clip, weight_decay,
          epsilon_hat):
    """float64 Adam, and the elementwise float32 rounding bound of its result: per step
    ``gamma(k_t) * lr * (running mean of |g|) / (sqrt(v_hat) + eps)``, ``k_t`` the roundings
    carried in m and v plus the step's and the clipping's, and ``gamma(3) |w|`` for the
    weight decay and the subtraction. ``epsilon_hat``: Keras' formula, epsilon added to
    sqrt(v) before the bias correction (``transformerkit.training.optimizers.Adam``)."""
    params = [p.astype("float64") for p in params]
    m = [np.zeros_like(p) for p in params]
    m_abs = [np.zeros_like(p) for p in params]  # the sizes of the terms summed in m
    v = [np.zeros_like(p) for p in params]
    bound = [np.zeros_like(p) for p in params]
    extra = clip_roundings(sum(p.size for p in params)) if clip is not None else 0
    for t, (grads, lr) in enumerate(zip(grad_steps, rates, strict=True), start=1):
        grads = [g.astype("float64") for g in grads]
        if clip is not None:
            norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
            grads = [g * min(1.0, clip / norm) for g in grads]
        for i, g in enumerate(grads):
            if weight_decay and params[i].ndim >= 2:
                params[i] = params[i] - lr * weight_decay * params[i]
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            m_abs[i] = beta_1 * m_abs[i] + (1 - beta_1) * np.abs(g)
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            if epsilon_hat:
                denom = (np.sqrt(v[i]) + epsilon) / np.sqrt(1 - beta_2 ** t)
            else:
                denom = np.sqrt(v[i]) / np.sqrt(1 - beta_2 ** t) + epsilon
            params[i] = params[i] - lr / (1 - beta_1 ** t) * m[i] / denom
            bound[i] += (tol.gamma(CARRIED * t + STEP + extra) * lr / (1 - beta_1 ** t)
                         * m_abs[i] / denom + tol.gamma(3) * np.abs(params[i]))
    return params, bound


def reference_adam(params, grad_steps, rates, beta_1, beta_2, epsilon, clip=None,
                   weight_decay=0.0):
    """float64: clip by global norm (scale min(1, clip / norm)), theta -= lr * wd * theta on
    matrices, then theta -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""
    return _adam(params, grad_steps, rates, beta_1, beta_2, epsilon, clip, weight_decay,
                 epsilon_hat=False)[0]


def adam_atol(params, grad_steps, rates, beta_1, beta_2, epsilon, clip=None,
              weight_decay=0.0):
    """Elementwise bound of a float32 Adam run against :func:`reference_adam`: its rounding
    bound plus the difference Keras' epsilon placement makes (documented, O(epsilon))."""
    args = (params, grad_steps, rates, beta_1, beta_2, epsilon, clip, weight_decay)
    ours, bound = _adam(*args, epsilon_hat=False)
    keras_formula, _ = _adam(*args, epsilon_hat=True)
    return [b + np.abs(a - k) for a, k, b in zip(ours, keras_formula, bound, strict=True)]


def run(optimizer, params, grad_steps):
    variables = [keras.Variable(p) for p in params]
    for grads in grad_steps:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


def draws(seed, steps=5, scale=1.0):
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=s).astype("float32") for s in SHAPES]
    grads = [[(scale * rng.normal(size=s)).astype("float32") for s in SHAPES]
             for _ in range(steps)]
    return params, grads


@pytest.mark.parametrize("clip", [None, 1.0], ids=["no-clip", "clip"])
def test_adam_matches_the_reference(clip):
    params, grads = draws(0, scale=3.0)  # norms of ~10: clipping is active
    optimizer = Adam(2e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9, global_clipnorm=clip)
    got = run(optimizer, params, grads)
    want = reference_adam(params, grads, [2e-2] * 5, 0.9, 0.98, 1e-9, clip=clip)
    atol = adam_atol(params, grads, [2e-2] * 5, 0.9, 0.98, 1e-9, clip=clip)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        tol.assert_within(g, w, atol[i], err_msg=f"variable {i}")
    # a wrong clip (or none) would move the parameters differently
    unclipped = reference_adam(params, grads, [2e-2] * 5, 0.9, 0.98, 1e-9)
    if clip is not None:
        assert (np.abs(got[0] - unclipped[0]) > atol[0]).any()


def test_matrix_decay_adam_on_a_schedule_matches_the_reference():
    params, grads = draws(1, steps=6)
    schedule = WarmupCosineSchedule(1e-2, warmup_steps=2, decay_steps=6, minimum=1e-3)
    rates = [float(keras.ops.convert_to_numpy(schedule(i))) for i in range(6)]
    optimizer = MatrixDecayAdam(learning_rate=schedule, beta_1=0.9, beta_2=0.99, epsilon=1e-8,
                                weight_decay=0.5, global_clipnorm=1.0)
    got = run(optimizer, params, grads)
    want = reference_adam(params, grads, rates, 0.9, 0.99, 1e-8, clip=1.0, weight_decay=0.5)
    atol = adam_atol(params, grads, rates, 0.9, 0.99, 1e-8, clip=1.0, weight_decay=0.5)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        tol.assert_within(g, w, atol[i], err_msg=f"variable {i}")
    # vectors are not decayed: decaying them too would give other values
    params_2d = [p.reshape(1, -1) if p.ndim == 1 else p for p in params]
    grads_2d = [[g.reshape(1, -1) if g.ndim == 1 else g for g in step] for step in grads]
    everything = reference_adam(params_2d, grads_2d, rates, 0.9, 0.99, 1e-8, clip=1.0,
                                weight_decay=0.5)
    assert (np.abs(got[1] - everything[1].reshape(-1)) > atol[1]).any()
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 6


def test_a_non_finite_gradient_makes_the_update_non_finite_as_in_keras():
    params, grads = draws(2, steps=1)
    grads[0][0][0, 0] = np.inf
    got = run(Adam(1e-3, global_clipnorm=1.0), params, grads)
    assert not np.isfinite(got[0]).all() and not np.isfinite(got[1]).all()


def test_the_reused_fused_plan_follows_variable_lists_and_assignments():
    """On PyTorch the fused update reuses its per-variable-list plan (the variables' tensors,
    grouped by weight decay). Switching to another list of variables (a layer frozen between
    fits) must make a new plan, and values assigned to a variable between steps must be the
    ones updated: the same steps with the plan rebuilt before every update give the same
    numbers."""
    params, grads = draws(3, steps=6)
    results = []
    for rebuild in (False, True):
        optimizer = MatrixDecayAdam(1e-2, weight_decay=0.3, global_clipnorm=1.0)
        variables = [keras.Variable(p) for p in params]
        optimizer.build(variables)
        for step, step_grads in enumerate(grads):
            chosen = [0, 1, 2, 3] if step in (0, 1, 4) else [2, 0]  # a subset, reordered
            if step == 3:
                variables[2].assign(np.full(SHAPES[2], 0.5, "float32"))
            if rebuild:
                optimizer.__dict__.pop("_fused_plan", None)
            optimizer.apply([keras.ops.convert_to_tensor(step_grads[i]) for i in chosen],
                            [variables[i] for i in chosen])
        results.append([keras.ops.convert_to_numpy(v) for v in variables])
    for reused, rebuilt in zip(*results, strict=True):  # exact: the same kernels and order
        np.testing.assert_array_equal(reused, rebuilt)
    # the assigned value was updated afterwards: Adam steps of about lr = 1e-2, not rounding
    assert np.abs(results[0][2] - 0.5).max() > 1e-3


def test_tolerances_still_catch_a_clipping_norm_per_tensor(monkeypatch):
    """Each gradient clipped to the norm by itself, not by the global norm of all of them."""

    def per_tensor(self, grads):
        clip = float(self.global_clipnorm)
        return [g * keras.ops.minimum(1.0, clip / keras.ops.sqrt(keras.ops.sum(g * g)))
                for g in grads]

    monkeypatch.setattr(Adam, "_clip_gradients", per_tensor)
    tol.assert_caught(test_adam_matches_the_reference, 1.0)
