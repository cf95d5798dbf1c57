"""The two tiny runs the serving tests serve, trained once for the whole test run (the
in-process API tests of ``test_serving.py`` and the browser tests of ``test_page.py`` use the
same runs): a character de->en Transformer on number words, trained long enough to translate
a few of them (the page draws the attention of its translation), and a character GPT."""

import pytest
from tiny_run import GERMAN, tiny_config


def train_served_runs(folder):
    """``numbers`` (1 layer, d_model 32, 40 epochs) and ``poet`` (1 layer, d_model 16,
    10 steps) in ``folder``."""
    from transformerkit.config import resolve
    from transformerkit.training.trainer import train

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRANSFORMERKIT_MALLOC", "system")
        # enough to translate a few number words
        config = tiny_config(folder, epochs=40).replace(model={"d_model": 32, "d_ff": 64})
        train(config, folder / "numbers")
        text = folder / "text.txt"
        text.write_text((" ".join(GERMAN) + "\n") * 40)
        train(resolve({
            "model": {"type": "gpt", "num_layers": 1, "d_model": 16, "num_heads": 2,
                      "d_ff": 32, "dropout": 0.0, "max_length": 32},
            "data": {"dataset": "text", "text": str(text), "tokenizer": "char",
                     "block_size": 16, "batch_size": 8, "steps_per_epoch": 10},
            "train": {"epochs": 1, "learning_rate": 0.01, "verbose": 0, "samples": 0}}),
            folder / "poet")


@pytest.fixture(scope="session")
def run_dirs(build_once):
    """``(numbers, poet)``: the folders of the two served runs."""
    folder = build_once("served_runs", train_served_runs)
    return folder / "numbers", folder / "poet"
