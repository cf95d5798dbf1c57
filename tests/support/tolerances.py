"""The tolerances of the numerics tests, each from a float32 rounding-error bound.

The kernels under test (MKL, oneDNN, XLA, Eigen, ATen's vectorised loops) pick their blocking,
summation order and instruction set by CPU (AVX2, AVX-512, AMX), so a float32 result differs
between CPUs by rounding. A tolerance here is a bound on that rounding, not a number one CPU
gave. Notation (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002):

- ``U32 = 2**-24``, float32's unit roundoff (round to nearest); ``gamma(n) = n u / (1 - n u)``.
- **Products.** A length-``k`` dot product in float32, summed in any order, with any blocking,
  with or without FMA, obeys ``|fl(x.y) - x.y| <= gamma(k) |x|.|y|`` (Higham eq. 3.5, Lemma
  3.1). :func:`product_atol` gives that bound for each element of ``a @ b`` from the operands.
- **Element-wise functions.** ``exp``, ``erf``, ``tanh``, ``sqrt``, division in the vectorised
  libraries in use are correct to a few units in the last place; :data:`ELEMENTWISE_ULPS`
  counts each such step as that many roundings.
- **Chains** (a layer, a block, a whole model). First-order error analysis adds the bounds of
  the steps: ``n`` roundings in a row cost at most ``gamma(n)`` times the size of the terms
  they act on. In these stacks every sum is renormalised (LayerNorm, softmax rows summing to
  one), so the terms stay of the order of ``max(|result|, 1)``: :func:`chain_atol` is
  ``gamma(n) * max(|result|, 1)``, with ``n`` the number of roundings along the longest
  path, counted by :func:`attention_roundings`, :func:`block_roundings` and
  :func:`model_roundings`. This is a worst-case bound: CPUs give 1-30 ``u * |result|``
  where it allows several hundred, and every mutation named in the tests' docstrings moves
  results by 1e-2 or more, far above it.
- **Two float32 paths** compared with each other (a shortcut against the plain Keras code,
  oneDNN against MKL, cached decoding against recomputation): both may round, each within
  its bound, so the tolerance is the sum of both paths' bounds (``paths=2``).
- **Exact.** Where both sides run the same kernels on the same shapes in the same order
  (a saved and reloaded model, a cache that stores values, masks of integers), results are
  bitwise equal on every CPU: tests assert equality there, as a tolerance would hide bugs.

:func:`assert_within` checks an elementwise or scalar bound and says by how much it was missed.
"""

import numpy as np

U32 = 2.0 ** -24
ELEMENTWISE_ULPS = 4  # exp/erf/tanh/sqrt/division of SLEEF, MKL VML, oneDNN, XLA: <= 4 ulp
SOFTMAX_EXTRA = 2 * ELEMENTWISE_ULPS + 2  # exp, the division, the max shift and the scaling


def gamma(n):
    """``n u / (1 - n u)``: the relative error bound of ``n`` float32 roundings in a row."""
    n = float(n)
    if n * U32 >= 1:
        raise ValueError(f"{n} roundings: no float32 bound")
    return n * U32 / (1.0 - n * U32)


def product_atol(a, b, paths=1):
    """Elementwise bound of ``a @ b`` computed in float32 against the exact product:
    ``gamma(k) (|a| @ |b|)`` (float64), ``k = a.shape[-1]``; ``paths=2`` for two float32
    products compared with each other."""
    a, b = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
    return paths * gamma(a.shape[-1]) * (a @ b)


def chain_atol(roundings, result, paths=1):
    """Bound of a float32 chain of ``roundings`` steps in a row against the exact result:
    ``gamma(roundings) * max(|result|, 1)`` (module docstring), times ``paths``."""
    magnitude = max(float(np.max(np.abs(np.asarray(result, np.float64)), initial=0.0)), 1.0)
    return paths * gamma(roundings) * magnitude


def layer_norm_roundings(width):
    """The mean and the variance (two sums of ``width``), the scaling and the affine step."""
    return 2 * width + ELEMENTWISE_ULPS + 3


def attention_roundings(d_model, key_dim, keys, value_dim=None, num_heads=1):
    """Longest path through multi-head attention: the query/key projection (``d_model``),
    the scores (``key_dim``), the softmax over ``keys`` keys, the weighted sum of the values
    (``keys``) computed from their projection (``d_model``), the output projection."""
    value_dim = key_dim if value_dim is None else value_dim
    return (d_model + key_dim + 1 + keys + SOFTMAX_EXTRA + keys + d_model
            + num_heads * value_dim)


def feedforward_roundings(d_model, d_ff):
    """The two products of FFN(x) = act(x W1 + b1) W2 + b2 and the activation."""
    return d_model + 1 + ELEMENTWISE_ULPS + d_ff + 1


def block_roundings(d_model, d_ff, key_dim, keys, num_heads, cross_keys=0, value_dim=None):
    """An encoder block (``cross_keys=0``) or a decoder block attending to ``cross_keys``:
    each sub-layer, its residual addition and its LayerNorm."""
    sublayers = [attention_roundings(d_model, key_dim, keys, value_dim, num_heads)]
    if cross_keys:
        sublayers.append(attention_roundings(d_model, key_dim, cross_keys, value_dim,
                                             num_heads))
    sublayers.append(feedforward_roundings(d_model, d_ff))
    return sum(s + 1 + layer_norm_roundings(d_model) for s in sublayers)


def model_roundings(model, source_len=0, target_len=0):
    """Longest path through a ``Transformer``, ``GPT`` or ``Encoder`` forward pass: the
    embedding and its position, every block, the final LayerNorm, the output projection.
    ``source_len``/``target_len``: the key lengths (a GPT or encoder reads ``target_len``)."""
    d, ff, heads = model.d_model, model.d_ff, model.num_heads
    key_dim = getattr(model, "key_dim", None) or d // heads
    value_dim = getattr(model, "value_dim", None) or key_dim
    blocks = model.num_layers
    keys = max(target_len, 1)
    n = 3 + layer_norm_roundings(d)  # scaled embedding + position, an embedding LayerNorm
    if source_len:  # encoder-decoder: the encoder runs first, then the decoder reads it
        decoder_blocks = getattr(model, "num_decoder_layers", None) or blocks
        n += blocks * block_roundings(d, ff, key_dim, source_len, heads, value_dim=value_dim)
        n += 3 + layer_norm_roundings(d)
        n += decoder_blocks * block_roundings(d, ff, key_dim, keys, heads,
                                              cross_keys=source_len, value_dim=value_dim)
    else:
        n += blocks * block_roundings(d, ff, key_dim, keys, heads, value_dim=value_dim)
    return n + layer_norm_roundings(d) + d + 1  # final LayerNorm, output projection


def assert_within(actual, expected, atol, err_msg=""):
    """``|actual - expected| <= atol`` elementwise (``atol`` a scalar or an array of bounds);
    on failure, the worst element's difference, its bound and their ratio."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape, err_msg)
    atol = np.broadcast_to(np.asarray(atol, np.float64), actual.shape)
    diff = np.abs(actual - expected)
    if np.isnan(actual).any() or np.isnan(expected).any():
        np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg=err_msg)
        diff = np.where(np.isnan(diff), 0.0, diff)
    over = diff > atol
    if over.any():
        worst = np.unravel_index(np.argmax(np.where(atol > 0, diff / np.maximum(atol, 1e-300),
                                                    np.inf)), diff.shape)
        raise AssertionError(
            f"{err_msg + ': ' if err_msg else ''}{int(over.sum())} / {diff.size} elements "
            f"beyond their bound; worst at {tuple(int(i) for i in worst)}: |diff| "
            f"{diff[worst]:.3g} > bound {atol[worst]:.3g} ({diff[worst] / atol[worst]:.3g}x)")


def relative(roundings, paths=1):
    """A relative tolerance (for ``rtol``/``pytest.approx(rel=)``) of ``roundings`` float32
    roundings in a row on ``paths`` paths."""
    return paths * gamma(roundings)



def assert_caught(test, *args, **kwargs):
    """Run ``test`` (a test function of this suite, with its arguments) while the caller has
    planted a deliberate bug: it must fail with an ``AssertionError``. Each numerics file
    keeps one such check, so that no tolerance can grow blind to a real mistake."""
    try:
        test(*args, **kwargs)
    except AssertionError:
        return
    raise AssertionError(f"{test.__name__} passed with a deliberate bug planted: its "
                         "tolerance no longer sees that mistake")


def cross_entropy_roundings(vocab, tokens):
    """A mean label-smoothed cross-entropy: log-sum-exp over ``vocab`` logits (the sum, the
    exp and the log), the smoothing's sum over ``vocab``, the mean over ``tokens``."""
    return 2 * vocab + 2 * ELEMENTWISE_ULPS + 3 + tokens


def sgd_weights_atol(gradient_roundings, learning_rate, steps, weights, paths=2):
    """Weights after ``steps`` SGD steps from the same start, ``w - lr * g`` each, on paths
    whose gradients each carry ``gamma(gradient_roundings)`` times ``max(|g|, 1)`` (a
    cross-entropy gradient is ``(softmax - labels) / tokens`` back through renormalised
    layers: entries of order at most one): ``steps * (lr * that + u |w|)`` per path, to first
    order. (Adam's ``m / sqrt(v)`` has no such bound: where a gradient is near zero it turns a
    rounding-size difference into a step of ``lr``; compare Adam paths only when exact.)"""
    w = np.abs(np.asarray(weights, np.float64))
    return paths * steps * (learning_rate * gamma(gradient_roundings) + U32 * w)
