"""Run small models under one Keras backend and save what they compute.

Usage: ``KERAS_BACKEND=jax python tests/support/backend_probe.py SPEC.json OUT.npz``

SPEC.json: ``{"models": [{"name", "type", "config"}...], "inputs": npz, "weights": npz,
"workdir": dir}``. For every model this script

1. builds it from its config and loads the weights from the ``weights`` npz by variable
   path (``{name}/{variable.path}``), refusing any missing or extra weight;
2. records the logits (``{name}/logits``) and a fixed scalar (``{name}/loss``: masked
   cross-entropy with label smoothing for token models, a fixed weighted log-softmax sum
   for the classifier) and its gradient with respect to every trainable weight
   (``{name}/grad/{path}``), computed by the backend's own autodiff: ``jax.grad`` through
   ``stateless_call``, ``tf.GradientTape``, torch autograd;
3. for token models, decodes step by step with the key/value cache in a compiled step
   function (``{name}/cached_logits``);
4. saves its weights as ``{workdir}/{name}.{backend}.weights.h5`` for the test process;
5. zeroes every weight, loads ``{workdir}/{name}.local.weights.h5`` (saved by the test
   process under its own backend) and records the logits again (``{name}/h5_logits``).

One process handles all models, so each backend is imported once.
"""

import json
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from transformerkit.backend import choose_default_backend  # noqa: E402

choose_default_backend()  # before Keras is imported (KERAS_BACKEND is set by the caller)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

from transformerkit.models import GPT, Encoder, Transformer  # noqa: E402
from transformerkit.training import masked_cross_entropy  # noqa: E402

MODEL_TYPES = {"transformer": Transformer, "gpt": GPT, "encoder": Encoder}


# Small models with every option that changes the math somewhere. Names are explicit so
# that variable paths are the same in every process.
PROBE_MODELS = [
    {"name": "transformer", "type": "transformer",
     "config": {"source_vocab_size": 23, "target_vocab_size": 19, "num_layers": 2,
                "d_model": 16, "num_heads": 2, "d_ff": 24, "dropout": 0.0, "max_length": 12,
                "norm_position": "post", "activation": "relu", "positional": "sinusoidal",
                "tie_embeddings": "none", "key_dim": 6, "value_dim": 5,
                "name": "probe_transformer"}},
    {"name": "transformer_tied", "type": "transformer",
     "config": {"source_vocab_size": 21, "target_vocab_size": 21, "num_layers": 1,
                "d_model": 12, "num_heads": 3, "d_ff": 20, "dropout": 0.0, "max_length": 12,
                "norm_position": "pre", "activation": "gelu", "positional": "t2t",
                "tie_embeddings": "all", "name": "probe_transformer_tied"}},
    {"name": "gpt", "type": "gpt",
     "config": {"vocab_size": 17, "num_layers": 2, "d_model": 16, "num_heads": 4, "d_ff": 32,
                "dropout": 0.0, "max_length": 10, "tie_embeddings": "decoder",
                "name": "probe_gpt"}},
    {"name": "encoder", "type": "encoder",
     "config": {"vocab_size": 25, "num_layers": 2, "d_model": 16, "num_heads": 2, "d_ff": 24,
                "dropout": 0.0, "max_length": 12, "norm_position": "pre",
                "activation": "gelu", "positional": "learned", "type_vocab_size": 2,
                "embedding_norm": True, "pooling": "cls", "num_classes": 3,
                "name": "probe_encoder"}},
]


def probe_inputs(rng):
    """Padded integer inputs for each probe model (``{name: {input_name: array}}``)."""
    def ids(vocab, lengths, width):
        out = np.zeros((len(lengths), width), np.int32)
        for row, n in enumerate(lengths):
            out[row, :n] = rng.integers(1, vocab, size=n)
        return out

    return {
        "transformer": {"source": ids(23, [7, 4, 1], 7), "target": ids(19, [6, 3, 5], 6),
                        "labels": ids(19, [6, 2, 5], 6)},
        "transformer_tied": {"source": ids(21, [5, 2], 5), "target": ids(21, [4, 4], 4),
                             "labels": ids(21, [4, 3], 4)},
        "gpt": {"ids": ids(17, [8, 5], 8), "labels": ids(17, [8, 4], 8)},
        "encoder": {"ids": ids(25, [6, 3, 6], 6), "token_type_ids": ids(2, [6, 3, 6], 6),
                    "class_weights": rng.normal(size=(3, 3)).astype(np.float32)},
    }


def build_model(entry):
    return MODEL_TYPES[entry["type"]](**entry["config"])


def model_inputs(entry, arrays):
    """The call input of a model from its named arrays."""
    if entry["type"] == "transformer":
        return (arrays["source"], arrays["target"])
    if entry["type"] == "encoder" and "token_type_ids" in arrays:
        return (arrays["ids"], arrays["token_type_ids"])
    return arrays["ids"]


def scalar_objective(entry, arrays, output):
    """The fixed scalar whose gradients are compared across backends."""
    if entry["type"] == "encoder":  # class logits (batch, classes)
        weights = ops.convert_to_tensor(arrays["class_weights"])
        return ops.sum(ops.log_softmax(output, axis=-1) * weights)
    return masked_cross_entropy(arrays["labels"], output, label_smoothing=0.1)


def load_npz_weights(model, weights, name):
    prefix = f"{name}/"
    expected = {key[len(prefix):] for key in weights if key.startswith(prefix)}
    present = {v.path for v in model.weights}
    if expected != present:
        raise ValueError(f"{name}: weight paths differ; only in the file: "
                         f"{sorted(expected - present)}, only in the model: "
                         f"{sorted(present - expected)}")
    for variable in model.weights:
        variable.assign(weights[prefix + variable.path])


def logits_loss_and_gradients(model, entry, arrays):
    """``(logits, loss, [gradient per trainable weight])`` by the backend's own autodiff."""
    inputs = model_inputs(entry, arrays)
    backend = keras.backend.backend()
    if backend == "jax":
        return _jax_logits_loss_and_gradients(model, entry, arrays, inputs)
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            logits = model(inputs, training=False)
            loss = scalar_objective(entry, arrays, logits)
        return logits, loss, tape.gradient(loss, model.trainable_variables)
    for variable in model.trainable_variables:
        variable.value.grad = None
    logits = model(inputs, training=False)
    loss = scalar_objective(entry, arrays, logits)
    loss.backward()
    return logits.detach(), loss.detach(), [v.value.grad for v in model.trainable_variables]


_JAX_PROGRAMS = {}


def _jax_logits_loss_and_gradients(model, entry, arrays, inputs):
    # One compiled program per model, reused for every weight set: op-by-op JAX would
    # compile each primitive separately, which is many times slower on a CPU.
    import jax

    if id(model) not in _JAX_PROGRAMS:
        def objective(trainable, non_trainable):
            logits, _ = model.stateless_call(trainable, non_trainable, inputs, training=False)
            return scalar_objective(entry, arrays, logits), logits

        _JAX_PROGRAMS[id(model)] = jax.jit(jax.value_and_grad(objective, has_aux=True))
    program = _JAX_PROGRAMS[id(model)]
    (loss, logits), grads = program([v.value for v in model.trainable_variables],
                                    [v.value for v in model.non_trainable_variables])
    return logits, loss, grads


def cached_decoding_logits(model, entry, arrays):
    """Logits of step-by-step decoding with the key/value cache, one position per step, the
    step compiled once with a traced ``cache_index`` (``jax.jit``, ``tf.function``; eager on
    torch with a tensor index): the way a compiled decoding loop runs."""
    backend = keras.backend.backend()
    if entry["type"] == "transformer":
        source, ids = arrays["source"], arrays["target"]
        source_mask = ops.convert_to_tensor(source != 0)

        def start(source):
            return model.init_caches(model.encode(source), ids.shape[1])

        def step(ids, caches, index):
            return model.decode(ids, None, source_mask, caches=caches, cache_index=index)

        start_input = source
    else:
        ids = arrays["ids"]

        def start(batch):
            return model.init_caches(batch.shape[0], ids.shape[1])

        def step(ids, caches, index):
            return model(ids, caches=caches, cache_index=index)

        start_input = np.zeros((ids.shape[0], 1), "int32")
    if backend == "jax":
        import jax

        start, step = jax.jit(start), jax.jit(step)
    elif backend == "tensorflow":
        import tensorflow as tf

        start, step = tf.function(start), tf.function(step)
    caches = start(ops.convert_to_tensor(start_input))
    steps = []
    for i in range(ids.shape[1]):
        logits, caches = step(ops.convert_to_tensor(ids[:, i:i + 1]), caches,
                              ops.convert_to_tensor(i, "int32"))
        steps.append(ops.convert_to_numpy(logits))
    return np.concatenate(steps, axis=1)


def main(spec_path, out_path):
    spec = json.loads(Path(spec_path).read_text())
    inputs_file = np.load(spec["inputs"])
    weights = dict(np.load(spec["weights"]))
    workdir = Path(spec["workdir"])
    backend = keras.backend.backend()
    results = {}
    for entry in spec["models"]:
        started = time.perf_counter()
        name = entry["name"]
        arrays = {key[len(name) + 1:]: inputs_file[key] for key in inputs_file.files
                  if key.startswith(name + "/")}
        model = build_model(entry)
        model.build(None)
        load_npz_weights(model, weights, name)
        logits, loss, grads = logits_loss_and_gradients(model, entry, arrays)
        results[f"{name}/logits"] = ops.convert_to_numpy(logits)
        results[f"{name}/loss"] = np.asarray(ops.convert_to_numpy(loss))
        for variable, grad in zip(model.trainable_variables, grads, strict=True):
            if grad is None:
                raise ValueError(f"{name}: no gradient for {variable.path} under {backend}")
            results[f"{name}/grad/{variable.path}"] = ops.convert_to_numpy(grad)
        if entry["type"] in ("transformer", "gpt"):
            results[f"{name}/cached_logits"] = cached_decoding_logits(model, entry, arrays)
        model.save_weights(str(workdir / f"{name}.{backend}.weights.h5"))

        local_h5 = workdir / f"{name}.local.weights.h5"
        if local_h5.exists():  # wipe the weights, then load the other process's file
            for variable in model.weights:
                variable.assign(np.zeros(variable.shape, variable.dtype))
            model.load_weights(str(local_h5))
            logits, _, _ = logits_loss_and_gradients(model, entry, arrays)
            results[f"{name}/h5_logits"] = ops.convert_to_numpy(logits)
        print(f"{backend} {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    np.savez(out_path, **results)
    print(f"backend_probe: {backend}: {len(spec['models'])} models, {len(results)} arrays")


if __name__ == "__main__":
    main(*sys.argv[1:3])
