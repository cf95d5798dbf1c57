"""Importing Hugging Face GPT-2 folders into ``GPT`` (``converters/gpt2.py``) and
their byte-level BPE tokenizers (``data/gpt2_tokenizer.py``).

The folder is written by ``transformers`` itself: a small random ``GPT2LMHeadModel`` (3
layers, ``n_embd`` 32, 4 heads, ``gelu_new``) saved with ``save_pretrained``, its parameters
redrawn at a larger scale so that a swapped, untransposed or unsplit tensor changes the
output, and a byte-level BPE trained with ``tokenizers`` saved as ``GPT2TokenizerFast``.

Checked: logits on a right-padded batch equal ``transformers``' (with its attention mask) on
the real tokens, within two float32 paths' bound (``tolerances.model_roundings``), here and
on every other backend (a subprocess each); greedy generation equals ``generate(do_sample=
False)`` token for token; tokenization equals ``GPT2TokenizerFast`` (accents, digits,
characters never seen in training, the empty string), from ``tokenizer.json`` and from
``vocab.json`` + ``merges.txt``; an untied head; what cannot be mapped is one clear error.
Mutations tried by hand against ``test_logits_equal_transformers``: the exact GELU in place
of ``gelu_new`` (caught), query and key columns of ``c_attn`` swapped (caught), the shift of
the embedding rows dropped (caught).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tolerances as tol
from backends import BACKENDS, FAST_XLA_COMPILE
from gpt2_checkpoints import END, tiny_gpt2
from hf_checkpoints import to_numpy

import transformerkit  # noqa: F401  (picks the backend before keras is imported)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import keras  # noqa: E402

from transformerkit.converters.hf_io import CheckpointError  # noqa: E402
from transformerkit.data.gpt2_tokenizer import ID_OFFSET, load_gpt2_tokenizer  # noqa: E402
from transformerkit.decoding.sampling import generate_ids  # noqa: E402
from transformerkit.models import GPT  # noqa: E402

TEXTS = ["A dog runs.", "Zwei Männer gehen über die Straße.", "Crème brûlée, 42 times!",
         "unseen: 東京 🙂 ǅ", "", "  spaces   and\ttabs\n", "<|endoftext|> is text here"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    model, tokenizer = tiny_gpt2(folder)
    return folder, model, tokenizer


def batch_of(tokenizer, texts):
    """``(ours, theirs, mask)``: right-padded ids (ours: GPT-2's + 2, pad 0; theirs: pad =
    end of text) and the real positions."""
    rows = [tokenizer(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    theirs = np.full((len(rows), width), tokenizer.eos_token_id, "int64")
    mask = np.zeros((len(rows), width), bool)
    for i, row in enumerate(rows):
        theirs[i, : len(row)] = row
        mask[i, : len(row)] = True
    ours = np.where(mask, theirs + ID_OFFSET, 0).astype("int32")
    return ours, theirs, mask


def hf_logits(model, theirs, mask):
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(theirs),
                    attention_mask=torch.as_tensor(mask.astype("int64")))
    return out.logits.numpy()


LOGIT_TEXTS = ["A man in an orange hat.", "Zwei Männer!", "Crème brûlée, 42 times and more"]


def assert_logits_equal(gpt, ours_logits, theirs_logits, mask):
    ours_logits = np.asarray(ours_logits)
    assert ours_logits.shape[-1] == theirs_logits.shape[-1] + ID_OFFSET
    expected = theirs_logits[mask]
    bound = tol.chain_atol(tol.model_roundings(gpt, target_len=mask.shape[1]), expected,
                           paths=2)
    tol.assert_within(ours_logits[mask][:, ID_OFFSET:], expected, bound)
    np.testing.assert_array_equal(ours_logits[mask][:, :ID_OFFSET], 0.0)  # <pad>, <s>


def test_logits_equal_transformers(checkpoint):
    folder, model, tokenizer = checkpoint
    gpt = GPT.from_pretrained(folder)
    assert (gpt.activation, gpt.norm_position, gpt.positional, gpt.tie_embeddings) == (
        "gelu_tanh", "pre", "learned", "all")
    assert gpt.vocab_size == len(tokenizer) + ID_OFFSET and gpt.max_length == 40
    ours, theirs, mask = batch_of(tokenizer, LOGIT_TEXTS)
    assert not mask.all()  # padding in the batch
    assert (theirs[mask] == 0).any()  # GPT-2's id 0 ("!"), an ordinary token, not padding
    assert_logits_equal(gpt, to_numpy(gpt(ours)), hf_logits(model, theirs, mask), mask)


def test_untied_head_and_exact_gelu(tmp_path):
    model, tokenizer = tiny_gpt2(tmp_path, seed=1, tie_word_embeddings=False,
                                 activation_function="gelu", n_inner=24,
                                 layer_norm_epsilon=1e-3)
    assert "lm_head.weight" in __import__("safetensors.numpy").numpy.load_file(
        str(tmp_path / "model.safetensors"))
    gpt = GPT.from_pretrained(tmp_path)
    assert (gpt.tie_embeddings, gpt.activation, gpt.d_ff, gpt.layer_norm_epsilon) == (
        "none", "gelu", 24, 1e-3)
    ours, theirs, mask = batch_of(tokenizer, LOGIT_TEXTS)
    assert_logits_equal(gpt, to_numpy(gpt(ours)), hf_logits(model, theirs, mask), mask)


_PROBE = """
import json, sys
import numpy as np
from transformerkit.models import GPT
folder, ids, out = sys.argv[1:]
gpt = GPT.from_pretrained(folder)
np.save(out, np.asarray(__import__("keras").ops.convert_to_numpy(gpt(np.load(ids)))))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_equal_transformers_on_every_backend(checkpoint, tmp_path, backend):
    if backend == keras.backend.backend():
        pytest.skip("this process's backend: test_logits_equal_transformers")
    folder, model, tokenizer = checkpoint
    ours, theirs, mask = batch_of(tokenizer, LOGIT_TEXTS)
    np.save(tmp_path / "ids.npy", ours)
    env = dict(os.environ, KERAS_BACKEND=backend, XLA_FLAGS=FAST_XLA_COMPILE)
    env.pop("TRANSFORMERKIT_TESTS_DEFAULT_BACKEND", None)
    subprocess.run([sys.executable, "-c", _PROBE, str(folder), str(tmp_path / "ids.npy"),
                    str(tmp_path / "logits.npy")], check=True, env=env, timeout=300)
    gpt = GPT.from_pretrained(folder)  # for the bound's sizes
    assert_logits_equal(gpt, np.load(tmp_path / "logits.npy"),
                        hf_logits(model, theirs, mask), mask)


PROMPTS = ["A man", "Zwei junge", "Un café à", "The 12 dogs ran", "She said"]


def test_greedy_generation_equals_transformers(checkpoint):
    folder, model, tokenizer = checkpoint
    gpt = GPT.from_pretrained(folder)
    ours_tokenizer = load_gpt2_tokenizer(folder)
    new_tokens = 20
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            expected = model.generate(ids, do_sample=False, max_new_tokens=new_tokens,
                                      eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.eos_token_id)[0, ids.shape[1]:]
        got = generate_ids(gpt, ours_tokenizer.encode(prompt), new_tokens, temperature=0,
                           eos_id=ours_tokenizer.eos_id)
        assert [i - ID_OFFSET for i in got] == expected.tolist(), prompt


@pytest.mark.parametrize("files", ["tokenizer.json", "vocab.json + merges.txt"])
def test_tokenization_equals_gpt2_tokenizer_fast(checkpoint, tmp_path, files):
    folder, _, tokenizer = checkpoint
    if files != "tokenizer.json":  # GPT-2's original files: vocab.json holds <|endoftext|>
        tokenizer.backend_tokenizer.model.save(str(tmp_path))  # merges.txt (and vocab.json)
        (tmp_path / "vocab.json").write_text(json.dumps(tokenizer.get_vocab()))
        folder = tmp_path
    ours = load_gpt2_tokenizer(folder)
    assert ours.vocab_size == len(tokenizer) + ID_OFFSET
    assert (ours.pad_id, ours.bos_id, ours.eos_id) == (0, tokenizer.eos_token_id + 2,
                                                       tokenizer.eos_token_id + 2)
    assert [ours.id_to_token(i) for i in range(3)] == ["<pad>", "<s>",
                                                       tokenizer.convert_ids_to_tokens(0)]
    for text in TEXTS:
        theirs = tokenizer(text)["input_ids"]
        if END in text:  # transformers reads the spelling as the special token; we do not
            theirs = tokenizer(text, split_special_tokens=True)["input_ids"]
        assert ours.encode(text) == [i + ID_OFFSET for i in theirs], text
        assert ours.decode(ours.encode(text)) == text
    assert ours.encode("") == []


def test_unmappable_configs_are_refused(tmp_path):
    base = {"model_type": "gpt2", "vocab_size": 50, "n_layer": 1, "n_embd": 8, "n_head": 2,
            "n_positions": 16}
    cases = [({"activation_function": "gelu_fast"}, "activation_function='gelu_fast'"),
             ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
             ({"scale_attn_weights": False}, "scale_attn_weights"),
             ({"add_cross_attention": True}, "add_cross_attention"),
             ({"n_head": 3}, "not divisible by n_head"),
             ({"model_type": "gpt_neo"}, "model_type 'gpt_neo' is not gpt2"),
             ({"n_layer": None}, "missing or non-integer n_layer")]
    for i, (change, message) in enumerate(cases):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**base, **change}))
        with pytest.raises(CheckpointError, match=message.replace("(", r"\(")):
            GPT.from_pretrained(folder)


def test_missing_tensors_and_wrong_shapes_are_named(checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder, _, _ = checkpoint
    tensors = load_file(str(folder / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file({k: v for k, v in tensors.items() if "h.1.mlp" not in k},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"lack 4 tensor\(s\).*h\.1\.mlp\.c_fc\.weight"):
        GPT.from_pretrained(tmp_path)
    tensors["transformer.h.0.attn.c_attn.weight"] = tensors[
        "transformer.h.0.attn.c_attn.weight"][:, :64].copy()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="h.0.attn.c_attn.weight has shape"):
        GPT.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no GPT-2 tokenizer"):
        load_gpt2_tokenizer(tmp_path)
