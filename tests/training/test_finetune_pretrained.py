"""``model.pretrained: FOLDER_OR_RUN`` in GPT and translation configs: fine-tuning a
checkpoint (``training/finetune.py``), through the shipped configs
``configs/finetune_gpt2_shakespeare.yaml`` and ``configs/finetune_opus_mt.yaml`` with the
source overridden to tiny local checkpoints and the step counts cut.

Checked: the fine-tuned weights differ from the checkpoint's while the tokenizer file is
the checkpoint's, byte for byte; the result exports to Hugging Face (logits within the
float32 bound of ``tests/support/tolerances.py``) and to CTranslate2 (greedy ids equal except at a
near-tie); a run directory as the source gives the weights the same checkpoint gives as a
Hugging Face folder, exactly (the same start, data and steps); conflicting keys are errors
naming the key, written before anything is; SIGKILL then ``--resume`` ends with the weights
of an uninterrupted run, exactly (slow).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tolerances as tol
import yaml
from gpt2_checkpoints import CORPUS, tiny_gpt2
from kill_and_resume import assert_killed_run_resumes_exactly
from near_ties import (
    assert_same_ids_or_near_tie,
    assert_same_texts_or_near_tie,
    next_logits_after,
)
from tiny_run import ENGLISH, GERMAN, tiny_config

import transformerkit
from transformerkit.cli import main
from transformerkit.config import ConfigError, load_config
from transformerkit.models import GPT
from transformerkit.saving import load_model
from transformerkit.training.trainer import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT_CONFIG = os.path.join(ROOT, "configs", "finetune_gpt2_shakespeare.yaml")
OPUS_CONFIG = os.path.join(ROOT, "configs", "finetune_opus_mt.yaml")
TEXTS = ["A man in an orange hat.", "Zwei Männer!", "The 12 dogs ran"]


def _weights(path):
    return [np.asarray(w) for w in load_model(path).get_weights()]


def _sets(overrides):
    return [a for override in overrides for a in ("--set", override)]


def _text(folder):
    path = folder / "text.txt"
    path.write_text("\n".join(CORPUS) + "\n")
    return str(path)


def gpt_overrides(source, text, **extra):
    """The shipped GPT-2 recipe on a tiny checkpoint: 16-token blocks (its context is 40),
    2 updates an epoch of 2 accumulated batches, 2 epochs."""
    keys = {"model.pretrained": source, "data.text": text, "data.block_size": 16,
            "data.batch_size": 2, "data.steps_per_epoch": 4, "train.epochs": 2,
            "train.accumulate_steps": 2, "train.learning_rate": 1e-3,
            "train.min_learning_rate": 1e-3, "train.verbose": 0,
            "train.sample_max_tokens": 5, "train.decode_max_length": 10, **extra}
    return [f"{key}={value}" for key, value in keys.items()]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny random GPT-2 folder, its import and its text."""
    folder = tmp_path_factory.mktemp("gpt2")
    tiny_gpt2(folder / "hf")
    assert main(["import", str(folder / "hf"), "--out", str(folder / "imported")]) == 0
    return folder


@pytest.fixture(scope="module")
def finetuned_gpt2(gpt2):
    """``configs/finetune_gpt2_shakespeare.yaml`` from the tiny folder, through the CLI."""
    run = gpt2 / "finetuned"
    overrides = gpt_overrides(str(gpt2 / "hf"), _text(gpt2), **{
        "train.checkpoint_every": 1, "train.checkpoints_to_keep": 4, "train.average_last": 2})
    assert main(["train", GPT_CONFIG, "--out", str(run), *_sets(overrides)]) == 0
    return run


def test_gpt2_fine_tune_changes_the_weights_and_keeps_the_tokenizer(gpt2, finetuned_gpt2):
    run = finetuned_gpt2
    before = GPT.from_pretrained(gpt2 / "hf")
    after = load_model(run / "model.keras")
    assert [tuple(w.shape) for w in after.weights] == [tuple(w.shape) for w in before.weights]
    changed = [not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(after.weights, before.weights, strict=True)]
    # every trained matrix moved (Adam steps of ~1e-3); the two zero rows of <pad> and <s>
    # in the embedding moved too, so every variable is counted
    assert sum(changed) == len(changed), sum(changed)
    assert (run / "tokenizer.json").read_bytes() == \
        (gpt2 / "imported" / "tokenizer.json").read_bytes()
    config = load_config(run / "config.yaml")
    imported = load_config(gpt2 / "imported" / "config.yaml")
    for key, value in imported.model.items():  # the checkpoint's architecture, the recipe's
        if key not in ("dropout", "attention_dropout", "pretrained"):  # dropout
            assert config.model[key] == value, key
    assert config.model["dropout"] == config.model["attention_dropout"] == 0.0
    assert imported.model["dropout"] == imported.model["attention_dropout"] == 0.1
    assert config.model["pretrained"] == str(gpt2 / "hf")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["accumulate_steps"] == 2
    assert metrics["averaged"]["checkpoints"] == ["epoch-0001-batch-0000002.keras",
                                                  "epoch-0002.keras"]
    assert sorted(os.listdir(run / "checkpoints")) == sorted([
        "best.keras", "epoch-0000-batch-0000002.keras", "epoch-0001.keras",
        "epoch-0001-batch-0000002.keras", "epoch-0002.keras", "latest.json"])


def test_gpt2_fine_tune_exports_to_hugging_face_and_ctranslate2(finetuned_gpt2, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    pytest.importorskip("ctranslate2")
    run = transformerkit.load(finetuned_gpt2)
    assert main(["export", str(finetuned_gpt2), "--format", "huggingface", "--out",
                 str(tmp_path / "hf")]) == 0
    exported = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    rows = [run.source_tokenizer.encode(t) for t in TEXTS]
    ids = np.zeros((len(rows), max(map(len, rows))), "int64")
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    mask = ids != 0
    with torch.no_grad():
        theirs = exported(input_ids=torch.as_tensor(ids),
                          attention_mask=torch.as_tensor(mask.astype("int64"))).logits.numpy()
    import keras

    ours = keras.ops.convert_to_numpy(run.model(ids.astype("int32")))
    bound = tol.chain_atol(tol.model_roundings(run.model, target_len=ids.shape[1]),
                           theirs[mask], paths=2)
    tol.assert_within(ours[mask], theirs[mask], bound)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    for text in TEXTS:
        assert hf_tokenizer(text)["input_ids"] == run.source_tokenizer.encode(text), text

    assert main(["export", str(finetuned_gpt2), "--format", "ctranslate2", "--quantization",
                 "float32", "--out", str(tmp_path / "ct2")]) == 0
    run = transformerkit.load(finetuned_gpt2)
    options = dict(max_new_tokens=8, temperature=0, stop_at_eos=False)
    for text in TEXTS:
        prompt = run.source_tokenizer.encode(text)
        ours = run.generate(text, **options)
        theirs = run.generate(text, engine="ctranslate2", **options)
        assert_same_ids_or_near_tie([run.source_tokenizer.encode(theirs)[len(prompt):]],
                                    [run.source_tokenizer.encode(ours)[len(prompt):]],
                                    next_logits_after(run.model, prompts=[prompt]), text)


def test_a_run_directory_source_starts_where_its_folder_does(gpt2, tmp_path):
    """The import of the folder as the source gives the weights the folder gives, exactly:
    the same start, tokenizer, batches and steps."""
    text = _text(tmp_path)
    runs = {}
    for name, source in (("folder", gpt2 / "hf"), ("run", gpt2 / "imported")):
        config = load_config(GPT_CONFIG, gpt_overrides(str(source), text, **{
            "train.epochs": 1, "model.dropout": 0.1}))
        train(config, tmp_path / name)
        runs[name] = _weights(tmp_path / name / "model.keras")
    for a, b in zip(runs["folder"], runs["run"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == \
        (gpt2 / "imported" / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("override, message", [
    ("model.d_model=256", "model.d_model: 256 conflicts with the pretrained checkpoint's 32"),
    ("model.num_layers=2", "model.num_layers: 2 conflicts with the pretrained checkpoint's 3"),
    ("model.activation=relu", "model.activation: 'relu' conflicts with the pretrained "
                              "checkpoint's 'gelu_tanh'"),
    ("model.type=transformer", "model.type: 'transformer' conflicts with the pretrained "
                               "checkpoint's 'gpt'"),
    ("data.vocab_size=100", "data.vocab_size: 100 conflicts with the pretrained checkpoint's"),
    ("data.tokenizer=char", "data.tokenizer: 'char' conflicts with the pretrained "
                            "checkpoint's 'bpe'"),
    ("model.embeddings={shared: vectors.txt}", "model.embeddings: the pretrained checkpoint "
                                               "brings its own"),
])
def test_conflicting_keys_are_named(gpt2, tmp_path, override, message):
    config = load_config(GPT_CONFIG, [*gpt_overrides(str(gpt2 / "hf"), _text(tmp_path)),
                                      override])
    with pytest.raises(ConfigError, match=message):
        train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_source_errors(gpt2, tmp_path, capsys):
    text = _text(tmp_path)
    config = load_config(GPT_CONFIG, gpt_overrides(str(tmp_path / "missing"), text))
    with pytest.raises(FileNotFoundError, match="checkpoint folder not found"):
        train(config, tmp_path / "run")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text((gpt2 / "imported" / "config.yaml").read_text())
    config = load_config(GPT_CONFIG, gpt_overrides(str(unfinished), text))
    with pytest.raises(FileNotFoundError, match="has no model.keras"):
        train(config, tmp_path / "run")
    # the CLI: one line naming the key, exit status 2
    assert main(["train", GPT_CONFIG, "--out", str(tmp_path / "cli"),
                 *_sets(gpt_overrides(str(gpt2 / "hf"), text, **{"model.d_ff": 64}))]) == 2
    assert "model.d_ff: 64 conflicts" in capsys.readouterr().err
    # the architecture is known once train reads the checkpoint: summary takes the run
    assert main(["summary", GPT_CONFIG]) == 2
    assert "checkpoint's architecture" in capsys.readouterr().err


def test_early_stopping_on_a_fine_tune(gpt2, tmp_path):
    """A learning rate of ~0 never improves val_loss after the first epoch: patience 1 stops
    after epoch 2 of 5."""
    config = load_config(GPT_CONFIG, gpt_overrides(str(gpt2 / "hf"), _text(tmp_path), **{
        "train.epochs": 5, "train.patience": 1, "train.learning_rate": "1.0e-12",
        "train.min_learning_rate": "1.0e-12", "train.accumulate_steps": 1,
        "data.steps_per_epoch": 1, "train.samples": 0}))
    metrics = train(config, tmp_path / "run")
    assert metrics["stopped_by"] == "early_stopping" and metrics["steps"] == 2


# -- translation: configs/finetune_opus_mt.yaml -------------------------------------------


def _tsv(folder, pairs=40, seed=3):
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(pairs):
        picks = rng.integers(0, 10, rng.integers(2, 6))
        lines.append(" ".join(GERMAN[i] for i in picks) + "\t"
                     + " ".join(ENGLISH[i] for i in picks))
    path = folder / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def opus_overrides(source, tsv, **extra):
    keys = {"model.pretrained": source, "data.train_tsv": tsv, "data.val_tsv": tsv,
            "data.test_tsv": tsv, "data.max_length": 40, "data.tokens_per_batch": 200,
            "train.epochs": 1, "train.checkpoint_every": 2, "train.learning_rate": 1e-3,
            "train.bleu_max_sentences": 4, "train.samples": 2, "train.verbose": 0,
            "train.decode_max_length": 12, **extra}
    return [f"{key}={value}" for key, value in keys.items()]


def test_opus_mt_recipe_fine_tunes_a_translation_run(tmp_path, capsys):
    """configs/finetune_opus_mt.yaml from a translation run trained here (a run directory
    source): the weights move, the vocabulary is the source run's, translate works."""
    base = tmp_path / "base"
    train(tiny_config(tmp_path, epochs=1), base)
    run = tmp_path / "finetuned"
    assert main(["train", OPUS_CONFIG, "--out", str(run),
                 *_sets(opus_overrides(str(base), _tsv(tmp_path)))]) == 0
    assert (run / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    before, after = load_model(base / "model.keras"), load_model(run / "model.keras")
    for a, b in zip(before.weights, after.weights, strict=True):
        if a.trainable and len(a.shape) == 2:  # every matrix trained on
            assert not np.array_equal(np.asarray(a), np.asarray(b)), a.path
        elif not a.trainable:  # the frozen sinusoid tables: the source's
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    config = load_config(run / "config.yaml")
    assert (config.model["d_model"], config.model["num_layers"], config.data.tokenizer) == \
        (16, 1, "char")
    assert any(name.startswith("epoch-0000-batch-") for name in
               os.listdir(run / "checkpoints"))
    capsys.readouterr()
    assert main(["translate", str(run), "--beam", "1", "zwei drei"]) == 0
    assert capsys.readouterr().out.strip()
    with pytest.raises(ConfigError, match="model.d_model: 32 conflicts"):
        train(load_config(OPUS_CONFIG, [*opus_overrides(str(base), _tsv(tmp_path)),
                                        "model.d_model=32"]), tmp_path / "conflict")


# -- SIGKILL and --resume -------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_then_resume_equals_an_uninterrupted_fine_tune(gpt2, tmp_path):
    """`transformerkit train` of the GPT-2 recipe SIGKILLed once a mid-epoch checkpoint of
    epoch 2 exists, then --resume: the final weights equal an uninterrupted run's (dropout
    on, accumulation on: the RNG and the position in the epoch are restored)."""
    overrides = gpt_overrides(str(gpt2 / "hf"), _text(tmp_path), **{
        "data.steps_per_epoch": 16, "train.checkpoint_every": 1, "model.dropout": 0.1,
        "train.checkpoints_to_keep": 3, "train.samples": 0})
    config = load_config(GPT_CONFIG, overrides)
    # step 10 is inside epoch 2 (8 updates an epoch)
    assert_killed_run_resumes_exactly(config, tmp_path, kill_after_step=10)


@pytest.mark.slow
def test_torchrun_fine_tune_equals_one_process(tmp_path):
    """2 PyTorch processes (gloo) fine-tuning a run directory end with the weights of one
    process accumulating 2 batches, exactly (tests/training/test_multiprocess.py explains
    why): every rank starts from the checkpoint and reads the tokenizer rank 0 wrote."""
    import socket

    base = tmp_path / "base"
    train(tiny_config(tmp_path, epochs=1), base)
    overrides = opus_overrides(str(base), _tsv(tmp_path), **{
        "data.batch_size": 4, "model.dropout": 0.0, "train.bleu_every": "null",
        "train.early_stopping_metric": "val_loss",
        "train.patience": "null", "train.samples": 0, "train.checkpoint_every": "null",
        "train.epochs": 2, "train.process_timeout": "60s"})
    config = load_config(OPUS_CONFIG, overrides)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KERAS_BACKEND": "torch"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                          "2", "--master_addr", "127.0.0.1", "--master_port", str(port), "-m",
                          "transformerkit", "train", str(path), "--out", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=240)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "transformerkit", "train", str(path), "--out",
                          str(tmp_path / "one"), "--set", "train.accumulate_steps=2"],
                         env=env, capture_output=True, text=True, timeout=240)
    assert one.returncode == 0, one.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "metrics.json").read_text())["processes"] == 2
    assert (tmp_path / "two" / "tokenizer.json").read_bytes() == \
        (base / "tokenizer.json").read_bytes()
    for a, b in zip(_weights(tmp_path / "two" / "model.keras"),
                    _weights(tmp_path / "one" / "model.keras"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_opus_mt_recipe_fine_tunes_a_marian_folder(tmp_path, capsys):
    """configs/finetune_opus_mt.yaml from a tiny Marian folder (tests/support/marian_runs.py) on
    Multi30k pairs as TSV: its architecture and both vocabulary sides (as `import` writes
    them), the weights move, translate works with Keras and CTranslate2."""
    from marian_runs import marian_folder, multi30k_lines

    folder = marian_folder(tmp_path / "marian")
    assert main(["import", str(folder), "--out", str(tmp_path / "imported")]) == 0
    pairs = zip(multi30k_lines("de", 1000, 40), multi30k_lines("en", 1000, 40), strict=True)
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{de}\t{en}\n" for de, en in pairs), encoding="utf-8")
    run = tmp_path / "finetuned"
    assert main(["train", OPUS_CONFIG, "--out", str(run), *_sets(opus_overrides(
        str(folder), str(tsv), **{"data.tokens_per_batch": 400, "train.max_steps": 3}))]) == 0
    for name in ("source_tokenizer.json", "target_tokenizer.json"):
        assert (run / name).read_bytes() == (tmp_path / "imported" / name).read_bytes()
    imported = load_config(tmp_path / "imported" / "config.yaml")
    config = load_config(run / "config.yaml")
    assert {k: v for k, v in config.model.items() if k not in ("pretrained", "dropout")} == \
        {k: v for k, v in imported.model.items() if k not in ("pretrained", "dropout")}
    assert config.data.tokenizer == "marian"
    before, after = load_model(tmp_path / "imported" / "model.keras"), \
        load_model(run / "model.keras")
    for a, b in zip(before.weights, after.weights, strict=True):
        if a.trainable and len(a.shape) == 2:
            assert not np.array_equal(np.asarray(a), np.asarray(b)), a.path
    texts = multi30k_lines("de", 2000, 4)
    capsys.readouterr()
    assert main(["translate", str(run), "--beam", "1", *texts]) == 0
    keras_out = capsys.readouterr().out.splitlines()
    assert len(keras_out) == 4
    pytest.importorskip("ctranslate2")
    assert main(["export", str(run), "--format", "ctranslate2", "--quantization", "float32",
                 "--out", str(tmp_path / "ct2")]) == 0
    loaded = transformerkit.load(run)
    ct2_out = loaded.translate(texts, engine="ctranslate2", beam_size=1)
    assert_same_texts_or_near_tie(loaded, texts, keras_out, ct2_out)


def test_resume_with_the_original_config_is_exact(tmp_path):
    """A translation fine-tune stopped by max_steps inside epoch 2, then resumed with the
    config as written (data.max_length unset: the checkpoint's model.max_length, 40, drops
    the longer pairs; the written config's default model.max_length, 256, would keep them):
    the weights of an uninterrupted run, bit for bit, dropout on."""
    base = tmp_path / "base"
    train(tiny_config(tmp_path, epochs=1), base)
    tsv = _tsv(tmp_path)
    with open(tsv, "a", encoding="utf-8") as f:  # 4 pairs of 50+ characters
        f.write("".join(" ".join(GERMAN) + f"\t{' '.join(ENGLISH)}\n" for _ in range(4)))
    keys = {"data.max_length": "null", "train.epochs": 2, "train.bleu_every": "null",
            "train.early_stopping_metric": "val_loss", "train.patience": "null",
            "train.samples": 0, "train.checkpoint_every": 1, "data.batch_size": 4,
            "train.cooldown": 0}  # max_steps stands for an interruption: no cooldown to it
    config = load_config(OPUS_CONFIG, opus_overrides(str(base), tsv, **keys))
    assert config.data.max_length is None and config.model["max_length"] == 256
    straight = train(config, tmp_path / "straight")
    assert straight["dropped_train_pairs"] == 4 and straight["steps"] == 20
    stopped = load_config(OPUS_CONFIG, opus_overrides(str(base), tsv, **keys,
                                                      **{"train.max_steps": 13}))
    assert train(stopped, tmp_path / "stopped")["steps"] == 13
    os.remove(tmp_path / "stopped" / "model.keras")
    assert train(config, tmp_path / "stopped", resume=True)["steps"] == 20
    for a, b in zip(_weights(tmp_path / "straight" / "model.keras"),
                    _weights(tmp_path / "stopped" / "model.keras"), strict=True):
        np.testing.assert_array_equal(a, b)  # exact: the same steps, resumed
