"""End to end: a few hundred ``model.fit`` steps on a copy task drive the loss down, and greedy
decoding with the key/value cache then copies unseen sequences exactly.

A leak of future tokens (a wrong causal mask) would make teacher-forced training look good
and greedy decoding fail, so this also guards the masks end to end.
"""

import keras
import numpy as np

from transformerkit.models import Transformer
from transformerkit.training import (
    MaskedAccuracy,
    MaskedCrossEntropy,
    attach_train_step,
    masked_cross_entropy,
)

VOCAB, MAX_LEN, START, END = 13, 8, 1, 2  # ids 3..12 are the symbols to copy


def copy_batch(rng, n):
    """``(source, target_input, labels)``: source of 3..8 symbols, right-padded with 0."""
    lengths = rng.integers(3, MAX_LEN + 1, n)
    source = np.zeros((n, MAX_LEN), "int32")
    labels = np.zeros((n, MAX_LEN + 1), "int32")
    for row, length in enumerate(lengths):
        source[row, :length] = rng.integers(3, VOCAB, length)
        labels[row, :length] = source[row, :length]
        labels[row, length] = END
    target_input = np.concatenate([np.full((n, 1), START, "int32"), source], axis=1)
    return source, target_input, labels


def greedy_decode(model, source, max_steps):
    """Greedy decoding with the key/value cache, one position per step."""
    memory = model.encode(source)
    caches = model.init_caches(memory, max_steps)
    token = np.full((len(source), 1), START, "int32")
    outputs = []
    for i in range(max_steps):
        logits, caches = model.decode(token, None, source != 0, caches=caches, cache_index=i)
        token = keras.ops.convert_to_numpy(keras.ops.argmax(logits[:, -1], axis=-1))
        token = token.astype("int32")[:, None]
        outputs.append(token)
    return np.concatenate(outputs, axis=1)


STEPS = 400


def test_transformer_learns_to_copy():
    # Seeded weights (the test must not depend on what ran before it in the process) and a
    # learning rate decayed to 0: with a constant 3e-3 and 300 steps, exact copies ranged
    # from 91% to 100% with the seed and the CPU's kernels; this setting gave 99-100% over
    # six seeds.
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    model = Transformer(VOCAB, VOCAB, num_layers=1, d_model=32, num_heads=4, d_ff=64,
                        dropout=0.0, max_length=MAX_LEN + 1)
    schedule = keras.optimizers.schedules.CosineDecay(3e-3, STEPS)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss=MaskedCrossEntropy(),
                  metrics=[MaskedAccuracy()])
    attach_train_step(model)
    held_out = copy_batch(rng, 64)
    before = float(keras.ops.convert_to_numpy(
        masked_cross_entropy(held_out[2], model(held_out[:2]))))
    source, target_input, labels = copy_batch(rng, STEPS * 64)
    model.fit((source, target_input), labels, batch_size=64, epochs=1, shuffle=False, verbose=0)
    loss, accuracy = model.evaluate(held_out[:2], held_out[2], batch_size=64, verbose=0)
    assert before > 2.0  # about log(13) untrained
    assert loss < 0.1 and accuracy > 0.98

    decoded = greedy_decode(model, held_out[0], MAX_LEN + 1)
    real = held_out[2] != 0
    exact = [np.array_equal(decoded[row][real[row]], held_out[2][row][real[row]])
             for row in range(len(decoded))]
    assert np.mean(exact) >= 0.95, f"only {np.mean(exact):.0%} of sequences copied exactly"
