"""The eager (PyTorch) decode loops run under ``torch.inference_mode``
(``decoding/compiled.py: run_decoder``), and a model decoded before it was ever called or
trained still trains afterwards: its variables are made outside inference mode, and the
weights its decoders packed follow the training's updates."""

import keras
import numpy as np
import pytest

from transformerkit.decoding import beam_translate, generate_ids, greedy_translate
from transformerkit.decoding.compiled import run_decoder
from transformerkit.models import GPT, Transformer
from transformerkit.training import MaskedCrossEntropy, attach_train_step

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="inference mode is PyTorch's")

SOURCES = np.array([[5, 9, 14, 7, 2], [11, 6, 19, 2, 0]], dtype="int32")


def _transformer():
    keras.utils.set_random_seed(3)
    return Transformer(32, 32, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_length=16,
                       dropout=0.0)


def _is_inference(variable):
    return keras.ops.convert_to_tensor(variable).is_inference()


def test_the_loop_runs_in_inference_mode_and_leaves_it():
    import torch

    model = _transformer()
    assert bool(run_decoder(model, "probe", torch.is_inference_mode_enabled))
    assert not torch.is_inference_mode_enabled()


def test_a_model_first_built_by_decoding_trains_and_its_decoder_follows():
    import torch

    model = _transformer()
    assert not model.built
    before = greedy_translate(model, SOURCES, max_new_tokens=6)
    beam_translate(model, SOURCES, beam_size=2, max_new_tokens=6)
    assert model.built
    assert model.weights and not any(_is_inference(v) for v in model.weights)

    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=MaskedCrossEntropy())
    attach_train_step(model)
    decoder_input = np.array([[1, 7, 8, 9], [1, 10, 11, 0]], "int32")
    labels = np.array([[7, 8, 9, 2], [10, 11, 2, 0]], "int32")
    kernel = model.decoder_blocks[0].feedforward.inner.kernel
    start = keras.ops.convert_to_numpy(kernel).copy()
    for _ in range(20):
        model.train_on_batch((SOURCES, decoder_input), labels)
    assert not np.array_equal(keras.ops.convert_to_numpy(kernel), start)
    assert not any(_is_inference(v) for v in model.weights)

    after = greedy_translate(model, SOURCES, max_new_tokens=6)
    assert after != before  # the trained weights, packed anew
    # the first token is the argmax of the trained model's own forward pass, computed with
    # autograd on (raw weights, none of the decoder's packed copies)
    assert torch.is_grad_enabled()
    logits = model((SOURCES, np.array([[1]] * 2, "int32")))
    assert [row[0] for row in after] == keras.ops.convert_to_numpy(
        keras.ops.argmax(logits[:, 0], -1)).tolist()


def test_a_language_model_first_built_by_generation_still_trains():
    keras.utils.set_random_seed(4)
    model = GPT(32, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=16,
                dropout=0.0)
    generate_ids(model, np.array([[1, 5, 6]], "int32"), max_new_tokens=4)
    assert not any(_is_inference(v) for v in model.weights)
    model.compile(optimizer="adam", loss=MaskedCrossEntropy())
    attach_train_step(model)
    ids = np.array([[1, 5, 6, 7, 8]], "int32")
    loss = model.train_on_batch(ids[:, :-1], ids[:, 1:])
    assert np.isfinite(loss)
