"""A path a user takes without its optional package ends in one line naming the extra
(``transformerkit/extras.py``), from the CLI as users run it."""

import sys

import pytest

from transformerkit.extras import EXTRAS, MissingExtra, require


def _block(monkeypatch, package, *importers):
    """Make ``import package`` fail as it does where it is not installed, and the
    ``importers`` (modules that import it on import) import again."""
    for name in list(sys.modules):
        if name in importers or name == package or name.startswith(package + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)


def test_import_without_safetensors_names_the_hf_extra(tmp_path, monkeypatch, capsys):
    from gpt2_checkpoints import tiny_gpt2

    from transformerkit.cli import main

    tiny_gpt2(tmp_path / "hf")
    capsys.readouterr()  # transformers' own lines while saving
    _block(monkeypatch, "safetensors")
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("transformerkit import: error: reading a Hugging Face checkpoint's "
                   "weights needs the safetensors package, which is not installed "
                   "(pip install \"keras-transformerkit[hf]\")")
    assert not (tmp_path / "run").exists()


def test_export_without_ctranslate2_names_its_extra(tmp_path, monkeypatch, capsys):
    from transformerkit.cli import main

    _block(monkeypatch, "ctranslate2", "transformerkit.export.ctranslate2",
           "transformerkit.export.runtime")
    code = main(["export", str(tmp_path / "run"), "--format", "ctranslate2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.endswith("needs the ctranslate2 package, which is not installed "
                        "(pip install \"keras-transformerkit[ctranslate2]\")")


def test_serve_without_fastapi_names_the_serve_extra(tmp_path, monkeypatch, capsys):
    from transformerkit.cli import main

    _block(monkeypatch, "fastapi")
    assert main(["serve", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("transformerkit serve: error: transformerkit serve needs the fastapi "
                   "package, which is not installed (pip install \"keras-transformerkit[serve]\")")


def test_require_names_only_absent_optional_packages(monkeypatch):
    assert require("json", "anything").dumps(1) == "1"  # not optional, present
    _block(monkeypatch, "pydot")
    with pytest.raises(MissingExtra, match=r"keras-transformerkit\[diagram\]"):
        require("pydot", "summary --plot")
    assert issubclass(MissingExtra, ImportError)

    def broken_import(name, *args, **kwargs):
        raise ImportError("libfoo.so: cannot open shared object file", name="libfoo")

    # a package that is installed but fails to import: its own error shows
    monkeypatch.setattr("importlib.import_module", broken_import)
    with pytest.raises(ImportError, match="libfoo") as caught:
        require("ctranslate2", "the CTranslate2 engine")
    assert not isinstance(caught.value, MissingExtra)


def test_every_extra_is_declared_in_pyproject():
    import tomllib
    from paths import ROOT

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert set(EXTRAS.values()) <= set(declared)


def test_ted_talks_without_tensorflow_datasets_name_the_tfds_extra(monkeypatch):
    from transformerkit.data.corpora import load_ted_hrlr

    _block(monkeypatch, "tensorflow_datasets")
    with pytest.raises(MissingExtra, match=r"load_ted_hrlr .* needs the tensorflow_datasets "
                                           r"package.*keras-transformerkit\[tfds\]"):
        load_ted_hrlr("train", "pt_to_en")


def test_training_without_tensorboard_names_the_extra_that_installs_it(monkeypatch, caplog):
    import importlib.util

    from transformerkit.training import trainer

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard"
                        else real_find_spec(name, *a))
    with caplog.at_level("INFO", logger=trainer.log.name):
        assert trainer._tensorboard(run=None) == []
    assert 'pip install "keras-transformerkit[torch]"' in caplog.text


def test_a_slow_tokenizer_folder_without_transformers_names_the_hf_extra(tmp_path,
                                                                          monkeypatch):
    from transformerkit.data.tokenizers import load_hf_tokenizer

    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")  # no tokenizer.json
    _block(monkeypatch, "transformers")
    with pytest.raises(MissingExtra, match=r"has no tokenizer\.json: converting its slow "
                                           r"tokenizer needs the transformers package.*"
                                           r"keras-transformerkit\[hf\]"):
        load_hf_tokenizer(tmp_path)
