"""Independent float64 NumPy reference of the Transformer, for checking the Keras layers.

Everything here is written from the paper's equations (and tensor2tensor for the "t2t"
timing signal), not from the package's code: explicit per-head loops where it helps
clarity, -inf masking with an explicit zero for rows that have nothing to attend to.

The second half reads the weights of the package's Keras layers into plain dicts of
float64 arrays, so a test can run the reference with exactly the weights of a layer.
"""

import math

import keras
import numpy as np

# -- the math --------------------------------------------------------------------------------


def dense(x, kernel, bias=None):
    """x W + b over the last axis."""
    y = np.asarray(x, np.float64) @ kernel
    return y if bias is None else y + bias


def layer_norm(x, params):
    """LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * gamma + beta."""
    gamma, beta, eps = params["gamma"], params["beta"], params["epsilon"]
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def gelu(x):
    """Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))."""
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    """GELU's tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def relu(x):
    return np.maximum(x, 0.0)


def swish(x):
    """Swish / SiLU: x * sigmoid(x) = x / (1 + exp(-x))."""
    return x / (1.0 + np.exp(-np.asarray(x, np.float64)))


def masked_softmax(logits, allowed):
    """Softmax over the last axis among ``allowed`` entries; rows with none allowed are 0."""
    masked = np.where(allowed, logits, -np.inf)
    row_max = masked.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(allowed, np.exp(masked - row_max), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


def attention_allowed(batch, query_len, key_len, key_mask=None, causal=False,
                      attention_mask=None, query_offset=0):
    """Boolean (batch, query_len, key_len): may query i attend to key j."""
    allowed = np.ones((batch, query_len, key_len), dtype=bool)
    if key_mask is not None:
        allowed &= np.asarray(key_mask, bool)[:, None, :]
    if causal:
        positions = np.arange(query_len)[:, None] + query_offset
        allowed &= (positions >= np.arange(key_len)[None, :])[None]
    if attention_mask is not None:
        allowed &= np.asarray(attention_mask, bool)
    return allowed


def multi_head_attention(query, value, params, num_heads, key=None, key_mask=None,
                         causal=False, attention_mask=None):
    """Paper section 3.2.2, one head at a time.

    ``params``: {"query"|"key"|"value"|"output": (kernel, bias)} with fused kernels
    ``(d_in, heads * head_dim)``. Returns ``(output (b, q, d_out), weights (b, h, q, k))``.
    """
    key = value if key is None else key
    query, key, value = (np.asarray(a, np.float64) for a in (query, key, value))
    b, tq, _ = query.shape
    tk = key.shape[1]
    q_all = dense(query, *params["query"])
    k_all = dense(key, *params["key"])
    v_all = dense(value, *params["value"])
    dk = q_all.shape[-1] // num_heads
    dv = v_all.shape[-1] // num_heads
    allowed = attention_allowed(b, tq, tk, key_mask, causal, attention_mask)
    heads, weights = [], []
    for h in range(num_heads):
        q = q_all[..., h * dk:(h + 1) * dk]  # (b, q, dk)
        k = k_all[..., h * dk:(h + 1) * dk]  # (b, k, dk)
        v = v_all[..., h * dv:(h + 1) * dv]  # (b, k, dv)
        w = masked_softmax(q @ k.transpose(0, 2, 1) / math.sqrt(dk), allowed)  # (b, q, k)
        heads.append(w @ v)
        weights.append(w)
    concat = np.concatenate(heads, axis=-1)  # (b, q, h * dv)
    return dense(concat, *params["output"]), np.stack(weights, axis=1)


def feedforward(x, params):
    """FFN(x) = act(x W1 + b1) W2 + b2 (paper equation 2)."""
    act = {"relu": relu, "gelu": gelu, "swish": swish, "gelu_tanh": gelu_tanh}[params["activation"]]
    return dense(act(dense(x, *params["inner"])), *params["outer"])


def _residual(x, fn, norm, norm_position):
    if norm_position == "pre":
        return x + fn(layer_norm(x, norm))
    return layer_norm(x + fn(x), norm)


def encoder_block(x, params, key_mask=None, attention_mask=None):
    """Self-attention and feed-forward sub-layers (paper figure 1, left)."""
    pos = params["norm_position"]
    x = _residual(x, lambda h: multi_head_attention(
        h, h, params["self_attention"], params["num_heads"], key_mask=key_mask,
        attention_mask=attention_mask)[0], params["self_attention_norm"], pos)
    return _residual(x, lambda h: feedforward(h, params["feedforward"]),
                     params["feedforward_norm"], pos)


def decoder_block(x, params, context=None, target_mask=None, context_mask=None):
    """Causal self-attention, cross-attention (if present), feed-forward (figure 1, right)."""
    pos, heads = params["norm_position"], params["num_heads"]
    x = _residual(x, lambda h: multi_head_attention(
        h, h, params["self_attention"], heads, key_mask=target_mask, causal=True)[0],
        params["self_attention_norm"], pos)
    if "cross_attention" in params:
        x = _residual(x, lambda h: multi_head_attention(
            h, context, params["cross_attention"], heads, key_mask=context_mask)[0],
            params["cross_attention_norm"], pos)
    return _residual(x, lambda h: feedforward(h, params["feedforward"]),
                     params["feedforward_norm"], pos)


def paper_positional_table(length, d_model, base=10000.0):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    table = np.zeros((length, d_model))
    for pos in range(length):
        for j in range(d_model):
            two_i = j - (j % 2)
            angle = pos / base ** (two_i / d_model)
            table[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return table


def marian_positional_table(length, d_model, base=10000.0):
    """Marian's layout: the paper's angles, sin of each in the first ceil(d/2) columns, the
    cosines of the first floor(d/2) in the rest."""
    half = (d_model + 1) // 2
    table = np.zeros((length, d_model))
    for pos in range(length):
        for i in range(half):
            angle = pos / base ** (2 * i / d_model)
            table[pos, i] = math.sin(angle)
            if half + i < d_model:
                table[pos, half + i] = math.cos(angle)
    return table


def t2t_positional_table(length, d_model, min_timescale=1.0, max_timescale=1.0e4):
    """tensor2tensor ``get_timing_signal_1d``: [sin(pos * inv_t_i)..., cos(pos * inv_t_i)...]."""
    num_timescales = d_model // 2
    increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
    table = np.zeros((length, d_model))
    for pos in range(length):
        for i in range(num_timescales):
            inv_timescale = min_timescale * math.exp(-i * increment)
            table[pos, i] = math.sin(pos * inv_timescale)
            table[pos, num_timescales + i] = math.cos(pos * inv_timescale)
    return table


def embed(ids, params):
    """Scaled token embedding plus position table (before dropout)."""
    x = params["embeddings"][np.asarray(ids)]
    if params["scale"]:
        x = x * math.sqrt(x.shape[-1])
    return x + params["positions"][: x.shape[1]]


def transformer_forward(params, source_ids, target_ids):
    """Whole encoder-decoder forward pass -> logits ``(batch, target_len, vocab)``."""
    source_ids, target_ids = np.asarray(source_ids), np.asarray(target_ids)
    source_mask, target_mask = source_ids != 0, target_ids != 0
    memory = embed(source_ids, params["source_embedding"])
    for block in params["encoder_blocks"]:
        memory = encoder_block(memory, block, key_mask=source_mask)
    if params["encoder_norm"] is not None:
        memory = layer_norm(memory, params["encoder_norm"])
    x = embed(target_ids, params["target_embedding"])
    for block in params["decoder_blocks"]:
        x = decoder_block(x, block, memory, target_mask, source_mask)
    if params["decoder_norm"] is not None:
        x = layer_norm(x, params["decoder_norm"])
    return _logits(x, params)


def gpt_forward(params, ids):
    """Decoder-only forward pass -> logits ``(batch, len, vocab)``."""
    ids = np.asarray(ids)
    x = embed(ids, params["token_embedding"])
    for block in params["blocks"]:
        x = decoder_block(x, block, target_mask=ids != 0)
    if params["final_norm"] is not None:
        x = layer_norm(x, params["final_norm"])
    return _logits(x, params)


def encoder_forward(params, ids, token_type_ids=None):
    """Encoder-only forward pass -> hidden states, pooled output or class logits."""
    ids = np.asarray(ids)
    mask = ids != 0
    x = embed(ids, params["token_embedding"])
    if params["type_embedding"] is not None:
        types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
        x = x + params["type_embedding"][types]
    if params["embedding_norm"] is not None:
        x = layer_norm(x, params["embedding_norm"])
    for block in params["blocks"]:
        x = encoder_block(x, block, key_mask=mask)
    if params["final_norm"] is not None:
        x = layer_norm(x, params["final_norm"])
    if params["pooling"] is None:
        return x
    if params["pooling"] == "cls":
        pooled = np.tanh(dense(x[:, 0], *params["pooler"]))
    else:
        weights = mask[..., None].astype(np.float64)
        pooled = (x * weights).sum(axis=1) / weights.sum(axis=1)
    if params["classifier"] is None:
        return pooled
    return dense(pooled, *params["classifier"])


def _logits(x, params):
    if params["output_projection"] is not None:
        return dense(x, *params["output_projection"])
    return x @ params["tied_output"].T


def cross_entropy_per_token(labels, logits, label_smoothing=0.0):
    """-sum_v target_v log softmax(logits)_v with target = (1 - eps) onehot + eps / V."""
    logits = np.asarray(logits, np.float64)
    vocab = logits.shape[-1]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    target = np.eye(vocab)[np.asarray(labels)] * (1.0 - label_smoothing) + label_smoothing / vocab
    return -(target * log_probs).sum(axis=-1)


# -- reading weights out of the package's Keras layers ---------------------------------------


def to_numpy(x):
    """A backend tensor or Keras variable as a float64 (or int) NumPy array."""
    array = np.asarray(keras.ops.convert_to_numpy(x))
    return array.astype(np.float64) if array.dtype.kind == "f" else array


def dense_params(layer):
    bias = to_numpy(layer.bias) if layer.use_bias else None
    return (to_numpy(layer.kernel), bias)


def norm_params(layer):
    return {"gamma": to_numpy(layer.gamma), "beta": to_numpy(layer.beta),
            "epsilon": layer.epsilon}


def attention_params(layer):
    return {name: dense_params(getattr(layer, f"{name}_dense"))
            for name in ("query", "key", "value", "output")}


def feedforward_params(layer):
    return {"inner": dense_params(layer.inner), "outer": dense_params(layer.outer),
            "activation": layer.activation}


def block_params(block):
    params = {"norm_position": block.norm_position, "num_heads": block.num_heads,
              "self_attention": attention_params(block.self_attention),
              "self_attention_norm": norm_params(block.self_attention_norm),
              "feedforward": feedforward_params(block.feedforward),
              "feedforward_norm": norm_params(block.feedforward_norm)}
    if getattr(block, "cross_attention", False):
        params["cross_attention"] = attention_params(block.cross_attention_layer)
        params["cross_attention_norm"] = norm_params(block.cross_attention_norm)
    return params


def embedding_params(token_embedding, positions):
    """Token matrix, scaling flag and the position table (learned or fixed), as used."""
    if positions.kind == "learned":
        table = to_numpy(positions.table)
    elif positions.kind == "t2t":
        table = t2t_positional_table(positions.max_length, positions.d_model)
    else:
        table = paper_positional_table(positions.max_length, positions.d_model)
    return {"embeddings": to_numpy(token_embedding.embeddings), "scale": token_embedding.scale,
            "positions": table}


def _optional(layer, reader):
    return None if layer is None else reader(layer)


def transformer_params(model):
    tied = model.output_projection is None
    return {
        "source_embedding": embedding_params(model.source_embedding, model.source_positions),
        "target_embedding": embedding_params(model.target_embedding, model.target_positions),
        "encoder_blocks": [block_params(b) for b in model.encoder_blocks],
        "decoder_blocks": [block_params(b) for b in model.decoder_blocks],
        "encoder_norm": _optional(model.encoder_norm, norm_params),
        "decoder_norm": _optional(model.decoder_norm, norm_params),
        "output_projection": _optional(model.output_projection, dense_params),
        "tied_output": to_numpy(model.target_embedding.embeddings) if tied else None,
    }


def gpt_params(model):
    tied = model.output_projection is None
    return {
        "token_embedding": embedding_params(model.token_embedding, model.positions),
        "blocks": [block_params(b) for b in model.blocks],
        "final_norm": _optional(model.final_norm, norm_params),
        "output_projection": _optional(model.output_projection, dense_params),
        "tied_output": to_numpy(model.token_embedding.embeddings) if tied else None,
    }


def encoder_params(model):
    return {
        "token_embedding": embedding_params(model.token_embedding, model.positions),
        "type_embedding": (None if model.type_embedding is None
                           else to_numpy(model.type_embedding.embeddings)),
        "embedding_norm": _optional(model.embedding_layer_norm, norm_params),
        "blocks": [block_params(b) for b in model.blocks],
        "final_norm": _optional(model.final_norm, norm_params),
        "pooling": model.pooling,
        "pooler": _optional(model.pooler, dense_params),
        "classifier": _optional(model.classifier, dense_params),
    }


def randomize_weights(model, seed=0, scale=0.2):
    """Perturb every trainable weight (biases, LayerNorm gammas/betas included) so that a
    test also sees mistakes that zero biases and unit gammas would hide."""
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        value = keras.ops.convert_to_numpy(variable)
        noise = rng.normal(0.0, scale, size=value.shape)
        variable.assign((value + noise).astype(value.dtype))
