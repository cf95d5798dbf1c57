"""Rounding bounds of ``mixed_bfloat16`` computations (the bfloat16 counterpart of
``tests/support/tolerances.py``, whose notation this follows).

Under ``mixed_bfloat16`` the products read bfloat16 operands and sum in float32 (oneDNN, MKL
and ATen accumulate bfloat16 products in float32), then store their result in bfloat16; the
softmax, LayerNorm, logits and loss run in float32. So a result carries two kinds of
rounding: float32 roundings inside each product and element-wise function (bounded by
``tolerances.py``), and one bfloat16 rounding per bfloat16 *store*, of relative size at most
``U_BF16 = 2**-8`` (bfloat16 keeps 8 significant bits; round to nearest). Counted along the
longest path from the inputs to a result, ``s`` stores cost at most ``s * U_BF16`` times the
size of the terms they act on, to first order; in these renormalised stacks (LayerNorm,
softmax rows summing to one) that size is ``max(|result|, 1)``, as in ``tolerances.py``.

Two ``mixed_bfloat16`` paths compared with each other (the training step's PyTorch
shortcuts against Keras' own mixed-precision step: ``addmm`` rounding a product and its
bias once where Keras' matmul and bias addition round twice; other kernels) may each round
at every store: the tolerance is the sum of both paths' bounds (``paths=2``). The store
counts below take the larger count of the two (Keras': a ``Dense`` product and its bias
addition are two stores).
"""

import numpy as np
import tolerances as tol

U_BF16 = 2.0 ** -8

# bfloat16 stores per sub-layer, along its longest path (Keras' count, the larger):
# the query/key/value projection (product, bias), the scores, their scaling, the softmax
# result cast back to bfloat16, the weighted sum, the output projection (product, bias),
# the residual addition and the LayerNorm's result
ATTENTION_STORES = 10
# cross-attention from the encoder's output: the key/value projection (2), the weighted sum,
# the output projection (2), the residual, the LayerNorm
CROSS_FROM_MEMORY_STORES = 7
# the inner product (product, bias), the activation, the outer product (product, bias), the
# residual, the LayerNorm
FEEDFORWARD_STORES = 7
# the token embedding read in bfloat16, its scaling, the position added
EMBEDDING_STORES = 3


def model_stores(model):
    """bfloat16 stores along the longest path of a ``Transformer``'s (or ``GPT``'s) forward
    pass to its logits: the decoder's own path, or the encoder's path into a decoder block's
    cross-attention and on through the later blocks; the final LayerNorms (pre-norm) and the
    output projection."""
    decoder_layers = getattr(model, "num_decoder_layers", None) or model.num_layers
    final_norm = 1 if model.norm_position == "pre" else 0
    decoder_block = 2 * ATTENTION_STORES + FEEDFORWARD_STORES
    if not getattr(model, "source_vocab_size", None):  # decoder only (GPT)
        return (EMBEDDING_STORES + model.num_layers * (ATTENTION_STORES + FEEDFORWARD_STORES)
                + final_norm + 1)
    decoder_path = EMBEDDING_STORES + decoder_layers * decoder_block
    encoder_path = (EMBEDDING_STORES + model.num_layers * (ATTENTION_STORES + FEEDFORWARD_STORES)
                    + final_norm + CROSS_FROM_MEMORY_STORES + FEEDFORWARD_STORES
                    + (decoder_layers - 1) * decoder_block)
    return max(decoder_path, encoder_path) + final_norm + 1


def gradient_stores(model):
    """bfloat16 stores behind a weight's gradient ``x^T @ delta``: the forward pass to the
    loss (``x`` and the logits it reaches), the backward pass from the loss to the weight
    (each activation gradient stored in bfloat16), the weight gradient's own store."""
    return 2 * model_stores(model) + 1


def gamma_bf16(stores):
    """``s u / (1 - s u)``: the relative bound of ``stores`` bfloat16 roundings in a row."""
    if stores * U_BF16 >= 1:
        raise ValueError(f"{stores} bfloat16 stores: no bound")
    return stores * U_BF16 / (1 - stores * U_BF16)


def chain_atol(stores, float32_roundings, result, paths=2):
    """Elementwise bound of a chain of ``stores`` bfloat16 stores and ``float32_roundings``
    float32 roundings (``tolerances.py``) on ``paths`` paths: ``paths * (gamma_bf16(stores) +
    gamma(float32_roundings)) * max(|result|, 1)``."""
    magnitude = max(float(np.max(np.abs(np.asarray(result, np.float64)), initial=0.0)), 1.0)
    return paths * (gamma_bf16(stores) + tol.gamma(float32_roundings)) * magnitude


def loss_atol(stores, float32_roundings, logits, paths=2):
    """Bound of a mean cross-entropy whose logits carry :func:`chain_atol`'s error: its
    gradient in the logits, ``(softmax - smoothed labels) / tokens`` per token, has an l1 norm
    of at most 2 per token, so the loss moves by at most twice the logits' largest error."""
    return 2 * chain_atol(stores, float32_roundings, logits, paths)


def update_atol(stores, float32_roundings, learning_rate, steps, gradient_scale, paths=2):
    """Bound of the weights after ``steps`` SGD steps from the same start on ``paths`` paths
    whose gradients each carry ``gamma_bf16(stores) + gamma(float32_roundings)`` times
    ``gradient_scale`` (the largest gradient entry of any weight: the terms a gradient sums
    are of that size, its entries at most that), to first order."""
    relative = gamma_bf16(stores) + tol.gamma(float32_roundings)
    return paths * steps * learning_rate * relative * gradient_scale


def products_on_longest_path(model):
    """Products along the longest path of a decoder step: per encoder block the value and
    output projections and the two of the feed-forward (4); per decoder block the
    self-attention's two, the cross-attention's two (the memory's value projection or the
    query, then the output) and the feed-forward's two (6); the output projection."""
    decoder_layers = getattr(model, "num_decoder_layers", None) or model.num_layers
    return 4 * model.num_layers + 6 * decoder_layers + 1


def decoding_atol(model, result, float32_roundings):
    """A decoding's logits with bfloat16 products (``kernels/lowprec.py``: each product
    rounds its input, its weight and its output to bfloat16, three roundings, and sums in
    float32) against float32's: the products on the longest path
    (:func:`products_on_longest_path`) at three roundings each, relative to ``max(|result|,
    1)``, plus two float32 paths' ``float32_roundings``."""
    magnitude = max(float(np.max(np.abs(np.asarray(result, np.float64)), initial=0.0)), 1.0)
    return (gamma_bf16(3 * products_on_longest_path(model)) * magnitude
            + tol.chain_atol(float32_roundings, result, paths=2))
