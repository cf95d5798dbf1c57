"""``transformerkit export RUN --format huggingface`` (``export/huggingface.py``): a GPT run as
a folder that ``GPT2LMHeadModel.from_pretrained`` and ``AutoTokenizer`` load.

Checked: an imported GPT-2 run (``gpt2_checkpoints.py``) exported back gives the run's
logits on a padded batch, all columns (the two reserved ones included), and, on GPT-2's
columns, the original checkpoint's; its tokenizer encodes as the run's; the exported folder
imports back with the same ids and logits. A GPT trained here
from scratch with a byte-level BPE (``tie_embeddings: all``, ``gelu``) exports with its
tokenizer, gives its logits and imports back; the options GPT-2 lacks are refused by name.

Bound: ours and ``transformers`` are two float32 paths of the same weights
(``tolerances.model_roundings``).
"""

import numpy as np
import pytest
import tolerances as tol
from gpt2_checkpoints import tiny_gpt2
from hf_checkpoints import to_numpy

import transformerkit

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformerkit.cli import main  # noqa: E402
from transformerkit.data.gpt2_tokenizer import ID_OFFSET  # noqa: E402
from transformerkit.export.huggingface import export_model  # noqa: E402
from transformerkit.models import GPT  # noqa: E402

TEXTS = ["A man in an orange hat.", "Zwei Männer!", "Crème brûlée, 42 times and more 東京"]


def padded_ids(tokenizer, texts):
    rows = [tokenizer.encode(t) for t in texts]
    ids = np.zeros((len(rows), max(map(len, rows))), "int64")
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids, ids != 0


def hf_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(ids),
                     attention_mask=torch.as_tensor(mask.astype("int64"))).logits.numpy()


def assert_same_logits(gpt, ours, theirs, mask):
    bound = tol.chain_atol(tol.model_roundings(gpt, target_len=mask.shape[1]), theirs[mask],
                           paths=2)
    tol.assert_within(ours[mask], theirs[mask], bound)


def test_imported_run_round_trip(tmp_path):
    original, _ = tiny_gpt2(tmp_path / "gpt2")
    assert main(["import", str(tmp_path / "gpt2"), "--out", str(tmp_path / "run")]) == 0
    assert main(["export", str(tmp_path / "run"), "--format", "huggingface"]) == 0
    folder = tmp_path / "run" / "huggingface"
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json"]
    run = transformerkit.load(tmp_path / "run")
    exported = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    ids, mask = padded_ids(run.source_tokenizer, TEXTS)
    ours = to_numpy(run.model(ids.astype("int32")))
    theirs = hf_logits(exported, ids, mask)
    assert_same_logits(run.model, ours, theirs, mask)
    back = hf_logits(original, np.where(mask, ids - ID_OFFSET, 0), mask)
    assert_same_logits(run.model, theirs[..., ID_OFFSET:], back, mask)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert hf_tokenizer.pad_token_id == 0 and hf_tokenizer.eos_token_id == \
        run.source_tokenizer.eos_id == exported.config.eos_token_id
    for text in TEXTS + ["", "unseen 🙂 ǅ"]:
        assert hf_tokenizer(text)["input_ids"] == run.source_tokenizer.encode(text), text
    assert_imports_back(run, folder, tmp_path / "again", ids)


def test_the_generation_settings_go_back_and_forth(tmp_path):
    """The exported ``generation_config.json`` holds the run's ``generation:`` options:
    ``generate`` on the folder continues a prompt as the run does (token for token, greedy),
    and importing it back gives the same section; a sampling run's sampling too."""
    import json

    from transformerkit.decoding.options import GenerationOptions

    original, _ = tiny_gpt2(tmp_path / "gpt2", seed=3)
    original.generation_config.update(max_new_tokens=9, no_repeat_ngram_size=2)
    original.generation_config.save_pretrained(tmp_path / "gpt2")
    assert main(["import", str(tmp_path / "gpt2"), "--out", str(tmp_path / "run")]) == 0
    assert main(["export", str(tmp_path / "run"), "--format", "huggingface"]) == 0
    run, folder = transformerkit.load(tmp_path / "run"), tmp_path / "run" / "huggingface"
    exported = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    for prompt in ["A man", "Zwei junge", "The 12 dogs ran"]:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            new = exported.generate(ids, attention_mask=torch.ones_like(ids))[0, ids.shape[1]:]
        assert prompt + tokenizer.decode(new, skip_special_tokens=True) == \
            run.generate(prompt), prompt
    assert main(["import", str(folder), "--out", str(tmp_path / "again")]) == 0
    assert transformerkit.load(tmp_path / "again").generation == run.generation == \
        GenerationOptions(temperature=0.0, max_new_tokens=9, no_repeat_ngram_size=2)
    sampling = GenerationOptions(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=None,
                                 max_length=30, min_new_tokens=2)
    export_model(run.model, run.source_tokenizer, tmp_path / "sampling", generation=sampling)
    settings = json.loads((tmp_path / "sampling" / "generation_config.json").read_text())
    assert settings["do_sample"] is True and settings["max_length"] == 30
    transformers.GenerationConfig.from_pretrained(str(tmp_path / "sampling"))  # it loads
    assert main(["import", str(tmp_path / "sampling"), "--out", str(tmp_path / "s")]) == 0
    assert transformerkit.load(tmp_path / "s").generation == sampling


def assert_imports_back(run, folder, out, ids):
    """The export imports back unshifted: the same ids, specials and logits as ``run``."""
    assert main(["import", str(folder), "--out", str(out)]) == 0
    again = transformerkit.load(out)
    before, after = run.source_tokenizer, again.source_tokenizer
    assert after.vocab_size == before.vocab_size == again.model.vocab_size
    assert [getattr(after, f"{k}_id") for k in ("pad", "bos", "eos", "unk")] == \
        [getattr(before, f"{k}_id") for k in ("pad", "bos", "eos", "unk")]
    for text in TEXTS:
        assert after.encode(text) == before.encode(text)
    np.testing.assert_array_equal(to_numpy(again.model(ids.astype("int32"))),
                                  to_numpy(run.model(ids.astype("int32"))))


def test_gpt_trained_here_exports(tmp_path):
    from transformerkit.config import resolve
    from transformerkit.training.trainer import train

    text = tmp_path / "text.txt"
    text.write_text("A man in an orange hat.\nZwei Männer gehen!\nCrème brûlée, 42.\n" * 30)
    train(resolve({
        "model": {"type": "gpt", "num_layers": 2, "d_model": 16, "num_heads": 2, "d_ff": 32,
                  "dropout": 0.0, "max_length": 32, "tie_embeddings": "all"},
        "data": {"dataset": "text", "text": str(text), "tokenizer": "bpe", "vocab_size": 300,
                 "block_size": 16, "batch_size": 8, "steps_per_epoch": 5},
        "train": {"epochs": 1, "learning_rate": 0.01, "verbose": 0, "samples": 0}}),
        tmp_path / "run")
    run = transformerkit.load(tmp_path / "run")
    assert main(["export", str(tmp_path / "run"), "--format", "huggingface", "--out",
                 str(tmp_path / "hf")]) == 0
    exported = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    assert exported.config.activation_function == "gelu"
    ids, mask = padded_ids(run.source_tokenizer, TEXTS)
    assert_same_logits(run.model, to_numpy(run.model(ids.astype("int32"))),
                       hf_logits(exported, ids, mask), mask)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    for text in TEXTS:
        assert hf_tokenizer(text)["input_ids"] == run.source_tokenizer.encode(text), text
    assert_imports_back(run, tmp_path / "hf", tmp_path / "again", ids)


@pytest.mark.parametrize("options,message", [
    ({"norm_position": "post"}, "model.norm_position='post' has no GPT-2 equivalent"),
    ({"positional": "sinusoidal"}, "model.positional='sinusoidal' has no GPT-2 equivalent"),
    ({"scale_embeddings": True}, "model.scale_embeddings=True has no GPT-2 equivalent"),
    ({"use_bias": False}, "model.use_bias=False has no GPT-2 equivalent"),
    ({"key_dim": 3}, "model.key_dim=3 / value_dim=3: GPT-2's heads are"),
    ({"tie_embeddings": "none"}, "the output projection has a bias"),
])
def test_options_gpt2_lacks_are_refused(tmp_path, options, message):
    from transformerkit.data.tokenizers import SubwordTokenizer

    tokenizer = SubwordTokenizer.train(["a b c d e f g"] * 5, vocab_size=30)
    gpt = GPT(tokenizer.vocab_size, num_layers=1, d_model=8, num_heads=2, d_ff=16,
              max_length=8, **{"tie_embeddings": "all", **options})
    if options.get("tie_embeddings") == "none":
        head = gpt.output_projection
        head.bias.assign(np.full(head.bias.shape, 0.1, "float32"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        export_model(gpt, tokenizer, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
