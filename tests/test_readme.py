"""Every command block of the README runs: the README cannot drift from the code.

The ``bash`` blocks run first, in order, in a scratch folder (``configs/`` linked in, two
small text files beside it); each ``transformerkit train`` gets tiny model and data
settings appended (later ``--set`` options win), so the README's runs (``runs/small``,
``runs/gpt``, ...) exist in seconds. Then every ``python`` block runs in a fresh process in
the same folder. Only the lines in :data:`NOT_RUN_HERE` are left out, each with its reason;
any other command the README shows must be a ``transformerkit`` command that exits 0.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# Commands shown in the README that this test does not run, and why.
NOT_RUN_HERE = {
    "make": "the Makefile's targets: `make test` is this suite itself (CI runs it), `make demo` "
            "trains for 10 minutes",
    "pip": "installing the package: tests/test_install.py builds and installs it",
    "transformerkit serve": "a server runs until stopped: tests/test_page.py starts it and "
                            "drives its page, tests/test_serving.py tests its API in-process",
    "curl": "requests to a running `transformerkit serve`: tests/test_serving.py sends the "
            "README's requests to its API",
    "env": "several JAX processes (each started with KERAS_DISTRIBUTION_* variables): "
           "tests/test_jax_processes.py launches 2 on loopback and checks their weights",
    "torchrun": "several training processes: tests/test_multiprocess.py launches them (2 gloo "
                "processes on loopback) and checks their weights",
}

TINY = {  # appended to every `train` command of the README
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
             "data/test.tsv": "\n".join(["text\tlabel", *REVIEWS]) + "\n"}


def blocks(language):
    """The README's fenced code blocks in ``language``, in order."""
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def commands():
    """The commands of the ``bash`` blocks: continuation lines joined, comments dropped."""
    found = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                found.append(line.split(" #")[0].strip())
    return found


def test_the_readme_shows_commands_and_code():
    assert len(commands()) >= 15 and len(blocks("python")) >= 4


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    (folder / "configs").symlink_to(ROOT / "configs")
    for name, text in SENTENCES.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    env = os.environ.copy()
    data = env.get("TRANSFORMERKIT_DATA") or str(ROOT.parent / "shared" / "data")
    env["TRANSFORMERKIT_DATA"] = str(Path(data).resolve())
    return folder, env


def run_command(line, folder, env):
    """Run one README command line in ``folder``: ``transformerkit`` as this interpreter's
    CLI module, tiny settings appended to ``train``; shell redirections kept."""
    words = shlex.split(line)
    if words[0] in NOT_RUN_HERE or " ".join(words[:2]) in NOT_RUN_HERE:
        return None
    assert words[0] == "transformerkit", f"a README command this test cannot run: {line}"
    command = line.replace("transformerkit", f"{shlex.quote(sys.executable)} -m transformerkit.cli",
                           1)
    if "train" in words:
        config = next(w for w in words if w.endswith(".yaml"))
        command += " " + " ".join(f"--set {item}" for item in TINY[config])
    return subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)


def test_every_readme_command_and_python_block_runs(scratch):
    folder, env = scratch
    ran = 0
    for line in commands():
        result = run_command(line, folder, env)
        if result is None:
            continue
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
        ran += 1
    assert ran >= 15
    for number, code in enumerate(blocks("python"), 1):
        result = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"python block {number}:\n{code}\n{result.stderr[-3000:]}"
    assert (folder / "runs" / "small" / "history.png").exists()  # `plot` wrote its figure
    assert (folder / "my.hyp").read_text(encoding="utf-8").count("\n") == 2  # `evaluate --output`
