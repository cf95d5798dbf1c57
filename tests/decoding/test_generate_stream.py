"""Streamed generation (``Run.generate_stream``, :mod:`transformerkit.decoding.streaming`).

A tiny random-weight GPT with a character tokenizer, on the backend the tests run on
(PyTorch's eager loop by default; ``KERAS_BACKEND=jax`` or ``tensorflow`` runs the chunked
path of the compiled loops, and :func:`test_the_chunked_path_on_jax` does so in a
subprocess). Claims: the prompt and the joined pieces are ``Run.generate``'s text, exact on
PyTorch (the same search, watched step by step); on the compiled loops the ids equal except
at a near-tie (greedy: ``tests/support/near_ties.py``; seeded sampling: the same draws, so exact
unless a rounding difference flips one); closing the stream stops the decoding: the model
makes no step after ``close()`` returns. Byte-level BPE pieces are whole characters.
"""

import functools
import os
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest
from backends import FAST_XLA_COMPILE
from near_ties import assert_same_ids_or_near_tie, next_logits_after
from paths import SUPPORT_DIR
from step_counter import StepCounter

from transformerkit.api import Run
from transformerkit.config import resolve
from transformerkit.data.tokenizers import CharTokenizer, SubwordTokenizer
from transformerkit.decoding import sampling, streaming
from transformerkit.decoding.compiled import is_eager_loop
from transformerkit.decoding.streaming import stream_ids
from transformerkit.decoding.texts import text_pieces
from transformerkit.models import GPT

TOKENIZER = CharTokenizer.train(["abcdefghijklmnopqrstuvwxyz ."])
OPTIONS = {
    "greedy": dict(temperature=0, max_new_tokens=12),
    "seeded": dict(seed=5, max_new_tokens=15, top_k=8),
    "nucleus_beyond_the_context": dict(seed=2, top_p=0.9, max_new_tokens=70),
    "greedy_beyond_the_context": dict(temperature=0, max_new_tokens=60, stop_at_eos=False),
    "no_end_token": dict(seed=9, max_new_tokens=40, stop_at_eos=False),
}


@functools.cache  # one model per bias: on JAX, its compiled decoders are kept on it
def tiny_gpt_run(eos_bias=1.5, seed=0):
    """A ``Run`` of a random GPT (max_length 24) on :data:`TOKENIZER`, weights moved by
    N(0, 0.5) so that the scores of its ids are far apart; ``eos_bias`` is added to the
    end token's score (a model that ends its texts). Tests must not change it."""
    keras.utils.set_random_seed(seed)
    model = GPT(TOKENIZER.vocab_size, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                max_length=24)
    model(np.array([[5, 6]]))
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(np.asarray(w.numpy()) + rng.normal(0, 0.5, w.shape).astype("float32"))
    bias = model.weights[-1]  # the output projection's bias
    bias.assign(np.asarray(bias.numpy()) + eos_bias * np.eye(bias.shape[0])[TOKENIZER.eos_id])
    return Run(model, resolve({"model": {"type": "gpt"}}), TOKENIZER, TOKENIZER)


def stream_threads():
    return [t for t in threading.enumerate() if t.name == "transformerkit-stream"]


@pytest.mark.parametrize("name", OPTIONS)
def test_joined_pieces_are_the_generated_text(name):
    run = tiny_gpt_run()
    options = OPTIONS[name]
    expected = run.generate("hello", **options)
    pieces = list(run.generate_stream("hello", **options))
    prompt = TOKENIZER.encode("hello")
    search = {k: v for k, v in options.items() if k not in ("max_new_tokens", "stop_at_eos")}
    eos = TOKENIZER.eos_id if options.get("stop_at_eos", True) else None
    ids = sampling.generate_ids(run.model, prompt, options["max_new_tokens"], eos_id=eos,
                                **search)
    chunks = list(stream_ids(run.model, prompt, options["max_new_tokens"], eos_id=eos,
                             **search))
    streamed_ids = [i for chunk in chunks for i in chunk]
    if is_eager_loop() or "seed" in options:  # the same search / the same draws
        assert streamed_ids == ids
        assert "hello" + "".join(pieces) == expected
    else:
        assert_same_ids_or_near_tie([streamed_ids], [ids],
                                    next_logits_after(run.model, prompts=[prompt]))
    # a piece per list of ids; on PyTorch a list per step, one id each; a character
    # tokenizer: each piece one character, but the end token's, which is empty
    assert len(pieces) == len(chunks)
    if is_eager_loop():
        assert all(len(chunk) == 1 for chunk in chunks)
        assert [p != "" for p in pieces] == [i != TOKENIZER.eos_id for i in ids]
    else:  # chunks of at most CHUNK_TOKENS ids
        assert all(1 <= len(chunk) <= streaming.CHUNK_TOKENS for chunk in chunks)


def test_the_end_token_ends_the_stream():
    run = tiny_gpt_run()
    new = sampling.generate_ids(run.model, TOKENIZER.encode("hello"), 40, seed=5,
                                eos_id=TOKENIZER.eos_id)
    assert new[-1] == TOKENIZER.eos_id and len(new) < 40  # the model does end its text
    chunks = list(stream_ids(run.model, TOKENIZER.encode("hello"), 40, seed=5,
                             eos_id=TOKENIZER.eos_id))
    assert [i for chunk in chunks for i in chunk] == new
    assert "hello" + "".join(run.generate_stream("hello", max_new_tokens=40, seed=5)) == \
        run.generate("hello", max_new_tokens=40, seed=5)


def test_closing_the_stream_stops_the_decoding(monkeypatch):
    run = tiny_gpt_run()
    counter = StepCounter(monkeypatch)
    pieces = run.generate_stream("hello", max_new_tokens=5000, seed=1, stop_at_eos=False)
    next(pieces)
    pieces.close()  # returns once the decoding has stopped
    made = counter.count
    assert not stream_threads()
    # at most the step under way when close() came (PyTorch), or the chunk that gave the
    # first piece (compiled loops); 5000 tokens are far away
    assert made <= (50 if is_eager_loop() else 1)
    with pytest.raises(StopIteration):
        next(pieces)
    # another generation runs its 3 steps; the stream's makes none
    run.generate("hello", max_new_tokens=3, stop_at_eos=False)
    assert counter.count - made == (3 if is_eager_loop() else 1)


def test_a_consumer_that_stops_iterating_stops_the_decoding(monkeypatch):
    run = tiny_gpt_run()
    counter = StepCounter(monkeypatch)
    for _ in run.generate_stream("hello", max_new_tokens=5000, seed=1, stop_at_eos=False):
        break  # the generator is dropped, and closed with it
    made = counter.count
    assert not stream_threads() and made <= (50 if is_eager_loop() else 1)


def test_bad_arguments_fail_before_the_stream_starts():
    run = tiny_gpt_run()
    with pytest.raises(ValueError, match="empty"):
        run.generate_stream("")
    with pytest.raises(TypeError, match="str"):
        run.generate_stream(["hello"])
    with pytest.raises(ValueError, match="top_p"):
        run.generate_stream("hello", top_p=1.5)
    with pytest.raises(TypeError, match="unknown_option|unexpected|not an option"):
        run.generate_stream("hello", unknown_option=1)
    translation = Run(run.model, resolve({"model": {"type": "transformer"}}), TOKENIZER,
                      TOKENIZER)
    with pytest.raises(TypeError, match="needs a gpt run"):
        translation.generate_stream("hello")


def test_an_error_in_the_decoding_reaches_the_consumer(monkeypatch):
    run = tiny_gpt_run()

    def failing(*args, **kwargs):
        raise RuntimeError("the model failed")

    monkeypatch.setattr(sampling, "make_steps", failing)
    monkeypatch.setattr(streaming, "generate_once", failing)
    pieces = run.generate_stream("hello", max_new_tokens=5)
    with pytest.raises(RuntimeError, match="the model failed"):
        next(pieces)
    assert not stream_threads()


@pytest.mark.skipif(not is_eager_loop(), reason="the hook is the eager loop's")
def test_the_step_hook_sees_every_token_and_can_stop_the_search():
    run = tiny_gpt_run()
    seen = []
    new = sampling.generate_ids(run.model, [5, 6, 7], 30, seed=4,
                                on_token=lambda ids: seen.append(ids.tolist()))
    assert [ids[0] for ids in seen] == new  # windows of a 24-token context included

    class Enough(Exception):
        pass

    def stop_after_three(ids):
        seen.append(ids)
        if len(seen) == 3:
            raise Enough

    seen = []
    with pytest.raises(Enough):
        sampling.generate_ids(run.model, [5, 6, 7], 30, seed=4, on_token=stop_after_three)
    assert len(seen) == 3


def test_byte_level_pieces_are_whole_characters():
    text = "Grüße aus Köln, 東京 und Zürich. " * 3
    tokenizer = SubwordTokenizer.train([text, "abc def ghi"], kind="bpe", vocab_size=270)
    ids = tokenizer.encode(text)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # parts of a character
    pieces = list(text_pieces(tokenizer, ([i] for i in ids)))
    assert "".join(pieces) == tokenizer.decode(ids) and "\ufffd" not in "".join(pieces)
    assert len(pieces) == len(ids) and "" in pieces  # parts of a character wait
    for kind in ("wordpiece", "unigram"):
        other = SubwordTokenizer.train([text, "abc def ghi"], kind=kind, vocab_size=60)
        ids = other.encode(text)
        assert "".join(text_pieces(other, ([i] for i in ids))) == other.decode(ids)


def test_ctranslate2_streams_what_it_generates(tmp_path):
    pytest.importorskip("ctranslate2")
    if keras.backend.backend() != "torch":
        pytest.skip("the export's own tests cover the other backends")
    TOKENIZER.save(tmp_path / "tokenizer.json")
    model = tiny_gpt_run().model  # a run of its own, exported into tmp_path
    run = Run(model, resolve({"model": {"type": "gpt"}}), TOKENIZER, TOKENIZER, str(tmp_path))
    for options in (dict(temperature=0, max_new_tokens=15), dict(seed=3, max_new_tokens=18)):
        expected = run.generate("hello", engine="ctranslate2", **options)
        pieces = list(run.generate_stream("hello", engine="ctranslate2", **options))
        assert "hello" + "".join(pieces) == expected and len(pieces) >= len(expected) - 5
    pieces = run.generate_stream("hello", engine="ctranslate2", temperature=0,
                                 max_new_tokens=18, stop_at_eos=False)
    next(pieces)
    pieces.close()  # generate_tokens' search stops and its thread ends
    with pytest.raises(ValueError, match="max_length=24"):
        run.generate_stream("hello", engine="ctranslate2", max_new_tokens=30)


# -- the chunked path of the compiled loops ---------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("KERAS_BACKEND") == "jax", reason="runs on JAX already")
def test_the_chunked_path_on_jax():
    """Tests of this file in a subprocess on JAX (compiled loops): seeded sampling and
    greedy search over several windows, and closing a stream."""
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS=FAST_XLA_COMPILE,
               PYTHONPATH=os.pathsep.join(filter(None, [str(SUPPORT_DIR),
                                                         os.environ.get("PYTHONPATH")])))
    env.pop("TRANSFORMERKIT_TESTS_DEFAULT_BACKEND", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", __file__,
         "-k", "seeded or greedy_beyond or closing"],
        env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
