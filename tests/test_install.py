"""Installing the package as a user would: build the wheel, install it into a fresh venv,
run the ``transformerkit`` command and import the package from there.

The venv reuses this environment's dependencies (a ``.pth`` file naming this environment's
site-packages; ``--system-site-packages`` would see the base Python, not a parent venv), and
the wheel goes in with ``--no-deps``: what is tested is the wheel (its files, metadata and
console script), offline and in well under a minute.
"""

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "keras-transformerkit"


def run(args, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env,
                            timeout=300, **kwargs)
    assert result.returncode == 0, f"{args}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel, built by setuptools' PEP 517 backend from a copy of the sources (the
    working tree gets no build/ or egg-info), with every warning shown."""
    pytest.importorskip("setuptools.build_meta")
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    result = run([sys.executable, "-W", "always", "-c",
                  "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))",
                  out], cwd=source)
    # e.g. a deprecated pyproject table (PYTHONDONTWRITEBYTECODE's notes are no warnings)
    warnings = [line for line in (result.stdout + result.stderr).splitlines()
                if ("warn" in line.lower() or "deprecat" in line.lower())
                and "byte-compiling is disabled" not in line]
    assert not warnings, "\n".join(warnings)
    return out / result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel):
    path = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", "--without-pip", path])
    python = path / "bin" / "python"
    venv_site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                     .stdout.strip())
    (venv_site / "_parent_environment.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
         "--no-index", "--disable-pip-version-check", wheel])
    return path, venv_site


def test_wheel_metadata(wheel):
    assert wheel.name.startswith("keras_transformerkit-")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert f"Name: {DISTRIBUTION}\n" in metadata
    assert "License-Expression: MIT\n" in metadata
    assert "transformerkit = transformerkit.cli:main" in entry_points
    assert "transformerkit/training/tensorboard.py" in names
    assert not [n for n in names if n.startswith("tests/")]


def test_command_and_import_from_the_venv(venv):
    path, venv_site = venv
    help_text = run([path / "bin" / "transformerkit", "--help"]).stdout
    assert "train" in help_text and "translate" in help_text
    code = ("import importlib.metadata as m, transformerkit, transformerkit.training.trainer\n"
            f"print(transformerkit.__file__); print(m.version({DISTRIBUTION!r}))\n"
            "print(transformerkit.__version__)")
    file, version, own_version = run([path / "bin" / "python", "-c", code],
                                     cwd=path).stdout.split()
    assert Path(file).is_relative_to(venv_site)  # the wheel's copy, not the checkout's src/
    assert version == own_version
