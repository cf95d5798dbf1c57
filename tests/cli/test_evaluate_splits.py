"""``evaluate --split``: any split a run's config names (val, test), Multi30k's test2016,
and clear errors for a split the run has no data for.

Tolerances (``tests/support/tolerances.py``): ``translate --scores`` prints a sum of log-softmax
values to 4 decimals from its own batch (another shape than the check's): half the last
printed digit plus, per token, two float32 paths' bounds of the logits (twice: the
log-softmax's) and of the log-softmax.
"""

import json

import pytest
import tolerances as tol
import yaml
from tiny_run import ENGLISH, GERMAN, tiny_config

from transformerkit.cli import main
from transformerkit.training.trainer import train

PRINTED = 0.5e-4  # translate --scores prints 4 decimals


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("splits")
    config = tiny_config(folder, epochs=1, max_steps=2)
    test_source, test_target = folder / "test.de", folder / "test.en"
    test_source.write_text(" ".join(GERMAN[:3]) + "\n" + " ".join(GERMAN[3:5]) + "\n"
                           + GERMAN[6] + "\n")
    test_target.write_text(" ".join(ENGLISH[:3]) + "\n" + " ".join(ENGLISH[3:5]) + "\n"
                           + ENGLISH[6] + "\n")
    config = config.replace(data={"test_source": str(test_source),
                                  "test_target": str(test_target)})
    out = folder / "run"
    train(config, str(out))
    return out


def test_evaluate_split_test_scores_the_configs_test_data(run_dir, capsys):
    assert main(["evaluate", str(run_dir), "--split", "test", "--beam", "1"]) == 0
    scores = json.loads((run_dir / "metrics.json").read_text())["evaluate"]["test"]
    assert scores["sentences"] == 3 and 0.0 <= scores["chrf"] <= 100.0
    assert "BLEU" in capsys.readouterr().out


def test_a_split_the_run_has_no_data_for_is_a_clear_error(run_dir, capsys):
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["data"]["test_source"] = config["data"]["test_target"] = None
    other = run_dir.parent / "no-test"  # the same run with no test data in its config
    other.mkdir(exist_ok=True)
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    for name in ("model.keras", "tokenizer.json"):
        if (run_dir / name).exists():
            (other / name).write_bytes((run_dir / name).read_bytes())
    assert main(["evaluate", str(other), "--split", "test"]) == 2
    assert "names no test data (data.test_source/test_target" in capsys.readouterr().err
    assert main(["evaluate", str(run_dir), "--split", "test2016"]) == 2
    assert "--split test2016 is Multi30k's" in capsys.readouterr().err


def test_translate_scores_prints_each_translations_log_probability(run_dir, capsys):
    """``translate --scores``: LOGPROB<TAB>TEXT, the log-probability being the float64 sum
    of log p over the printed translation's tokens and its end token."""
    import keras
    import numpy as np

    import transformerkit

    texts = [" ".join(GERMAN[:3]), GERMAN[7]]
    assert main(["translate", str(run_dir), "--scores", "--beam", "1", *texts]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    run = transformerkit.load(str(run_dir))
    assert [text for _, text in lines] == run.translate(texts, beam_size=1)
    for source, (printed, text) in zip(texts, lines, strict=True):
        src = np.array([run.source_tokenizer.encode(source, add_eos=True)])
        target = run.target_tokenizer.encode(text) + [2]  # and </s>
        decoder_input = np.array([[1] + target[:-1]])
        probs = keras.ops.convert_to_numpy(
            run.model((src, decoder_input), return_logits=False)).astype("float64")
        expected = np.log(probs[0, np.arange(len(target)), target]).sum()
        logits = keras.ops.convert_to_numpy(run.model((src, decoder_input))).astype("float64")
        size = max(np.abs(logits).max(), np.abs(np.log(probs)).max())
        roundings = (2 * tol.model_roundings(run.model, src.shape[1], len(target))
                     + tol.cross_entropy_roundings(probs.shape[-1], len(target)))
        atol = PRINTED + len(target) * tol.chain_atol(roundings, size, paths=2)
        tol.assert_within(float(printed), expected, atol)
    assert main(["translate", str(run_dir), "--scores", "--n-best", "2", texts[0]]) == 2


# -- where evaluate reads a run's data ----------------------------------------------------------

def _multi30k_folder(folder, sentences):
    """A data directory in Multi30k's layout (``multi30k/{train,val,test2016}.{de,en}``) of
    number words: ``sentences`` validation pairs, so each folder is told by its count."""
    from tiny_run import write_corpus

    corpus = folder / "multi30k"
    corpus.mkdir(parents=True)
    source, target = write_corpus(corpus, pairs=24)
    for split in ("val", "test2016"):
        (corpus / f"{split}.de").write_text("\n".join(GERMAN[:sentences]) + "\n")
        (corpus / f"{split}.en").write_text("\n".join(ENGLISH[:sentences]) + "\n")
    return folder


@pytest.fixture(scope="module")
def local_multi30k_run(tmp_path_factory):
    """A run of ``data.dataset: multi30k`` trained from a local data directory named by
    ``$TRANSFORMERKIT_DATA`` (its validation split: 3 pairs)."""
    folder = tmp_path_factory.mktemp("local-data")
    data = _multi30k_folder(folder / "data", 3)
    config = tiny_config(folder, epochs=1, max_steps=1).replace(
        data={"dataset": "multi30k", "train_source": None, "train_target": None})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRANSFORMERKIT_DATA", str(data))
        train(config, str(folder / "run"))
    return folder / "run", data


def _no_download(monkeypatch):
    from transformerkit.data import corpora

    def refuse(url, *args, **kwargs):
        raise AssertionError(f"tried to download {url}")

    monkeypatch.setattr(corpora, "download_verified", refuse)


def _evaluated(run_dir, *flags):
    assert main(["evaluate", str(run_dir), "--split", "val", "--beam", "1", *flags]) == 0
    return json.loads((run_dir / "metrics.json").read_text())["evaluate"]["val"]["sentences"]


def test_a_run_records_the_absolute_data_directory_it_read(local_multi30k_run):
    run_dir, data = local_multi30k_run
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["data"]["data_dir"] == str(data.resolve())


def test_evaluate_reads_the_runs_recorded_data_without_the_variable(local_multi30k_run,
                                                                    monkeypatch, capsys):
    run_dir, _ = local_multi30k_run
    monkeypatch.delenv("TRANSFORMERKIT_DATA", raising=False)
    _no_download(monkeypatch)
    assert _evaluated(run_dir) == 3
    assert "val: 3 sentences" in capsys.readouterr().out


def test_data_dir_flag_then_variable_then_the_recorded_directory(local_multi30k_run,
                                                                 monkeypatch, tmp_path):
    """``--data-dir`` > ``$TRANSFORMERKIT_DATA`` > the run's recorded directory."""
    from transformerkit.cli.common import evaluation_data_dir
    from transformerkit.config import load_config

    run_dir, recorded = local_multi30k_run
    _no_download(monkeypatch)
    by_variable = _multi30k_folder(tmp_path / "variable", 2)
    by_flag = _multi30k_folder(tmp_path / "flag", 1)
    monkeypatch.setenv("TRANSFORMERKIT_DATA", str(by_variable))
    assert _evaluated(run_dir) == 2
    assert _evaluated(run_dir, "--data-dir", str(by_flag)) == 1
    data = load_config(str(run_dir / "config.yaml")).data
    assert evaluation_data_dir("x", data) == "x"
    assert evaluation_data_dir(None, data) == str(by_variable)
    monkeypatch.delenv("TRANSFORMERKIT_DATA")
    assert evaluation_data_dir(None, data) == str(recorded.resolve())
    old = data.replace(data_dir=None)  # a run trained before runs recorded their data
    assert evaluation_data_dir(None, old) is None


def test_corpus_files_named_relative_to_where_train_ran_are_found_from_anywhere(
        tmp_path, monkeypatch, capsys):
    """A run trained with ``data.train_source: train.de`` (relative to the directory
    ``train`` ran in) records the files' absolute paths, so ``evaluate --split test`` works
    from another directory; a name that exists nowhere is kept as given (its error names it
    when the corpus is read)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    config = tiny_config(corpus, epochs=1, max_steps=1)
    (corpus / "test.de").write_text(" ".join(GERMAN[:2]) + "\n" + GERMAN[4] + "\n")
    (corpus / "test.en").write_text(" ".join(ENGLISH[:2]) + "\n" + ENGLISH[4] + "\n")
    config = config.replace(data={"train_source": "train.de", "train_target": "train.en",
                                  "test_source": "test.de", "test_target": "test.en",
                                  "val_source": "nowhere.de"})
    monkeypatch.chdir(corpus)
    recorded = config.with_data_dir_recorded().data
    assert recorded.train_source == str(corpus / "train.de")
    assert recorded.test_target == str(corpus / "test.en")
    assert recorded.val_source == "nowhere.de"  # not a file here: as given
    train(config.replace(data={"val_source": None}), str(tmp_path / "run"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["data"]["test_source"] == str(corpus / "test.de")
    assert main(["evaluate", str(tmp_path / "run"), "--split", "test", "--beam", "1"]) == 0
    scores = json.loads((tmp_path / "run" / "metrics.json").read_text())["evaluate"]["test"]
    assert scores["sentences"] == 2
    capsys.readouterr()


def test_files_entries_are_recorded_with_absolute_paths(tmp_path, monkeypatch):
    from transformerkit.config import resolve

    (tmp_path / "a.tsv").write_text("x\ty\n")
    (tmp_path / "b.de").write_text("x\n")
    (tmp_path / "b.en").write_text("y\n")
    monkeypatch.chdir(tmp_path)
    config = resolve({"data": {"dataset": "files", "train_files": [
        "a.tsv", {"source": "b.de", "target": "b.en", "format": "text"}, "missing.tsv"]}})
    entries = config.with_data_dir_recorded().data.train_files
    assert entries == [str(tmp_path / "a.tsv"), {"source": str(tmp_path / "b.de"),
                       "target": str(tmp_path / "b.en"), "format": "text"}, "missing.tsv"]
