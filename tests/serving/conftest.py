"""The two tiny runs the serving tests serve, trained once for the whole test run (the
in-process API tests of ``test_serving.py`` and the browser tests of ``test_page.py`` use the
same runs): a character de->en Transformer on number words, trained long enough to translate
a few of them (the page draws the attention of its translation), and a character GPT."""

import pytest
from tiny_run import tiny_config, tiny_gpt_config


def train_served_runs(folder):
    """``numbers`` (1 layer, d_model 32, 40 epochs) and ``poet`` (1 layer, d_model 16,
    10 steps) in ``folder``."""
    from transformerkit.training.trainer import train

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRANSFORMERKIT_MALLOC", "system")
        # enough to translate a few number words
        config = tiny_config(folder, epochs=40).replace(model={"d_model": 32, "d_ff": 64})
        train(config, folder / "numbers")
        train(tiny_gpt_config(folder), folder / "poet")


@pytest.fixture(scope="session")
def run_dirs(build_once):
    """``(numbers, poet)``: the folders of the two served runs."""
    folder = build_once("served_runs", train_served_runs)
    return folder / "numbers", folder / "poet"
