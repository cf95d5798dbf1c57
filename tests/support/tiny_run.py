"""A tiny parallel corpus and config for in-process ``transformerkit.train`` tests (seconds,
no shared data): number words, German -> English, character tokenizer (deterministic)."""

import numpy as np

from transformerkit.config import resolve

GERMAN = "ein zwei drei vier fuenf sechs sieben acht neun zehn".split()
ENGLISH = "one two three four five six seven eight nine ten".split()


def write_corpus(folder, pairs=24, seed=1):
    """``(source_path, target_path)`` of ``pairs`` sentences of 2-5 number words."""
    rng = np.random.default_rng(seed)
    picks = [rng.integers(0, 10, rng.integers(2, 6)) for _ in range(pairs)]
    source, target = folder / "train.de", folder / "train.en"
    source.write_text("\n".join(" ".join(GERMAN[i] for i in p) for p in picks) + "\n")
    target.write_text("\n".join(" ".join(ENGLISH[i] for i in p) for p in picks) + "\n")
    return str(source), str(target)


def tiny_config(folder, **train):
    """A resolved config: 1-layer d_model 16 Transformer, batches of 4 pairs, 2 epochs;
    ``train`` overrides keys of the ``train:`` section."""
    source, target = write_corpus(folder)
    return resolve({
        "model": {"num_layers": 1, "d_model": 16, "num_heads": 2, "d_ff": 32, "dropout": 0.0,
                  "max_length": 40},
        "data": {"dataset": "parallel", "train_source": source, "train_target": target,
                 "tokenizer": "char", "batch_size": 4},
        "train": {"epochs": 2, "learning_rate": 0.003, "verbose": 0, "samples": 0, **train}})


def tiny_gpt_config(folder, steps=10):
    """A resolved config: a 1-layer d_model 16 character GPT on the number words (written to
    ``folder/text.txt``), one epoch of ``steps`` updates."""
    text = folder / "text.txt"
    text.write_text((" ".join(GERMAN) + "\n") * 40)
    return resolve({
        "model": {"type": "gpt", "num_layers": 1, "d_model": 16, "num_heads": 2,
                  "d_ff": 32, "dropout": 0.0, "max_length": 32},
        "data": {"dataset": "text", "text": str(text), "tokenizer": "char",
                 "block_size": 16, "batch_size": 8, "steps_per_epoch": steps},
        "train": {"epochs": 1, "learning_rate": 0.01, "verbose": 0, "samples": 0}})
