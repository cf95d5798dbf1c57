"""``data.tokenizer`` naming an earlier run's directory or a tokenizer file: runs share one
vocabulary (the same ids), also on new data."""

import filecmp

import pytest
from tiny_run import GERMAN, tiny_config
from vectors_files import write_vectors

from transformerkit.config import resolve
from transformerkit.data.tokenizers import load_tokenizer
from transformerkit.training.data_setup import prepare_data, reused_tokenizer_files
from transformerkit.training.trainer import train


def reuse_config(folder, tokenizer, **sections):
    """The tiny config with ``data.tokenizer`` set; ``sections`` update model/data keys."""
    config = tiny_config(folder)
    raw = {"model": {k: v for k, v in config.model.items() if v is not None},
           "data": {**{k: v for k, v in config.data.to_dict().items() if v is not None},
                    "tokenizer": tokenizer, "cache_dir": str(folder / "cache")},
           "train": {"epochs": 1, "verbose": 0, "samples": 0}}
    for section, keys in sections.items():
        raw[section].update(keys)
    return resolve(raw)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("first")
    config = tiny_config(folder, epochs=1)
    train(config, folder / "run")
    return folder / "run"


def test_second_run_reuses_the_run_directory_vocabulary(first_run, tmp_path):
    """Trained further on new text (new characters too), the ids stay the first run's."""
    (tmp_path / "new.de").write_text("zehn neun acht Xylophon\n" * 4)
    (tmp_path / "new.en").write_text("ten nine eight xylophone\n" * 4)
    config = reuse_config(tmp_path, str(first_run), data={
        "train_source": str(tmp_path / "new.de"), "train_target": str(tmp_path / "new.en")})
    train(config, tmp_path / "second")
    assert filecmp.cmp(first_run / "tokenizer.json", tmp_path / "second" / "tokenizer.json",
                       shallow=False)
    first = load_tokenizer(first_run / "tokenizer.json")
    second = load_tokenizer(tmp_path / "second" / "tokenizer.json")
    assert second.encode("zehn Xylophon") == first.encode("zehn Xylophon")
    assert first.unk_id in second.encode("X")  # not in the first run's characters


def test_a_tokenizer_file_or_a_source_target_pair(first_run, tmp_path):
    data = prepare_data(reuse_config(tmp_path, str(first_run / "tokenizer.json")),
                        tmp_path / "from_file")
    assert data.source_tokenizer.vocab_size == load_tokenizer(first_run /
                                                              "tokenizer.json").vocab_size
    pair = prepare_data(reuse_config(tmp_path, "char", data={"shared_vocab": False}),
                        tmp_path / "pair")
    (tmp_path / "pair" / "config.yaml").write_text("{}\n")  # what makes it a run directory
    assert reused_tokenizer_files(str(tmp_path / "pair")) == [
        str(tmp_path / "pair" / "source_tokenizer.json"),
        str(tmp_path / "pair" / "target_tokenizer.json")]
    again = prepare_data(reuse_config(tmp_path, str(tmp_path / "pair")), tmp_path / "again")
    assert not (tmp_path / "again" / "tokenizer.json").exists()
    assert again.target_tokenizer.encode("eight") == pair.target_tokenizer.encode("eight")
    assert again.source_tokenizer.vocab_size == pair.source_tokenizer.vocab_size


def test_clear_errors(first_run, tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a kind .* nor an existing path"):
        prepare_data(reuse_config(tmp_path, str(tmp_path / "nowhere")), tmp_path / "a")
    empty = tmp_path / "empty_run"
    empty.mkdir()
    (empty / "config.yaml").write_text("{}\n")
    with pytest.raises(FileNotFoundError, match="has no tokenizer files"):
        prepare_data(reuse_config(tmp_path, str(empty)), tmp_path / "b")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not valid json"):
        prepare_data(reuse_config(tmp_path, str(broken)), tmp_path / "c")
    pair = tmp_path / "pair"
    prepare_data(reuse_config(tmp_path, "char", data={"shared_vocab": False}), pair)
    (pair / "config.yaml").write_text("{}\n")
    with pytest.raises(ValueError, match="tie_embeddings: all needs one vocabulary"):
        prepare_data(reuse_config(tmp_path, str(pair), model={"tie_embeddings": "all"}),
                     tmp_path / "d")
    write_vectors(tmp_path / "de.vec", GERMAN, dim=16)
    with pytest.raises(ValueError, match="use one"):
        prepare_data(reuse_config(tmp_path, str(first_run), model={
            "embeddings": {"shared": str(tmp_path / "de.vec")}}), tmp_path / "e")


def test_a_vocabulary_that_does_not_fit_the_model(first_run, tmp_path):
    """A reused vocabulary whose size differs from a .npy matrix's rows is refused."""
    import numpy as np

    vocab = load_tokenizer(first_run / "tokenizer.json").vocab_size
    np.save(tmp_path / "m.npy", np.zeros((vocab + 1, 16), dtype="float32"))
    config = reuse_config(tmp_path, str(first_run), model={
        "pretrained_embeddings": str(tmp_path / "m.npy")})
    with pytest.raises(ValueError, match=f"has {vocab + 1} rows but the source vocabulary "
                                         f"has {vocab} tokens"):
        train(config, tmp_path / "run")
