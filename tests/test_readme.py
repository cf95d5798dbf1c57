"""Every command block of the manual runs: the README and the docs pages cannot drift from
the code.

The manual is README.md and the docs pages listed in :data:`MANUAL_PAGES`. Their blocks run
document by document, README.md first and then each page in that list's order (the pages use
the README's runs), all in one scratch folder (``configs/`` linked in, a few small text files
beside it). In each document the ``bash`` blocks run first, in order; each ``transformerkit
train`` gets tiny model and data settings appended (later ``--set`` options win), so the runs
(``runs/small``, ``runs/gpt``, ...) exist in seconds. Then every ``python`` block of the
document runs in a fresh process in the same folder. Only the lines in :data:`NOT_RUN_HERE`
are left out, each with its reason; any other command the manual shows must be a
``transformerkit`` command that exits 0. ``docs/benchmarks.md`` is not run here (see
:data:`NOT_MANUAL_PAGES`): its commands are the long benchmarks themselves.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from manual import DOCS, DOCUMENTS, MANUAL_PAGES, README, ROOT, blocks, commands  # noqa: F401

# The docs pages whose blocks this test does not run, and why.
NOT_MANUAL_PAGES = {
    "layout.md": "the source tree as a listing: no commands",
    "testing.md": "the test suite itself, described: no commands but `make test` and "
                  "`make test-slow`, which run this suite",
    "pretrained_marian.md": "its block reads a downloaded OPUS-MT folder; "
                            "tests/models/test_marian_import.py builds such folders with "
                            "transformers and checks what the page says on them",
    "benchmarks.md": "benchmark methods and current tables: its commands are the `bench/` scripts, "
                     "long measurements (minutes to hours each) against peers, run by hand",
}

# Commands shown in the manual that this test does not run, and why.
NOT_RUN_HERE = {
    "make": "the Makefile's targets: `make test` is this suite itself (CI runs it), `make demo` "
            "trains for 10 minutes",
    "pip": "installing the package: tests/test_install.py builds and installs it",
    "transformerkit serve": "a server runs until stopped: tests/serving/test_page.py starts "
                            "it and drives its page, tests/serving/test_serving.py tests its "
                            "API in-process, tests/serving/test_lifecycle.py its readiness, "
                            "drain at SIGTERM and --workers",
    "curl": "requests to a running `transformerkit serve`: tests/serving/test_serving.py "
            "sends the manual's requests to its API",
    "env": "several JAX processes (each started with KERAS_DISTRIBUTION_* variables): "
           "tests/training/test_jax_processes.py launches 2 on loopback and checks their "
           "weights; `transformerkit serve` with its API keys: tests/serving/test_auth.py "
           "runs it",
    "hf": "downloading from the Hugging Face hub needs the internet: the scratch folder holds "
          "a GPT-2 and a Marian folder `transformers` wrote (tests/support/gpt2_checkpoints.py, "
          "tests/support/marian_runs.py), and tests/test_importing.py and "
          "tests/test_importing_marian.py resolve hub names from a cache they fill",
    "torchrun": "several training processes: tests/training/test_multiprocess.py launches "
                "them (2 gloo processes on loopback) and checks their weights",
}

TINY = {  # appended to every `train` command of the manual
    "configs/multi30k_de_en.yaml": [
        "data.train_limit=300", "data.val_limit=20", "data.vocab_size=300",
        "data.tokens_per_batch=1024", "model.num_layers=1", "model.d_model=32",
        "model.num_heads=4", "model.d_ff=64", "model.max_length=48", "data.max_length=48",
        "train.max_steps=2", "train.epochs=1", "train.eval_max_sentences=4",
        "train.decode_max_length=8", "train.samples=1", "train.verbose=0",
        "train.time_budget=2m"],
    "configs/shakespeare_gpt.yaml": [
        "model.num_layers=1", "model.d_model=32", "model.num_heads=2", "model.d_ff=64",
        "data.steps_per_epoch=2", "train.max_steps=2", "train.epochs=1", "train.samples=1",
        "train.verbose=0", "train.time_budget=2m"],
    "configs/finetune_gpt2_shakespeare.yaml": [  # gpt2: the scratch folder's tiny GPT-2
        "data.block_size=16", "data.batch_size=2", "data.steps_per_epoch=4", "train.epochs=1",
        "train.accumulate_steps=2", "train.decode_max_length=8", "train.verbose=0",
        "train.time_budget=2m"],
    "configs/finetune_opus_mt.yaml": [  # no OPUS-MT here: the README's translation run
        "model.pretrained=runs/small", "data.max_length=48", "data.tokens_per_batch=256",
        "train.max_steps=2", "train.epochs=1", "train.checkpoint_every=1",
        "train.bleu_max_sentences=4", "train.decode_max_length=8", "train.samples=1",
        "train.verbose=0", "train.time_budget=2m"],
    "configs/text_classifier.yaml": [
        "model.num_layers=1", "model.d_model=32", "model.num_heads=2", "model.d_ff=64",
        "data.vocab_size=200", "data.batch_size=4", "train.epochs=2", "train.verbose=0",
        "train.time_budget=2m"],
}
REVIEWS = ["What a great little film.\tpositive", "Dull and far too long.\tnegative",
           "I loved every minute of it.\tpositive", "A waste of two hours.\tnegative",
           "The cast is wonderful.\tpositive", "Nothing happens, slowly.\tnegative"]
SENTENCES = {"sentences.de": "Ein Hund läuft.\nZwei Männer spielen Fußball.\n",
             "sentences.en": "A dog runs.\nTwo men play soccer.\n",
             # the text classifier's files (configs/text_classifier.yaml reads data/*.tsv)
             "data/train.tsv": "\n".join(["text\tlabel", *REVIEWS * 4]) + "\n",
             "data/val.tsv": "\n".join(["text\tlabel", *REVIEWS]) + "\n",
             "data/test.tsv": "\n".join(["text\tlabel", *REVIEWS]) + "\n",
             # configs/finetune_opus_mt.yaml's pairs
             **{f"data/{split}.de-en.tsv": "Ein Hund läuft.\tA dog runs.\n"
                "Zwei Männer spielen Fußball.\tTwo men play soccer.\n" * 4
                for split in ("train", "val", "test")}}


def test_the_readme_shows_commands_and_code():
    assert len(commands(README)) >= 15 and len(blocks("python", README)) >= 4


def test_every_docs_page_is_run_or_says_why_not():
    """A new docs page is a manual whose blocks run, or is named with its reason."""
    pages = {path.name for path in DOCS.glob("*.md")}
    assert pages == set(MANUAL_PAGES) | set(NOT_MANUAL_PAGES)
    assert not set(MANUAL_PAGES) & set(NOT_MANUAL_PAGES)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    (folder / "configs").symlink_to(ROOT / "configs")
    for name, text in SENTENCES.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    from gpt2_checkpoints import tiny_gpt2
    from marian_runs import marian_folder

    tiny_gpt2(folder / "gpt2")  # what `hf download gpt2 --local-dir gpt2` gives, in small
    marian_folder(folder / "opus-mt-de-en")  # `hf download Helsinki-NLP/opus-mt-de-en ...`
    env = os.environ.copy()
    data = env.get("TRANSFORMERKIT_DATA") or str(ROOT.parent / "shared" / "data")
    env["TRANSFORMERKIT_DATA"] = str(Path(data).resolve())
    return folder, env


def run_command(line, folder, env):
    """Run one command line of the manual in ``folder``: ``transformerkit`` as this
    interpreter's CLI module, tiny settings appended to ``train``; shell redirections kept."""
    words = shlex.split(line)
    if words[0] in NOT_RUN_HERE or " ".join(words[:2]) in NOT_RUN_HERE:
        return None
    assert words[0] == "transformerkit", f"a command of the manual this test cannot run: {line}"
    command = line.replace("transformerkit", f"{shlex.quote(sys.executable)} -m transformerkit.cli",
                           1)
    if "train" in words:
        config = next(w for w in words if w.endswith(".yaml"))
        command += " " + " ".join(f"--set {item}" for item in TINY[config])
    return subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)


def test_every_command_and_python_block_of_the_manual_runs(scratch):
    folder, env = scratch
    ran = {}
    for document in DOCUMENTS:
        name = document.relative_to(ROOT)
        ran[name] = 0
        for line in commands(document):
            result = run_command(line, folder, env)
            if result is None:
                continue
            assert result.returncode == 0, f"{name}: {line}\n{result.stderr[-3000:]}"
            ran[name] += 1
        for number, code in enumerate(blocks("python", document), 1):
            result = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env,
                                    capture_output=True, text=True, timeout=600)
            assert result.returncode == 0, (f"{name}, python block {number}:\n{code}\n"
                                            f"{result.stderr[-3000:]}")
    assert ran[Path("README.md")] >= 15
    assert sum(ran.values()) - ran[Path("README.md")] >= 10  # the docs pages' commands
    assert (folder / "runs" / "small" / "history.png").exists()  # `plot` wrote its figure
    assert (folder / "my.hyp").read_text(encoding="utf-8").count("\n") == 2  # `evaluate --output`
