"""Samples while training (``train.sample_every`` and ``train.sample_*``): the GPT path of
the sample callback takes its prompts and sampling options from the config, logs them and
keeps them in ``samples.txt``, before the final samples."""

import logging

import pytest

import transformerkit
from transformerkit.config import ConfigError, resolve
from transformerkit.training.trainer import train

TEXT = "the cat sat on the mat. the dog sat on the log. " * 40


def gpt_config(tmp_path, **train_keys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    return resolve({
        "model": {"type": "gpt", "num_layers": 1, "d_model": 16, "num_heads": 2, "d_ff": 32,
                  "max_length": 16, "initialization": "paper"},
        "data": {"dataset": "text", "text": str(text), "tokenizer": "char", "block_size": 16,
                 "batch_size": 4, "steps_per_epoch": 3},
        "train": {"epochs": 2, "learning_rate": 0.01, "verbose": 0, "samples": 2,
                  "optimizer": "adamw_cosine", "warmup_steps": 1, **train_keys}})


def test_gpt_samples_follow_the_config_during_training_and_at_the_end(tmp_path, caplog):
    config = gpt_config(tmp_path, sample_every=1, sample_prompts=["the c", "a d"],
                        sample_max_tokens=6, sample_temperature=0.7, sample_top_k=5,
                        sample_top_p=0.9, seed=3)
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="transformerkit"):
        train(config, str(run_dir))
    text = (run_dir / "samples.txt").read_text()
    blocks = text.split("--- final samples ---")
    assert len(blocks) == 2
    during, final = blocks
    for epoch in (1, 2):  # one block per epoch, each with every prompt at the run's seed
        assert f"--- samples after epoch {epoch} ---" in during
    assert during.count("[prompt 'the c', seed 3]") == 2
    assert during.count("[prompt 'a d', seed 3]") == 2
    assert "--- samples after epoch 2 ---" in caplog.text  # and in the log
    assert "[prompt 'a d', seed 3]" in caplog.text
    # the final samples: every prompt x seeds 0..samples-1, reproducible through the API
    # with the same options, each the prompt plus at most sample_max_tokens characters
    run = transformerkit.load(str(run_dir))
    lines = final.strip().splitlines()
    assert lines[0::2] == [f"[prompt {p!r}, seed {s}]" for p in ("the c", "a d") for s in (0, 1)]
    for heading, sample in zip(lines[0::2], lines[1::2], strict=True):
        prompt = "the c" if "'the c'" in heading else "a d"
        seed = int(heading.rsplit(" ", 1)[1].rstrip("]"))
        assert sample == run.generate(prompt, max_new_tokens=6, temperature=0.7, top_k=5,
                                      top_p=0.9, seed=seed)
        assert sample.startswith(prompt) and len(sample) <= len(prompt) + 6


def test_without_sample_every_samples_txt_holds_the_final_samples_only(tmp_path):
    config = gpt_config(tmp_path, epochs=1, sample_prompts=["the"], sample_max_tokens=4)
    train(config, str(tmp_path / "run"))
    lines = (tmp_path / "run" / "samples.txt").read_text().strip().splitlines()
    assert lines[0::2] == ["[prompt 'the', seed 0]", "[prompt 'the', seed 1]"]


@pytest.mark.parametrize("key, value, message", [
    ("sample_prompts", [], "non-empty list"),
    ("sample_prompts", ["ok", ""], "non-empty strings"),
    ("sample_temperature", -1.0, "sample_temperature must be a finite number >= 0"),
    ("sample_top_p", 1.5, "sample_top_p must be in"),
    ("sample_top_k", 0, "sample_top_k must be at least 1"),
    ("sample_max_tokens", 0, "sample_max_tokens must be at least 1"),
])
def test_bad_sampling_keys_are_config_errors(key, value, message):
    with pytest.raises(ConfigError, match=message):
        resolve({"train": {key: value}})


def test_validation_bleu_during_training_searches_with_eval_beam_size(tmp_path, caplog):
    """``train.eval_beam_size`` covers the validation BLEU of ``bleu_every`` too: the last
    epoch's ``val_bleu`` in history.csv is sacreBLEU of the final model's translations of the
    validation sentences with that beam (``Run.translate``), and the log line names it."""
    import csv

    from tiny_run import tiny_config, write_corpus

    from transformerkit.evaluation import corpus_scores

    val_folder = tmp_path / "val"
    val_folder.mkdir()
    val_source, val_target = write_corpus(val_folder, pairs=8, seed=5)
    config = tiny_config(tmp_path, epochs=2, bleu_every=1, eval_beam_size=3,
                         decode_max_length=12)
    config = config.replace(data={"val_source": val_source, "val_target": val_target})
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="transformerkit"):
        train(config, str(run_dir))
    assert "beam 3)" in caplog.text and "beam 1)" not in caplog.text
    with open(run_dir / "history.csv", newline="") as f:
        last = list(csv.DictReader(f))[-1]
    sources = open(val_source).read().splitlines()
    references = open(val_target).read().splitlines()
    run = transformerkit.load(str(run_dir))
    beam = run.translate(sources, beam_size=3, max_new_tokens=12)
    assert float(last["val_bleu"]) == pytest.approx(corpus_scores(beam, references)["bleu"])
