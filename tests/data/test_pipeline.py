"""Pipelines: length filter, bucketing and token budgets, determinism, teacher forcing, LM
blocks, the encode cache, and ``model.fit`` on all three backends."""

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest
from paths import SHARED_DATA

from transformerkit.data.pipeline import (
    EncodedPairs,
    EpochSync,
    LanguageModelBatches,
    TranslationBatches,
    encode_pairs,
    pad_batch,
    split_train_val,
    teacher_forcing,
)
from transformerkit.data.tokenizers import CharTokenizer

DATA = SHARED_DATA


def random_pairs(n=500, seed=0, max_len=40):
    """Pairs with unique ids: source row i starts with token 4 + i (so rows map back)."""
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for i in range(n):
        s, t = rng.integers(1, max_len, size=2)
        sources.append(np.array([4 + i, *rng.integers(4, 50, size=s - 1), 2], dtype="int32"))
        targets.append(np.array([1, *rng.integers(4, 50, size=t), 2], dtype="int32"))
    return EncodedPairs(sources, targets)


def batch_members(batch):
    """Pair ids (first source token - 4) of the rows of one batch."""
    (source, _), _ = batch
    return [int(row[0]) - 4 for row in source]


def epoch_batches(batches):
    """All batches of one epoch, with the calls Keras makes around them."""
    batches.on_epoch_begin()
    return [batches[i] for i in range(len(batches))]


def unpad(row):
    return row[:np.count_nonzero(row)]  # rows are right-padded and contain no inner 0


# ------------------------------------------------------------------------------ encoding
@pytest.fixture(scope="module")
def char_tok():
    return CharTokenizer.train(["abcdefghijklmnopqrstuvwxyz "])


def test_encode_pairs_places_specials_and_filters_only_long_pairs(char_tok):
    sources = ["abc", "a" * 9, "hello", "a" * 10, "", "xyz"]
    targets = ["de", "b", "b" * 8, "c", "f", "c" * 9]
    encoded = encode_pairs(sources, targets, char_tok, char_tok, max_length=10)
    # source + EOS <= 10 and BOS + target + EOS <= 10: drops "a"*10 (11) and "c"*9 (11).
    assert encoded.dropped == 2 and len(encoded) == 4
    kept = [0, 1, 2, 4]
    for row, i in enumerate(kept):
        assert encoded.source[row].tolist() == char_tok.encode(sources[i]) + [2]
        assert encoded.target[row].tolist() == [1] + char_tok.encode(targets[i]) + [2]
        assert encoded.source[row].dtype == np.int32
    assert max(len(s) for s in encoded.source) == 10  # the boundary length is kept


def test_encode_pairs_rejects_bad_input(char_tok):
    with pytest.raises(ValueError, match="3 sources but 2 targets"):
        encode_pairs(["a", "b", "c"], ["a", "b"], char_tok, char_tok, 10)
    with pytest.raises(ValueError, match="max_length"):
        encode_pairs(["a"], ["b"], char_tok, char_tok, 1)


def test_teacher_forcing_shift_is_exact():
    target = pad_batch([np.array([1, 7, 8, 9, 2]), np.array([1, 5, 2])])
    assert target.tolist() == [[1, 7, 8, 9, 2], [1, 5, 2, 0, 0]]
    decoder_input, labels = teacher_forcing(target)
    assert decoder_input.tolist() == [[1, 7, 8, 9], [1, 5, 2, 0]]
    assert labels.tolist() == [[7, 8, 9, 2], [5, 2, 0, 0]]
    assert decoder_input.dtype == labels.dtype == np.int32
    with pytest.raises(ValueError, match=r"\(3,\)"):
        teacher_forcing(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="t >= 2"):
        teacher_forcing(np.array([[1], [1]]))


# ----------------------------------------------------------------------------- batching
@pytest.mark.parametrize("options", [
    dict(tokens_per_batch=300),
    dict(tokens_per_batch=300, pad_to_multiple=8),
    dict(batch_size=16),
    dict(batch_size=16, bucket=False),
    dict(tokens_per_batch=500, shuffle=False),
])
def test_every_pair_appears_exactly_once_per_epoch_with_exact_content(options):
    encoded = random_pairs()
    batches = TranslationBatches(encoded, seed=3, **options)
    for _ in range(3):  # three epochs, each a full partition of the pairs
        seen = Counter()
        for (source, decoder_input), labels in epoch_batches(batches):
            assert source.dtype == decoder_input.dtype == labels.dtype == np.int32
            assert decoder_input.shape == labels.shape
            for row in range(len(source)):
                i = int(source[row, 0]) - 4
                seen[i] += 1
                assert unpad(source[row]).tolist() == encoded.source[i].tolist()
                # The padded target row is decoder_input[0] + labels; input = it minus last.
                full = np.concatenate([decoder_input[row, :1], labels[row]])
                assert unpad(full).tolist() == encoded.target[i].tolist()
                assert decoder_input[row].tolist() == full[:-1].tolist()
        assert seen == Counter(range(len(encoded)))
        batches.on_epoch_end()


def test_token_budget_counts_padded_size_and_buckets_similar_lengths():
    encoded = random_pairs(800)
    length = {i: max(len(encoded.source[i]), len(encoded.target[i])) for i in range(800)}
    for shuffle in (True, False):
        batches = TranslationBatches(encoded, tokens_per_batch=256, seed=1, shuffle=shuffle)
        sizes = []
        for batch in epoch_batches(batches):
            (source, decoder_input), _ = batch
            rows, longest = len(source), max(source.shape[1], decoder_input.shape[1] + 1)
            assert longest == max(length[i] for i in batch_members(batch))  # no extra padding
            assert rows * longest <= 256
            sizes.append((rows, longest, [length[i] for i in batch_members(batch)]))
        # In length order, each batch was filled until the next pair would break the budget.
        sizes.sort(key=lambda size: (min(size[2]), max(size[2]), -size[0]))
        for (rows, longest, _), (_, _, next_lengths) in zip(sizes[:-1], sizes[1:], strict=True):
            assert (rows + 1) * max(longest, min(next_lengths)) > 256
        all_lengths = [n for _, _, lengths in sizes for n in sorted(lengths)]
        assert all_lengths == sorted(all_lengths)  # no two batches overlap in length


def test_pad_to_multiple_pads_widths_and_respects_budget():
    batches = TranslationBatches(random_pairs(300), tokens_per_batch=512, pad_to_multiple=8)
    for (source, decoder_input), _ in epoch_batches(batches):
        assert source.shape[1] % 8 == 0 and decoder_input.shape[1] % 8 == 0
        assert len(source) * max(source.shape[1], decoder_input.shape[1] + 1) <= 512


def test_same_seed_same_batches_other_epoch_or_seed_other_order():
    def members(batches):
        return [batch_members(b) for b in epoch_batches(batches)]

    a = TranslationBatches(random_pairs(), tokens_per_batch=300, seed=5)
    b = TranslationBatches(random_pairs(), tokens_per_batch=300, seed=5)
    epoch0 = members(a)
    assert epoch0 == members(b)
    a.on_epoch_end()
    epoch1 = members(a)
    assert len(epoch1) == len(epoch0)  # the batch count never changes
    assert epoch1 != epoch0
    # Not only the order of batches: pairs of equal length change batch mates.
    assert {frozenset(m) for m in epoch1} != {frozenset(m) for m in epoch0}
    b.set_epoch(1)  # resume: epoch 1 is a pure function of (seed, 1)
    assert members(b) == epoch1
    assert members(TranslationBatches(random_pairs(), tokens_per_batch=300, seed=6)) != epoch0


def test_no_shuffle_is_sorted_and_identical_every_epoch():
    encoded = random_pairs()
    batches = TranslationBatches(encoded, batch_size=32, shuffle=False)
    first = [batch_members(b) for b in epoch_batches(batches)]
    order = [i for m in first[2:] for i in m]  # (two batches are moved first, see below)
    lengths = [max(len(encoded.source[i]), len(encoded.target[i])) for i in order]
    assert lengths == sorted(lengths)
    batches.on_epoch_end()
    assert [batch_members(b) for b in epoch_batches(batches)] == first


@pytest.mark.parametrize("options", [dict(tokens_per_batch=300), dict(batch_size=16),
                                     dict(tokens_per_batch=300, shuffle=False),
                                     dict(batch_size=16, shuffle=False, bucket=False)])
def test_first_two_batches_differ_in_every_varying_dimension(options):
    # Keras' TensorFlow backend infers the tf.data signature from batches 0 and 1.
    batches = TranslationBatches(random_pairs(500), seed=0, **options)
    for _ in range(3):
        shapes = np.array([(len(s), s.shape[1], d.shape[1]) for (s, d), _ in
                           epoch_batches(batches)])
        varying = (shapes != shapes[0]).any(axis=0)
        assert varying[1:].all()  # the widths vary between batches
        assert ((shapes[0] != shapes[1]) | ~varying).all(), shapes[:2]
        batches.on_epoch_end()


def test_epoch_advances_only_after_a_full_pass_and_epoch_sync_sets_it():
    def members(batches):
        return [batch_members(b) for b in epoch_batches(batches)]

    batches = TranslationBatches(random_pairs(50), batch_size=8)
    epoch0 = members(TranslationBatches(random_pairs(50), batch_size=8))
    [batches[i] for i in range(len(batches))]  # outside on_epoch_begin/end: not counted
    batches.on_epoch_end()  # like the extra on_epoch_end of fit's reset()
    assert batches.epoch == 0
    batches.on_epoch_begin()
    batches[0]  # torch/jax fetch one batch to build the model
    batches.on_epoch_end()
    assert batches.epoch == 0 and members(batches) == epoch0
    batches.on_epoch_end()
    assert batches.epoch == 1 and members(batches) != epoch0
    EpochSync(batches).on_epoch_begin(0)
    assert batches.epoch == 0 and members(batches) == epoch0


@pytest.mark.parametrize("kwargs, message", [
    (dict(), "exactly one"),
    (dict(tokens_per_batch=100, batch_size=4), "exactly one"),
    (dict(tokens_per_batch=20), "smaller than the longest example"),
    (dict(tokens_per_batch=0), "tokens_per_batch must be a positive int, got 0"),
    (dict(batch_size=-1), "batch_size must be a positive int, got -1"),
    (dict(tokens_per_batch=500, bucket=False), "needs bucket=True"),
    (dict(batch_size=4, seed=-1), "seed"),
])
def test_translation_batches_reject_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TranslationBatches(random_pairs(20), **kwargs)


def test_translation_batches_reject_empty_corpus_and_bad_index():
    with pytest.raises(ValueError, match="no pairs"):
        TranslationBatches(EncodedPairs([], []), batch_size=4)
    batches = TranslationBatches(random_pairs(20), batch_size=8)
    with pytest.raises(IndexError):
        batches[len(batches)]


# ------------------------------------------------------------------------ language model
def test_language_model_batches_are_shifted_contiguous_blocks():
    tokens = np.arange(1000, dtype="int32")
    batches = LanguageModelBatches(tokens, block_size=16, batch_size=4, steps_per_epoch=5,
                                   seed=2)
    assert len(batches) == 5
    x, y = batches[0]
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int32
    np.testing.assert_array_equal(y, x + 1)  # y is x shifted by one token
    np.testing.assert_array_equal(np.diff(x, axis=1), 1)  # contiguous windows
    assert x.min() >= 0 and y.max() <= 999
    again = LanguageModelBatches(tokens, 16, 4, 5, seed=2)
    np.testing.assert_array_equal(again[3][0], batches[3][0])
    batches.on_epoch_end()
    assert batches.epoch == 0  # not every batch was served during an epoch
    epoch_batches(batches)
    batches.on_epoch_end()
    assert batches.epoch == 1 and not np.array_equal(batches[0][0], x)
    again.set_epoch(1)
    np.testing.assert_array_equal(again[0][0], batches[0][0])
    assert not np.array_equal(LanguageModelBatches(tokens, 16, 4, 5, seed=3)[0][0], x)


def test_language_model_batches_cover_the_end_of_the_stream():
    tokens = np.arange(10, dtype="int32")
    x, y = LanguageModelBatches(tokens, block_size=9, batch_size=3, steps_per_epoch=1)[0]
    assert x.tolist() == [list(range(9))] * 3 and y.tolist() == [list(range(1, 10))] * 3
    with pytest.raises(ValueError, match="at least block_size \\+ 1 = 11"):
        LanguageModelBatches(tokens, block_size=10, batch_size=1, steps_per_epoch=1)
    with pytest.raises(ValueError, match="1-D"):
        LanguageModelBatches(tokens.reshape(2, 5), 2, 1, 1)


def test_split_train_val_matches_nanogpt_shakespeare():
    train, val = split_train_val(np.arange(1115394))
    assert (len(train), len(val)) == (1003854, 111540)
    assert train[-1] + 1 == val[0]
    with pytest.raises(ValueError, match="val_fraction"):
        split_train_val(np.arange(10), 1.0)


# ----------------------------------------------------------------- model.fit per backend
FIT_SCRIPT = textwrap.dedent("""
    import json, sys
    import keras
    from transformerkit.data import (SubwordTokenizer, TranslationBatches, encode_pairs,
                                     load_multi30k)
    from transformerkit.models import Transformer
    from transformerkit.training import MaskedCrossEntropy, attach_train_step

    state, served = {"keras_epoch": None}, []

    class Logged(TranslationBatches):
        def __getitem__(self, i):
            served.append((state["keras_epoch"], self.epoch, i))
            return super().__getitem__(i)

    class Recorder(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            state["keras_epoch"] = epoch

    sources, targets = load_multi30k("train", "de", "en")
    sources, targets = sources[:200], targets[:200]
    source_tok = SubwordTokenizer.train(sources, vocab_size=1000)
    target_tok = SubwordTokenizer.train(targets, vocab_size=1000)
    encoded = encode_pairs(sources, targets, source_tok, target_tok, max_length=64)
    batches = Logged(encoded, pad_to_multiple=16, **json.loads(sys.argv[1]))
    shapes = sorted({tuple(x.shape) for i in range(len(batches)) for x in batches[i][0]})
    model = Transformer(source_tok.vocab_size, target_tok.vocab_size, num_layers=1,
                        d_model=16, num_heads=2, d_ff=32, max_length=64)
    model.compile(optimizer="adam", loss=MaskedCrossEntropy())
    attach_train_step(model)
    history = model.fit(batches, epochs=2, shuffle=False, verbose=0,
                        callbacks=[Recorder()])  # no EpochSync: plain fit lines up
    print("RESULT" + json.dumps({
        "backend": keras.backend.backend(), "loss": history.history["loss"],
        "pairs": len(encoded), "dropped": encoded.dropped, "batches": len(batches),
        "shapes": shapes, "served": [s for s in served if s[0] is not None]}))
""")


# Per backend: TensorFlow needs >= 3 batches to check the tf.data signature fix; JAX compiles
# once per batch shape (~10 s each here), so it gets 2 batches (of different shapes).
FIT_BATCHING = {"torch": {"tokens_per_batch": 3200}, "tensorflow": {"tokens_per_batch": 3200},
                "jax": {"batch_size": 128}}


def test_translation_batches_feed_model_fit_on_every_backend(tmp_path):
    """A tiny Transformer trains 2 epochs on 200 Multi30k pairs under each backend (three
    subprocesses run side by side); Keras epoch e consumes exactly the dataset's epoch e."""
    if not (DATA / "multi30k" / "train.de").is_file():
        pytest.skip(f"shared data not found at {DATA}")
    script = tmp_path / "fit.py"
    script.write_text(FIT_SCRIPT)
    processes = {}
    for backend, batching in FIT_BATCHING.items():
        env = dict(os.environ, KERAS_BACKEND=backend, TRANSFORMERKIT_DATA=str(DATA),
                   OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore",
                   XLA_FLAGS="--xla_backend_optimization_level=0 "
                             "--xla_llvm_disable_expensive_passes=true")
        processes[backend] = subprocess.Popen(
            [sys.executable, str(script), json.dumps(batching)], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    outputs = {backend: process.communicate(timeout=300)
               for backend, process in processes.items()}
    for backend, (stdout, stderr) in outputs.items():
        assert processes[backend].returncode == 0, f"{backend}:\n{stdout[-2000:]}{stderr[-4000:]}"
        result = json.loads(stdout.split("RESULT", 1)[1])
        assert result["backend"] == backend
        assert result["pairs"] + result["dropped"] == 200 and result["pairs"] > 150
        assert result["batches"] == (2 if backend == "jax" else 3), result
        assert len(set(map(tuple, result["shapes"]))) > 2  # shapes vary between batches
        assert len(result["loss"]) == 2 and all(0 < loss < 20 for loss in result["loss"])
        for epoch in (0, 1):  # each Keras epoch = the dataset's epoch, every batch once
            served = [(e, i) for k, e, i in result["served"] if k == epoch]
            assert Counter(served) == Counter((epoch, i) for i in range(result["batches"]))
