"""A user's script: the three models trained, evaluated, saved and reloaded with Keras' own
``compile`` / ``fit`` / ``evaluate`` / ``predict`` / ``save`` / ``keras.saving.load_model``
and nothing of transformerkit beyond the model classes, as any Keras tutorial writes it.

Usage: ``KERAS_BACKEND=jax python tests/support/plain_keras_user.py OUT_DIR`` (any backend); prints
one JSON line per model: its loss before and after ``fit``, whether ``fit`` changed the
weights, and the largest difference of the reloaded model's predictions from the model's.
``tests/models/test_plain_keras.py`` runs it under each backend.
"""

import json
import os
import sys

import keras
import numpy as np

from transformerkit.models import GPT, Encoder, Transformer

SMALL = dict(num_layers=1, d_model=32, num_heads=4, d_ff=64, max_length=16, dropout=0.0)


def copy_task(rows=64, length=10, vocab=40, seed=0):
    """Source ids and the same ids as the target (start token 1, ids from 3, padding 0)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(3, vocab, (rows, length)).astype("int32")
    x[::4, length - 3:] = 0  # some padded rows
    return x


def train(model, x, y, loss, epochs=8):
    """compile, evaluate, fit, evaluate, predict, save, load, predict: what a user runs."""
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=loss, metrics=["accuracy"])
    before = model.evaluate(x, y, batch_size=16, verbose=0)[0]
    weights = [np.array(w) for w in model.get_weights()]
    model.fit(x, y, batch_size=16, epochs=epochs, verbose=0)
    after = model.evaluate(x, y, batch_size=16, verbose=0)[0]
    changed = any(not np.array_equal(a, np.array(b)) for a, b in
                  zip(weights, model.get_weights(), strict=True))
    predictions = model.predict(x, batch_size=16, verbose=0)
    path = os.path.join(sys.argv[1], f"{model.name}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    difference = float(np.max(np.abs(reloaded.predict(x, batch_size=16, verbose=0)
                                      - predictions)))
    return {"model": type(model).__name__, "before": float(before), "after": float(after),
            "changed": changed, "reloaded_difference": difference,
            "backend": keras.backend.backend()}


def main():
    keras.utils.set_random_seed(0)
    ids = copy_task()
    start = np.ones((len(ids), 1), "int32")
    decoder_input = np.concatenate([start, ids[:, :-1]], axis=1) * (ids > 0)
    transformer = Transformer(source_vocab_size=40, target_vocab_size=40, name="transformer",
                              **SMALL)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    print(json.dumps(train(transformer, (ids, decoder_input), ids, loss)))

    gpt = GPT(vocab_size=40, name="gpt", **SMALL)
    print(json.dumps(train(gpt, ids[:, :-1], ids[:, 1:], loss)))

    labels = (ids[:, 0] > 20).astype("int32")  # a class the first token decides
    encoder = Encoder(vocab_size=40, pooling="cls", num_classes=2, name="encoder", **SMALL)
    print(json.dumps(train(encoder, ids, labels, loss)))


if __name__ == "__main__":
    main()
