"""Vectors files written by the tests (word2vec/GloVe text, optionally gzipped): used by
``data/test_vectors.py`` and the training tests that build tokenizers from vectors."""

import numpy as np


def write_vectors(path, tokens, dim=3, header=True, seed=0, opener=open):
    """A text vectors file; returns ``{token: vector}`` as written (4 decimals)."""
    rng = np.random.default_rng(seed)
    table = {t: np.round(rng.normal(size=dim), 4).astype("float32") for t in tokens}
    lines = [f"{len(tokens)} {dim}"] * header + [
        t + " " + " ".join(f"{x:.4f}" for x in v) for t, v in table.items()]
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return table
