"""``transformerkit.load`` and the CLI commands that use a trained run: translate (texts and
streamed stdin, n-best), generate, evaluate, attention, plot; the training monitors. What a
trained run computes, through the API and through the commands that wrap it (in
subprocesses, as a user runs them); how the command line reads its arguments is
``tests/cli/test_parser.py``.

Two tiny runs are trained once for the whole test run (a 1-layer de->en Transformer on 300
Multi30k pairs with the sample and BLEU monitors on, and a 1-layer character GPT), shared
by the pytest-xdist workers (``build_once`` of ``conftest.py``).
"""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import tolerances as tol
from paths import SHARED_DATA

TINY_TRANSLATION = [
    "data.train_limit=300", "data.val_limit=30", "data.vocab_size=400",
    "data.tokens_per_batch=1024", "model.num_layers=1", "model.d_model=32",
    "model.num_heads=4", "model.d_ff=64", "model.max_length=40", "data.max_length=40",
    "train.epochs=2", "train.warmup_steps=20", "train.eval_max_sentences=8",
    "train.decode_max_length=12", "train.samples=2", "train.verbose=0",
    "train.sample_every=1", "train.bleu_every=1", "train.bleu_max_sentences=8",
]


def cli(*args, stdin=None, backend=None, check=True):
    env = dict(os.environ, TRANSFORMERKIT_DATA=str(SHARED_DATA))
    if backend:
        env["KERAS_BACKEND"] = backend
    result = subprocess.run([sys.executable, "-m", "transformerkit.cli", *map(str, args)],
                            input=stdin, capture_output=True, text=True, env=env, timeout=600)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def sets(items):
    return [arg for item in items for arg in ("--set", item)]


def gpt_config(folder, data_dir):
    text = os.path.join(data_dir, "tinyshakespeare", "input.txt")
    path = folder / "gpt.yaml"
    path.write_text(
        "model: {type: gpt, num_layers: 1, d_model: 32, num_heads: 4, d_ff: 64, "
        "max_length: 48, dropout: 0.0}\n"
        f"data: {{dataset: text, text: '{text}', tokenizer: char, block_size: 32, "
        "batch_size: 8, steps_per_epoch: 15}\n"
        "train: {epochs: 1, learning_rate: 0.003, samples: 1, verbose: 0}\n")
    return path


@pytest.fixture(scope="session")
def runs(build_once, data_dir):
    """``{"translation": dir, "gpt": dir, "train_log": str}``, trained once for the run."""
    def build(folder):
        translation = cli("train", "configs/multi30k_de_en.yaml", "--out",
                          folder / "translation", *sets(TINY_TRANSLATION))
        cli("train", gpt_config(folder, data_dir), "--out", folder / "gpt")
        (folder / "train_log.txt").write_text(translation.stdout + translation.stderr)

    folder = build_once("api_runs", build)
    return {"translation": folder / "translation", "gpt": folder / "gpt",
            "train_log": (folder / "train_log.txt").read_text()}


@pytest.fixture(scope="session")
def translation_run(runs):
    import transformerkit

    return transformerkit.load(runs["translation"])


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


# -- the Python API ---------------------------------------------------------------------------

def test_import_does_not_import_keras_and_load_is_lazy():
    code = ("import sys, transformerkit; assert 'keras' not in sys.modules; "
            "load = transformerkit.load; assert 'keras' not in sys.modules; print(load.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "load", out.stderr


def test_loaded_run_translates(translation_run):
    from transformerkit.decoding import greedy_translate
    from transformerkit.models import Transformer

    run = translation_run
    assert isinstance(run.model, Transformer) and run.kind == "transformer"
    texts = ["Ein Hund läuft.", "Zwei Männer spielen Fußball im Park."]
    one = run.translate(texts[0], max_new_tokens=10)
    assert isinstance(one, str)
    greedy = run.translate(texts, beam_size=1, max_new_tokens=10)
    ids = greedy_translate(run.model, np.array(  # the run's search (its n-gram rule), greedy
        [run.source_tokenizer.encode(texts[0], add_eos=True)]),
        run.search.replace(beam_size=1, max_new_tokens=10))
    assert greedy[0] == run.target_tokenizer.decode(ids[0])
    n_best = run.translate(texts, beam_size=3, n_best=3, max_new_tokens=10)
    for found in n_best:
        assert len(found) == 3 and all(isinstance(t, str) for t, _ in found)
        assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
    sampled = run.translate(texts, temperature=1.0, top_k=20, seed=4, max_new_tokens=10)
    assert run.translate(texts, temperature=1.0, top_k=20, seed=4, max_new_tokens=10) == sampled
    with pytest.raises(ValueError, match="empty"):
        run.translate(["Ein Hund.", ""])
    with pytest.raises(TypeError, match="gpt run"):
        run.generate("Hallo")


def test_without_ctranslate2_the_keras_engine_translates(runs, monkeypatch):
    """``pip install ".[torch]"`` has no CTranslate2: a run translates with the keras
    engine, and only ``engine="ctranslate2"`` asks for the extra, in one line."""
    import transformerkit
    from transformerkit.extras import MissingExtra

    for name in list(sys.modules):
        if name == "ctranslate2" or name.startswith(("ctranslate2.", "transformerkit.export")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    run = transformerkit.load(runs["translation"])
    assert isinstance(run.translate("Ein Hund läuft.", max_new_tokens=5), str)
    with pytest.raises(MissingExtra, match=r"keras-transformerkit\[ctranslate2\]"):
        run.translate("Ein Hund läuft.", engine="ctranslate2")


def test_the_compiled_engine_looks_its_packages_up_under_the_threads_given(runs, monkeypatch):
    """The compiled engine's packages are named by PyTorch's threads (a package's kernels
    run as many as at its build), so ``load(threads=N)`` sets them before it looks the
    packages up: packages built under ``--threads N`` are found by the next call with
    ``--threads N``."""
    import torch

    import transformerkit
    from transformerkit import api
    from transformerkit.decoding.compiled import backend

    if backend() != "torch":
        pytest.skip("the compiled engine's packages are PyTorch's")
    looked_up = []
    monkeypatch.setattr(api, "_packaged_model",
                        lambda *args: looked_up.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        transformerkit.load(runs["translation"], engine="compiled", threads=1)
    finally:
        torch.set_num_threads(before)
    assert looked_up == [1]


def test_threads_are_the_cores_available_unless_given(runs):
    """``threads`` as ``load()`` and ``--threads`` take it: 0 leaves PyTorch's threads at
    its default, the cores this process may use; N sets them (keras and compiled engines);
    the CTranslate2 engine gets the same count (``resolve_threads``), whatever the host."""
    import torch

    import transformerkit
    from transformerkit.threads import resolve_threads

    before = torch.get_num_threads()
    try:
        transformerkit.load(runs["translation"], threads=1)
        assert torch.get_num_threads() == 1
        transformerkit.load(runs["translation"])  # 0: left as it is
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert resolve_threads(3) == 3
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from transformerkit.threads import resolve_threads; import torch; "
            "print(resolve_threads(0), torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["1", "1"], out.stderr


@pytest.mark.parametrize("texts, error, message", [
    (None, TypeError, "texts must be a str or a list of str, got NoneType"),
    (5, TypeError, "texts must be a str or a list of str, got int"),
    (b"Ein Hund.", TypeError, "texts are bytes: decode them"),
    (["Ein Hund.", b"Hund"], TypeError, "text 1 is bytes, not str"),
    ([1, 2], TypeError, "text 0 is int, not str"),
    (["   "], ValueError, "text 0 is empty"),
])
def test_translate_refuses_what_is_not_text(translation_run, texts, error, message):
    with pytest.raises(error, match=message):
        translation_run.translate(texts, beam_size=1, max_new_tokens=3)


@pytest.mark.parametrize("options, error, message", [
    (dict(beam_size=0), ValueError, "beam_size must be at least 1, got 0"),
    (dict(beam_size="4"), TypeError, "beam_size must be an int, got str"),
    (dict(beam_size=2.0), TypeError, "beam_size must be an int, got float"),
    (dict(beam_size=True), TypeError, "beam_size must be an int, got bool"),
    (dict(n_best=0), ValueError, "n_best must be at least 1"),
    (dict(batch_size=0), ValueError, "batch_size must be at least 1"),
    (dict(alpha="0.6"), TypeError, "alpha .length penalty. must be a number"),
    (dict(alpha=float("nan")), ValueError, "alpha .length penalty. must be in .0, 10.,"),
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int"),
])
def test_translate_refuses_bad_search_options(translation_run, options, error, message):
    with pytest.raises(error, match=message):
        translation_run.translate(["Ein Hund."], **{"max_new_tokens": 3, **options})


def test_numpy_counts_and_iterables_of_texts_are_taken(translation_run):
    run = translation_run
    texts = ["Ein Hund läuft.", "Zwei Männer."]
    expected = run.translate(texts, beam_size=2, max_new_tokens=5)
    assert run.translate(tuple(texts), beam_size=np.int64(2), max_new_tokens=np.int32(5)) \
        == expected
    assert run.translate(np.array(texts), beam_size=2, max_new_tokens=5) == expected
    assert run.translate((t for t in texts), beam_size=2, max_new_tokens=5) == expected
    with pytest.raises(TypeError, match="one source and one target"):
        run.score(texts[0], [texts[1]])
    with pytest.raises(TypeError, match="target 0 is int"):
        run.score([texts[0]], [3])


def test_attention_weights_per_layer_and_head(translation_run):
    run = translation_run
    weights = run.attention("Ein Hund läuft im Schnee.", "A dog runs in the snow.")
    src, tgt_in = len(weights["source_tokens"]), len(weights["target_input_tokens"])
    assert weights["source_tokens"][-1] == "</s>" and weights["target_input_tokens"][0] == "<s>"
    assert len(weights["target_output_tokens"]) == tgt_in
    heads, layers = run.model.num_heads, run.model.num_layers
    assert weights["encoder"].shape == (layers, heads, src, src)
    assert weights["decoder_self"].shape == (layers, heads, tgt_in, tgt_in)
    assert weights["cross"].shape == (layers, heads, tgt_in, src)
    # a float32 softmax over src keys (relative roundings), summed here in float32
    tol.assert_within(weights["cross"].sum(-1), np.ones(weights["cross"].shape[:-1]),
                      tol.gamma(tol.SOFTMAX_EXTRA + 2 * src))
    assert np.abs(np.triu(weights["decoder_self"][0, 0], k=1)).max() == 0.0  # causal: exact
    default = run.attention("Ein Hund läuft im Schnee.")  # target = greedy translation
    assert default["cross"].shape[-1] == src


@pytest.mark.parametrize("options, error, message", [
    (dict(temperature="hot"), TypeError, "temperature must be a number, got str"),
    (dict(temperature=-1.0), ValueError, "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), ValueError, "temperature must be a finite number"),
    (dict(top_k=2.5), TypeError, "top_k must be an int, got float"),
    (dict(top_k=0), ValueError, "top_k must be at least 1"),
    (dict(top_p=1.5), ValueError, "top_p must be in \\(0, 1\\]"),
    (dict(top_p="0.9"), TypeError, "top_p must be a number"),
    (dict(seed="x"), TypeError, "seed must be an int, got str"),
    (dict(max_new_tokens="5"), TypeError, "max_new_tokens must be an int"),
])
def test_sampling_refuses_bad_options(runs, translation_run, options, error, message):
    import transformerkit

    gpt = transformerkit.load(runs["gpt"])
    with pytest.raises(error, match=message):
        gpt.generate("ROMEO:", **{"max_new_tokens": 3, **options})
    with pytest.raises(error, match=message):
        translation_run.translate("Ein Hund.", **{"max_new_tokens": 3, "temperature": 1.0,
                                                   **options})


def test_gpt_run_generates_reproducibly(runs):
    import transformerkit

    run = transformerkit.load(runs["gpt"])
    assert run.kind == "gpt"
    text = run.generate("ROMEO:", max_new_tokens=20, seed=3, top_p=0.9)
    assert text.startswith("ROMEO:") and len(text) > len("ROMEO:")
    assert run.generate("ROMEO:", max_new_tokens=20, seed=3, top_p=0.9) == text
    greedy = run.generate("ROMEO:", max_new_tokens=20, temperature=0)
    assert run.generate("ROMEO:", max_new_tokens=20, top_k=1, seed=8) == greedy
    with pytest.raises(ValueError, match="empty"):
        run.generate("")
    with pytest.raises(TypeError, match="transformer run"):
        run.translate("Hallo")
    weights = run.attention("To be")
    assert weights["self"].shape[-2:] == (5, 5) and weights["tokens"] == ["T", "o", "▁", "b", "e"]


def test_training_monitors_print_samples_and_log_bleu(runs):
    assert "samples after epoch 1" in runs["train_log"]
    assert "samples after epoch 2" in runs["train_log"]
    assert "val_bleu" in runs["train_log"]
    header = (runs["translation"] / "history.csv").read_text().splitlines()[0].split(",")
    assert "val_bleu" in header and "val_chrf" in header


# -- the CLI ----------------------------------------------------------------------------------

def test_cli_translate_texts_and_streamed_stdin(runs, translation_run):
    texts = ["Ein Hund läuft.", "Eine Frau singt ein Lied."]
    out = cli("translate", runs["translation"], *texts, "--max-new-tokens", "10")
    assert out.stdout.splitlines() == translation_run.translate(texts, max_new_tokens=10)
    stdin = "Ein Hund läuft.\n\nEine Frau singt ein Lied.\n"
    streamed = cli("translate", runs["translation"], "--n-best", "2", "--max-new-tokens", "10",
                   stdin=stdin)
    lines = [line.split("\t") for line in streamed.stdout.splitlines()]
    assert [int(line[0]) for line in lines] == [0, 0, 2, 2]  # the empty line 1 is skipped
    scores = [float(line[1]) for line in lines]
    assert scores[0] >= scores[1] and scores[2] >= scores[3]


def test_cli_translate_samples(runs, translation_run):
    texts = ["Ein Hund läuft.", "Eine Frau singt ein Lied."]
    options = ("--temperature", "1.5", "--top-k", "20", "--top-p", "0.9", "--seed", "3",
               "--max-new-tokens", "10")
    out = cli("translate", runs["translation"], *texts, *options)
    assert out.stdout.splitlines() == translation_run.translate(
        texts, temperature=1.5, top_k=20, top_p=0.9, seed=3, max_new_tokens=10)
    refused = cli("translate", runs["translation"], *texts, *options, "--n-best", "2",
                  check=False)
    assert refused.returncode == 2
    assert "lists come from beam search" in refused.stderr


def test_cli_generate(runs):
    args = ("generate", runs["gpt"], "--prompt", "ROMEO:", "--max-new-tokens", "15",
            "--temperature", "0.8", "--top-k", "10", "--seed", "5")
    first = cli(*args).stdout
    assert first.startswith("ROMEO:") and cli(*args).stdout == first


def test_cli_evaluate_stores_scores(runs, tmp_path):
    out = cli("evaluate", runs["translation"], "--split", "val", "--max-sentences", "12",
              "--beam", "2", "--max-new-tokens", "12").stdout
    assert "BLEU = " in out and "nrefs:1|case:mixed" in out and "chrF = " in out
    source, reference = tmp_path / "mine.de", tmp_path / "mine.en"
    source.write_text("Ein Hund läuft.\nEine Frau singt.\n")
    reference.write_text("A dog runs.\nA woman sings.\n")
    cli("evaluate", runs["translation"], "--source", source, "--reference", reference,
        "--beam", "1", "--output", tmp_path / "hyp.txt")
    metrics = json.loads((runs["translation"] / "metrics.json").read_text())
    assert metrics["evaluate"]["val"]["sentences"] == 12
    assert metrics["evaluate"]["val"]["beam_size"] == 2
    assert "BLEU" not in metrics["evaluate"]["mine"]["bleu_signature"]
    assert 0.0 <= metrics["evaluate"]["mine"]["chrf"] <= 100.0
    assert "val_bleu" in metrics  # what `train` wrote is kept
    assert len((tmp_path / "hyp.txt").read_text().splitlines()) == 2


def test_cli_attention_and_plot_write_pngs(runs, tmp_path):
    from transformerkit.plotting import attention_figure_size

    out = cli("attention", runs["translation"], "Ein Hund läuft im Schnee.", "--out",
              tmp_path / "cross.png")
    assert "wrote" in out.stdout
    assert png_size(tmp_path / "cross.png") == attention_figure_size(4)
    cli("plot", runs["translation"], "--out", tmp_path / "curves.png")
    assert png_size(tmp_path / "curves.png") == (1200, 400)


def test_cli_errors_are_one_line(runs, tmp_path):
    out = cli("translate", tmp_path / "nothing", "Hallo", check=False)
    assert out.returncode == 2 and "not a run directory" in out.stderr
    out = cli("attention", runs["translation"], "Hallo", "--out", tmp_path / "x.png",
              "--layer", "5", check=False)
    assert out.returncode == 2 and "--layer 5" in out.stderr


def test_cli_translate_on_jax(runs):
    out = cli("--backend", "jax", "translate", runs["translation"], "Ein Hund läuft.",
              "--beam", "2", "--max-new-tokens", "8")
    assert len(out.stdout.splitlines()) == 1
