"""End-to-end `transformerkit train` on a slice of Multi30k, and exact resume after SIGKILL."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from near_ties import assert_same_texts_or_near_tie

TINY = [
    "data.train_limit=600", "data.val_limit=40", "data.vocab_size=600",
    "data.tokens_per_batch=1024", "model.num_layers=1", "model.d_model=32",
    "model.num_heads=4", "model.d_ff=64", "model.max_length=48", "data.max_length=48",
    "train.warmup_steps=50", "train.eval_max_sentences=8", "train.decode_max_length=12",
    "train.samples=2", "train.verbose=0",
]


def run_cli(args, env=None, **kwargs):
    command = [sys.executable, "-m", "transformerkit.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env or os.environ.copy(),
                          timeout=600, **kwargs)


def sets(items):
    return [arg for item in items for arg in ("--set", item)]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("run") / "demo"
    result = run_cli(["train", "configs/multi30k_de_en.yaml", "--out", str(out),
                      "--data-dir", str(data_dir), *sets(TINY + ["train.epochs=2"])])
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_run_directory_is_complete(trained_run):
    out, result = trained_run
    for name in ("config.yaml", "tokenizer.json", "model.keras", "history.csv", "metrics.json",
                 "samples.txt", "checkpoints/latest.json", "checkpoints/best.keras"):
        assert (out / name).exists(), name
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert float(rows[1]["loss"]) < float(rows[0]["loss"])  # it learns something
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] > 0 and metrics["stopped_by"] == "epochs"
    assert 0.0 <= metrics["val_bleu"] <= 100.0 and "BLEU" not in metrics["val_bleu_signature"]
    assert metrics["val_sentences_scored"] == 8
    samples = (out / "samples.txt").read_text()
    assert samples.count("SOURCE:") == 2 and "MODEL:" in samples
    assert "val_bleu" in result.stdout


def test_model_loads_and_matches_saved_config(trained_run):
    import yaml

    from transformerkit.saving import load_model

    out, _ = trained_run
    model = load_model(out / "model.keras")
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert model.d_model == config["model"]["d_model"] == 32
    assert model.tie_embeddings == "all"


def test_the_run_searches_as_its_training_config_says(trained_run):
    """configs/multi30k_de_en.yaml's ``search:`` section (its length penalty and n-gram rule,
    chosen on val) travels into the run: translate and Run.translate use it unless told
    otherwise, and the run's own samples and validation scores were searched with it."""
    import yaml

    import transformerkit

    out, _ = trained_run
    shipped = yaml.safe_load(open("configs/multi30k_de_en.yaml", encoding="utf-8"))["search"]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["search"]["alpha"] == shipped["alpha"] != 0.6
    run = transformerkit.load(out)
    assert run.search.alpha == shipped["alpha"]
    assert run.search_options(None, {"beam_size": 2}).alpha == shipped["alpha"]
    assert run.search_options(None, {"alpha": 0.6}).alpha == 0.6
    # the samples were searched as translate searches (greedy, the run's decode_max_length)
    lines = (out / "samples.txt").read_text(encoding="utf-8").splitlines()
    sources = [line.split(":", 1)[1].strip() for line in lines if line.startswith("SOURCE:")]
    shown = [line.split(":", 1)[1].strip() for line in lines if line.startswith("MODEL:")]
    assert len(sources) == len(shown) == 2
    translated = run.translate(sources, beam_size=1, max_new_tokens=12)
    assert_same_texts_or_near_tie(run, sources, shown, translated)
    size = shipped.get("no_repeat_ngram_size", 0)
    assert run.search.no_repeat_ngram_size == size
    for text in shown + translated:
        ids = run.target_tokenizer.encode(text)
        grams = [tuple(ids[j:j + size]) for j in range(len(ids) - size + 1)]
        assert not size or len(grams) == len(set(grams)), text


def test_refuses_to_overwrite_a_run(trained_run, data_dir):
    out, _ = trained_run
    result = run_cli(["train", "configs/multi30k_de_en.yaml", "--out", str(out),
                      "--data-dir", str(data_dir)])
    assert result.returncode == 2
    assert "already holds a run" in result.stderr


def test_bad_config_is_one_clear_error(tmp_path):
    result = run_cli(["train", "configs/multi30k_de_en.yaml", "--out", str(tmp_path / "x"),
                      "--set", "model.d_modle=3"])
    assert result.returncode == 2
    assert "unknown key model.d_modle" in result.stderr
    assert "Traceback" not in result.stderr


def test_max_steps_stops_training(tmp_path, data_dir):
    out = tmp_path / "steps"
    result = run_cli(["train", "configs/multi30k_de_en.yaml", "--out", str(out),
                      "--data-dir", str(data_dir), *sets(TINY + ["train.max_steps=3"])])
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3 and metrics["stopped_by"] == "max_steps"


def _final_weights(run_dir):
    from transformerkit.saving import load_model

    model = load_model(os.path.join(run_dir, "model.keras"))
    return [np.asarray(w) for w in model.get_weights()]


def test_exact_resume_after_sigkill(tmp_path, data_dir):
    """N epochs straight == k epochs, SIGKILL mid-epoch, --resume, finish (same weights)."""
    common = ["--data-dir", str(data_dir), *sets(TINY + ["train.epochs=3",
                                                         "data.train_limit=1500"])]
    straight = tmp_path / "straight"
    result = run_cli(["train", "configs/multi30k_de_en.yaml", "--out", str(straight), *common])
    assert result.returncode == 0, result.stderr[-3000:]

    killed = tmp_path / "killed"
    command = [sys.executable, "-m", "transformerkit.cli", "train", "configs/multi30k_de_en.yaml",
               "--out", str(killed), *common]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = killed / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 300
    while not state.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert state.exists(), "no checkpoint was written"
    time.sleep(0.5)  # into the second epoch
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "model.keras").exists(), "the run finished before it was killed"

    resumed = run_cli(["train", "configs/multi30k_de_en.yaml", "--out", str(killed), "--resume",
                       *common])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for a, b in zip(_final_weights(straight), _final_weights(killed), strict=True):
        np.testing.assert_array_equal(a, b)
    history = list(csv.DictReader(open(killed / "history.csv")))
    assert [int(r["epoch"]) for r in history][-2:] == [1, 2]
