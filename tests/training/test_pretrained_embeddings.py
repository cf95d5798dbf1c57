"""Pretrained vectors end to end: ``model.embeddings`` builds the tokenizers from the files,
fills the embedders, freezes or trains each part on its own; a run trains, saves, loads and
translates."""

import pathlib

import keras
import numpy as np
import pytest
from tiny_run import ENGLISH, GERMAN, write_corpus
from vectors_files import write_vectors

import transformerkit
from transformerkit.config import ConfigError, resolve
from transformerkit.data.tokenizers import load_tokenizer
from transformerkit.models import GPT, Transformer
from transformerkit.models.factory import build_model
from transformerkit.saving import load_model
from transformerkit.training.data_setup import prepare_data
from transformerkit.training.trainer import train

SMALL = dict(num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8)


def weights(variable):
    return keras.ops.convert_to_numpy(variable)


def test_nan_rows_keep_the_initializer_and_the_rest_is_the_matrix():
    matrix = np.random.default_rng(0).normal(size=(20, 8)).astype("float32")
    matrix[:4] = np.nan
    model = Transformer(20, 20, source_embeddings=matrix, **SMALL)
    model.build(None)
    table = weights(model.source_embedding.embeddings)
    np.testing.assert_array_equal(table[4:], matrix[4:])  # exact: the values, copied
    # not rounding: the std of 32 draws of N(0, 8^-0.5 = 0.35) lies far inside (0.1, 1.0)
    assert np.isfinite(table[:4]).all() and 0.1 < table[:4].std() < 1.0
    partly = matrix.copy()
    partly[5, 0] = np.nan
    with pytest.raises(ValueError, match="partly NaN"):
        Transformer(20, 20, source_embeddings=partly, **SMALL)


def test_each_part_frozen_on_its_own():
    model = Transformer(20, 16, source_embeddings_trainable=False, projection_trainable=False,
                        **SMALL)
    assert (model.source_embedding.trainable, model.target_embedding.trainable,
            model.output_projection.trainable) == (False, True, False)
    model = Transformer(20, 16, embeddings_trainable=False, target_embeddings_trainable=True,
                        **SMALL)
    assert (model.source_embedding.trainable, model.target_embedding.trainable,
            model.output_projection.trainable) == (False, True, True)
    # tied: the projection is the target embedding and follows it
    model = Transformer(20, 16, tie_embeddings="decoder", target_embeddings_trainable=False,
                        **SMALL)
    assert model.output_projection is None and not model.target_embedding.trainable
    with pytest.raises(ValueError, match="cannot differ"):
        Transformer(20, 16, tie_embeddings="decoder", projection_trainable=False, **SMALL)
    with pytest.raises(ValueError, match="must agree"):
        Transformer(20, 20, tie_embeddings="all", source_embeddings_trainable=False, **SMALL)
    assert not GPT(20, projection_trainable=False, **SMALL).output_projection.trainable
    with pytest.raises(ValueError, match="cannot differ"):
        GPT(20, tie_embeddings="all", projection_trainable=False, **SMALL)


def test_factory_refuses_a_width_other_than_d_model():
    config = resolve({"model": SMALL}).model
    with pytest.raises(ValueError, match=r"width 6 but model.d_model is 8: set model.d_model: 6"):
        build_model(config, 20, 20, embeddings={"source": np.zeros((20, 6))})
    with pytest.raises(ValueError, match="has 19 rows but the target vocabulary has 20"):
        build_model(config, 20, 20, embeddings={"target": np.zeros((19, 8))})


def test_config_checks_model_embeddings():
    with pytest.raises(ConfigError, match="model.embeddings: unknown key"):
        resolve({"model": {"embeddings": {"decoder": "a.vec"}}})
    with pytest.raises(ConfigError, match="not both"):
        resolve({"model": {"embeddings": {"shared": "a.vec"}, "pretrained_embeddings": "a.npy"}})
    with pytest.raises(ConfigError, match="must be a mapping"):
        resolve({"model": {"embeddings": "a.vec"}})


def vectors_config(folder, embeddings, **model):
    """The tiny German -> English config of ``tiny_run`` with ``model.embeddings``."""
    source, target = write_corpus(folder)
    return resolve({
        "model": {"num_layers": 1, "d_model": 16, "num_heads": 2, "d_ff": 32, "dropout": 0.0,
                  "max_length": 40, "embeddings": embeddings, **model},
        "data": {"dataset": "parallel", "train_source": source, "train_target": target,
                 "batch_size": 4, "cache_dir": str(folder / "cache")},
        "train": {"epochs": 2, "learning_rate": 0.01, "verbose": 0, "samples": 0,
                  "checkpoints_to_keep": 3}})


@pytest.fixture(scope="module")
def vectors_run(tmp_path_factory):
    """German word vectors (frozen, 8 of the 10 words), English ones (trainable), a frozen
    output projection; trained 2 epochs."""
    folder = tmp_path_factory.mktemp("vectors")
    german = write_vectors(folder / "de.vec", GERMAN[:8], dim=16, seed=1)
    english = write_vectors(folder / "en.txt", ENGLISH, dim=16, header=False, seed=2)
    config = vectors_config(folder, {"source": str(folder / "de.vec"),
                                     "target": {"file": str(folder / "en.txt")}},
                            source_embeddings_trainable=False, projection_trainable=False)
    train(config, folder / "run")
    return folder / "run", german, english


def test_run_vocabularies_are_the_files(vectors_run):
    run, german, english = vectors_run
    source = load_tokenizer(run / "source_tokenizer.json")
    target = load_tokenizer(run / "target_tokenizer.json")
    assert [source.id_to_token(i) for i in range(4, source.vocab_size)] == list(german)
    assert [target.id_to_token(i) for i in range(4, target.vocab_size)] == list(english)
    assert source.encode("ein neun") == [4, 3]  # "neun" has no vector: <unk>


def test_frozen_parts_keep_their_values_trainable_ones_change(vectors_run):
    run, german, english = vectors_run
    first = load_model(run / "checkpoints" / "epoch-0001.keras", compile=False)
    final = transformerkit.load(run).model
    source = weights(final.source_embedding.embeddings)
    # exact: frozen weights keep the file's values, saved and reloaded
    np.testing.assert_array_equal(source[4:], np.stack(list(german.values())))
    np.testing.assert_array_equal(weights(final.output_projection.kernel),
                                  weights(first.output_projection.kernel))
    target = weights(final.target_embedding.embeddings)
    start = np.stack(list(english.values()))
    # not rounding: trained from the file's values by Adam steps of about the learning rate,
    # so moved (by more than 1e-5 relative: np.allclose) but by far less than 1
    assert not np.allclose(target[4:], start)
    assert np.abs(target[4:] - start).max() < 1.0
    assert not np.allclose(target, weights(first.target_embedding.embeddings))


def test_run_loads_and_translates(vectors_run):
    run, _, english = vectors_run
    loaded = transformerkit.load(run)
    out = loaded.translate(["ein zwei drei", "vier"], beam_size=1)
    assert len(out) == 2 and all(isinstance(t, str) for t in out)
    assert set(" ".join(out).split()) <= {*english, "<unk>"}


def test_shared_pieces_vocabulary_with_tied_embeddings(tmp_path):
    pieces = ["<unk>", "<s>", "</s>", "▁", *[f"▁{w}" for w in GERMAN + ENGLISH],
              *sorted(set("".join(GERMAN + ENGLISH)))]
    table = write_vectors(tmp_path / "bpemb.txt", pieces, dim=16, header=False)
    config = vectors_config(tmp_path, {"shared": str(tmp_path / "bpemb.txt")},
                            tie_embeddings="all")
    data = prepare_data(config, tmp_path / "run")
    assert (tmp_path / "run" / "tokenizer.json").is_file()
    tokenizer = data.source_tokenizer
    assert tokenizer.vocab_size == 1 + len(pieces)
    matrix = data.embeddings["source"]
    for i in range(1, tokenizer.vocab_size):  # exact: the file's values, copied
        np.testing.assert_array_equal(matrix[i], table[tokenizer.id_to_token(i)])
    assert tokenizer.tokenize("ein one") == ["▁ein", "▁one"]
    model = build_model(config.model, tokenizer.vocab_size, tokenizer.vocab_size,
                        embeddings=data.embeddings)
    model.build(None)
    np.testing.assert_array_equal(weights(model.target_embedding.embeddings)[1:],
                                  matrix[1:])  # exact: copied


def test_width_mismatch_is_refused_before_training(tmp_path):
    write_vectors(tmp_path / "de.vec", GERMAN, dim=12)
    config = vectors_config(tmp_path, {"source": str(tmp_path / "de.vec")})
    with pytest.raises(ValueError, match="width 12 but model.d_model is 16"):
        prepare_data(config, tmp_path / "run")


def test_side_vectors_with_tie_all_or_a_gpt_need_shared(tmp_path):
    write_vectors(tmp_path / "de.vec", GERMAN, dim=16)
    config = vectors_config(tmp_path, {"source": str(tmp_path / "de.vec")},
                            tie_embeddings="all")
    with pytest.raises(ValueError, match="model.embeddings.shared"):
        prepare_data(config, tmp_path / "run")
    text = pathlib.Path(tmp_path / "text.txt")
    text.write_text(" ".join(GERMAN) + "\n" * 3)
    config = resolve({"model": {"type": "gpt", "embeddings": {"source": str(tmp_path / "de.vec")}},
                      "data": {"dataset": "text", "text": str(text)}})
    with pytest.raises(ValueError, match="model.embeddings.shared"):
        prepare_data(config, tmp_path / "gpt")
