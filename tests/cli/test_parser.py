"""The command line itself (``transformerkit.cli``): options and positional arguments in any
order for every command, ``--version``, and ``transformerkit config``.

The commands run in this process through ``cli.main`` on two tiny runs trained once per
module by ``transformerkit train`` itself (a number-words Transformer and a character GPT
on the corpus of ``tests/support/tiny_run.py``: seconds, no shared data). What the commands
compute is tested in ``tests/test_api.py``; here each one must give the same result
whatever the order of its arguments.
"""

import importlib.metadata
import re
import warnings

import pytest
import yaml
from tiny_run import tiny_config, write_corpus

import transformerkit
from transformerkit import cli
from transformerkit.config import describe, load_config, save_config, schema

TEXT = "ein zwei drei"


@pytest.fixture(autouse=True)
def _process_default_malloc(monkeypatch):
    """The heavy commands would tune this process's malloc (transformerkit.allocator)."""
    monkeypatch.setenv("TRANSFORMERKIT_MALLOC", "system")


def run_cli(capsys, *args):
    """``cli.main(args)``: ``(exit status, stdout)``; an error's message must name the
    command."""
    capsys.readouterr()
    status = cli.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    assert status == 0, err[-3000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{"translation": dir, "gpt": dir, "config": yaml, "folder": dir}``: trained with the
    options of ``train`` before (translation) and after (GPT) its config argument."""
    folder = tmp_path_factory.mktemp("cli_runs")
    config = folder / "tiny.yaml"
    save_config(tiny_config(folder), config)
    text, _ = write_corpus(folder, pairs=200)  # the GPT's text: English number words
    gpt = folder / "gpt.yaml"
    gpt.write_text(
        "model: {type: gpt, num_layers: 1, d_model: 16, num_heads: 2, d_ff: 32, max_length: 16,"
        " dropout: 0.0}\n"
        f"data: {{dataset: text, text: '{text}', tokenizer: char, block_size: 8, batch_size: 4,"
        " steps_per_epoch: 2}\n"
        "train: {epochs: 1, learning_rate: 0.003, samples: 0, verbose: 0}\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRANSFORMERKIT_MALLOC", "system")
        assert cli.main(["train", "--set", "train.max_steps=2", "--out", str(folder / "tr"),
                         str(config), "--set", "train.epochs=1"]) == 0
        assert cli.main(["train", str(gpt), "--out", str(folder / "gpt"), "--set",
                         "train.max_steps=2"]) == 0
    return {"translation": folder / "tr", "gpt": folder / "gpt", "config": config,
            "folder": folder}


# -- parsing: every command, options before and after its positional arguments ---------------

ORDERS = {  # command -> argument lists that must parse to the same namespace
    "train": [["train", "c.yaml", "--out", "o", "--set", "a.b=1", "--resume"],
              ["train", "--out", "o", "--set", "a.b=1", "--resume", "c.yaml"],
              ["train", "--set", "a.b=1", "c.yaml", "--resume", "--out", "o"]],
    "summary": [["summary", "c.yaml", "--vocab-size", "30", "--set", "a.b=1", "--plot", "m.dot"],
                ["summary", "--vocab-size", "30", "--plot", "m.dot", "--set", "a.b=1", "c.yaml"]],
    "config": [["config", "c.yaml", "--set", "a.b=1", "--set", "a.c=2"],
               ["config", "--set", "a.b=1", "--set", "a.c=2", "c.yaml"],
               ["config", "--set", "a.b=1", "c.yaml", "--set", "a.c=2"]],
    "translate": [["translate", "R", "t1", "t2", "--beam", "2", "--n-best", "2"],
                  ["translate", "R", "--beam", "2", "--n-best", "2", "t1", "t2"],
                  ["translate", "--beam", "2", "R", "t1", "--n-best", "2", "t2"],
                  ["translate", "--n-best", "2", "--beam", "2", "R", "--", "t1", "t2"]],
    "generate": [["generate", "R", "--prompt", "p", "--seed", "1"],
                 ["generate", "--prompt", "p", "--seed", "1", "R"]],
    "evaluate": [["evaluate", "R", "--source", "s", "--reference", "r", "--beam", "1"],
                 ["evaluate", "--source", "s", "--reference", "r", "--beam", "1", "R"],
                 ["evaluate", "--source", "s", "R", "--reference", "r", "--beam", "1"]],
    "attention": [["attention", "R", "src", "--out", "a.png", "--layer", "0"],
                  ["attention", "--out", "a.png", "--layer", "0", "R", "src"],
                  ["attention", "R", "--out", "a.png", "src", "--layer", "0"]],
    "plot": [["plot", "R", "--lr", "--out", "p.png"], ["plot", "--out", "p.png", "R", "--lr"]],
    "export": [["export", "R", "--quantization", "int8", "--out", "d"],
               ["export", "--quantization", "int8", "R", "--out", "d"]],
    "average": [["average", "R", "--last", "3", "--out", "a.keras"],
                ["average", "--last", "3", "--out", "a.keras", "R"]],
    "classify": [["classify", "R", "t1", "t2", "--probabilities", "--batch-size", "8"],
                 ["classify", "--probabilities", "R", "t1", "--batch-size", "8", "t2"]],
    "embed": [["embed", "R", "--pooling", "cls", "--out", "e.npy", "--normalize"],
              ["embed", "--pooling", "cls", "--normalize", "R", "--out", "e.npy"]],
    "serve": [["serve", "R1", "R2", "--port", "8001", "--engine", "keras"],
              ["serve", "--port", "8001", "R1", "R2", "--engine", "keras"],
              ["serve", "--port", "8001", "--engine", "keras", "R1", "R2"]],
    "import": [["import", "gpt2", "--out", "runs/gpt2", "--force"],
               ["import", "--out", "runs/gpt2", "gpt2", "--force"],
               ["import", "--force", "--out", "runs/gpt2", "gpt2"]],
}


def test_every_command_is_tested_here():
    usage = cli.build_parser().format_usage()  # "usage: transformerkit [...] {train,...} ..."
    assert set(ORDERS) == set(re.search(r"\{(train,[^}]*)\}", usage).group(1).split(","))


@pytest.mark.parametrize("command", ORDERS)
def test_options_and_positionals_in_any_order(command):
    parser = cli.build_parser()
    first, *others = [vars(parser.parse_args(argv)) for argv in ORDERS[command]]
    assert first["command"] == command
    assert all(other == first for other in others)


def test_translate_texts_may_follow_options():
    args = cli.build_parser().parse_args(["translate", "R", "--n-best", "3",
                                     "Zwei Männer spielen Fußball."])
    assert (args.run_dir, args.texts, args.n_best) == ("R", ["Zwei Männer spielen Fußball."], 3)
    assert not hasattr(args, "beam_size")  # not given: the run's search section decides
    assert cli.build_parser().parse_args(["translate", "--beam", "1", "R"]).texts == []  # stdin


def test_backend_before_or_after_the_command():
    parser = cli.build_parser()
    assert parser.parse_args(["translate", "R"]).backend is None
    assert parser.parse_args(["--backend", "jax", "translate", "R", "x"]).backend == "jax"
    assert parser.parse_args(["translate", "R", "x", "--backend", "jax"]).backend == "jax"
    assert parser.parse_args(["plot", "--backend", "tensorflow", "R"]).backend == "tensorflow"


@pytest.mark.parametrize("argv, message", [
    (["translate", "R", "--bogus", "x"], "transformerkit translate: error: unrecognized "
                                         "arguments: --bogus"),
    (["translate"], "the following arguments are required: run_dir\n"),
    (["generate", "R"], "the following arguments are required: --prompt"),
    (["evaluate", "R", "--split", "val", "--source", "s"], "not allowed with argument"),
    (["train", "c.yaml", "--set", "data.source_lang=en", "data.target_lang=cs", "x"],
     "unrecognized arguments: data.target_lang=cs x; each override takes its own --set: "
     "--set data.target_lang=cs\n"),
    (["config", "c.yaml", "--set", "a.b=1", "a.c=2"], "--set a.c=2\n"),
])
def test_usage_errors_name_the_command(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: transformerkit {argv[0]}" in err and message in err


# -- the commands on tiny runs ----------------------------------------------------------------

def test_translate_in_any_order(runs, capsys):
    run = runs["translation"]
    common = ["--beam", "2", "--max-new-tokens", "6"]
    after = run_cli(capsys, "translate", run, TEXT, "vier", *common)
    assert len(after.splitlines()) == 2
    assert run_cli(capsys, "translate", run, *common, TEXT, "vier") == after
    assert run_cli(capsys, "translate", *common, run, TEXT, "vier") == after
    n_best = run_cli(capsys, "translate", run, "--n-best", "3", "--max-new-tokens", "6", TEXT)
    lines = [line.split("\t") for line in n_best.splitlines()]
    assert [line[0] for line in lines] == ["0", "0", "0"]
    assert run_cli(capsys, "translate", run, TEXT, "--n-best", "3", "--max-new-tokens",
                   "6") == n_best


def test_generate_in_any_order(runs, capsys):
    options = ["--prompt", "one", "--max-new-tokens", "8", "--seed", "3"]
    after = run_cli(capsys, "generate", runs["gpt"], *options)
    assert after.startswith("one")
    assert run_cli(capsys, "generate", *options, runs["gpt"]) == after


def test_summary_in_any_order(runs, capsys):
    after = run_cli(capsys, "summary", runs["config"], "--vocab-size", "30", "--set",
                    "model.num_layers=2")
    assert after.startswith("Transformer")
    assert run_cli(capsys, "summary", "--set", "model.num_layers=2", "--vocab-size", "30",
                   runs["config"]) == after
    assert run_cli(capsys, "summary", runs["translation"]).startswith("Transformer")


def test_evaluate_in_any_order(runs, capsys, tmp_path):
    source, reference = write_corpus(tmp_path, pairs=4, seed=5)
    options = ["--source", source, "--reference", reference, "--beam", "1",
               "--max-new-tokens", "6"]
    after = run_cli(capsys, "evaluate", runs["translation"], *options, "--output",
                    tmp_path / "after.txt")
    assert "4 sentences, beam 1" in after and "BLEU = " in after
    before = run_cli(capsys, "evaluate", *options, "--output", tmp_path / "before.txt",
                     runs["translation"])
    assert before == after
    assert (tmp_path / "before.txt").read_text() == (tmp_path / "after.txt").read_text()


def test_attention_and_plot_in_any_order(runs, capsys, tmp_path):
    run = runs["translation"]
    for number, argv in enumerate([[run, TEXT, "--out", "{}", "--layer", "0"],
                                   ["--out", "{}", "--layer", "0", run, TEXT],
                                   [run, "--out", "{}", TEXT, "--target", "one two"]]):
        out = tmp_path / f"attention{number}.png"
        printed = run_cli(capsys, "attention", *[str(out) if a == "{}" else a for a in argv])
        assert f"wrote {out}" in printed and out.stat().st_size > 0
    for argv in ([run, "--out", tmp_path / "a.png"], ["--out", tmp_path / "b.png", run]):
        assert "wrote" in run_cli(capsys, "plot", *argv)
    assert (tmp_path / "a.png").read_bytes()[:4] == (tmp_path / "b.png").read_bytes()[:4]


def test_train_took_its_options_in_any_order(runs):
    """The fixture trained with options before (translation) and after (GPT) the config."""
    for name in ("translation", "gpt"):
        config = load_config(str(runs[name] / "config.yaml"))
        assert config.train.max_steps == 2
    assert load_config(str(runs["translation"] / "config.yaml")).train.epochs == 1


# -- --version ---------------------------------------------------------------------------------

def version_printed(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


def test_version_is_the_installed_distributions(capsys):
    providers = importlib.metadata.packages_distributions().get("transformerkit", [])
    expected = ({importlib.metadata.version(name) for name in providers}
                or {transformerkit.__version__})
    out = version_printed(capsys)
    assert out.startswith("transformerkit ") and out.endswith("\n")
    assert out.split()[1] in expected and cli.package_version() == out.split()[1]


def test_version_under_any_distribution_name_or_none(capsys, monkeypatch):
    monkeypatch.setattr(importlib.metadata, "packages_distributions",
                        lambda: {"transformerkit": ["some-new-name"]})
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: {"some-new-name": "9.8.7"}[name])
    assert version_printed(capsys) == "transformerkit 9.8.7\n"
    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: {})
    assert version_printed(capsys) == f"transformerkit {transformerkit.__version__}\n"


# -- config -----------------------------------------------------------------------------------

def test_config_prints_a_config_train_reads_back(runs, capsys, tmp_path):
    sets = ["--set", "train.epochs=3", "--set", "model.norm_position=pre"]
    printed = run_cli(capsys, "config", runs["config"], *sets)
    assert run_cli(capsys, "config", *sets, runs["config"]) == printed
    (tmp_path / "printed.yaml").write_text(printed)
    expected = load_config(str(runs["config"]), ["train.epochs=3", "model.norm_position=pre"])
    assert load_config(str(tmp_path / "printed.yaml")) == expected
    assert "train.epochs=3" in printed.splitlines()[0]
    defaults = run_cli(capsys, "config")
    (tmp_path / "defaults.yaml").write_text(defaults)
    assert load_config(str(tmp_path / "defaults.yaml")) == load_config()
    run_config = run_cli(capsys, "config", runs["translation"])  # a run directory
    (tmp_path / "run.yaml").write_text(run_config)
    assert load_config(str(tmp_path / "run.yaml")) == load_config(
        str(runs["translation"] / "config.yaml"))


def test_config_shows_every_key_with_type_default_and_meaning(capsys):
    printed = run_cli(capsys, "config")
    parsed = yaml.safe_load(printed)
    assert list(parsed) == list(schema())
    for section, keys in schema().items():
        assert list(parsed[section]) == list(keys)
        lines = [line for line in printed.splitlines() if line.startswith("  ")]
        for name, key in keys.items():
            line = next(line for line in lines if line.lstrip().startswith(f"{name}: ")
                        and key.help in line)
            comment = line.split("  # ", 1)[1]
            assert "default " in comment and comment.endswith(key.help)
    assert "  d_model: 512" in printed and "# int, default 512: model width" in printed
    assert "# paper | adamw_cosine, default paper: " in printed
    assert "gpt only; bool, default null = the model's (gpt true): " in printed


def test_config_errors_are_one_line(capsys, tmp_path):
    assert cli.main(["config", str(tmp_path / "missing.yaml")]) == 2
    assert cli.main(["config", "--set", "train.epoch=3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("transformerkit config: error: config file not found")
    assert err[1].startswith("transformerkit config: error: config: unknown key train.epoch")
    assert describe() == describe(load_config())


def test_help_points_to_config(capsys):
    for argv in (["train", "--help"], ["--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert "transformerkit config" in capsys.readouterr().out


def test_export_huggingface_refusals_are_one_line(runs, capsys, tmp_path):
    """A translation run with the paper's sinusoidal table (MarianMTModel's is laid out
    another way), and a GPT whose untied output projection has a bias (GPT-2's lm_head has
    none): one line each, naming the option, nothing written."""
    cases = [(runs["translation"], "model.positional='sinusoidal' has no MarianMTModel "
                                   "equivalent"),
             (runs["gpt"], "the output projection has a bias, which GPT-2's lm_head lacks")]
    for run, message in cases:
        assert cli.main(["export", str(run), "--format", "huggingface", "--out",
                         str(tmp_path / "hf")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("transformerkit export: error: ") and message in err
        assert err.count("\n") == 1
    assert not (tmp_path / "hf").exists()


# -- warnings: the library's as one line naming the command -----------------------------------

def test_the_librarys_warnings_are_one_line_naming_the_command(runs, capsys):
    """A text over the model's max_length, a prompt over a GPT's: each warning one line on
    stderr, as the command's errors are, without Python's file, line and source line; the
    setting ends with the command."""
    shown = warnings.showwarning
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert cli.main(["translate", str(runs["translation"]), " ".join([TEXT] * 4), "--beam",
                         "1"]) == 0
        assert cli.main(["generate", str(runs["gpt"]), "--prompt", "one two three four five",
                         "--max-new-tokens", "2", "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert re.fullmatch(
        r"transformerkit translate: warning: text 0 has \d+ tokens, more than the model's "
        r"max_length=40; only the first 39 tokens of each are used to translate\n"
        r"transformerkit generate: warning: prompt 0 has \d+ tokens; the model reads at most "
        r"16, so only its last 15 are used\n", err), err
    assert warnings.showwarning is shown


def test_other_packages_warnings_keep_pythons_form(monkeypatch, capsys):
    """A warning whose place is outside the library goes to the handler that was there
    before the command (here pytest's, which records it)."""

    def command(args):
        warnings.warn("from elsewhere", FutureWarning, stacklevel=1)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "config", command)
    with pytest.warns(FutureWarning, match="from elsewhere") as caught:
        assert cli.main(["config"]) == 0
    assert caught[0].filename == __file__
    assert "warning:" not in capsys.readouterr().err
