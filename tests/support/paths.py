"""Where the tests find things: the helpers and probe scripts (``tests/support``, this
folder), the tests, the repository, and the shared data (``$TRANSFORMERKIT_DATA``, else
``../shared/data`` beside the checkout).

The one place these locations are written; tests in any folder of ``tests/`` import them
(``tests/conftest.py`` puts this folder on ``sys.path``).
"""

import importlib.util
import os
from pathlib import Path

SUPPORT_DIR = Path(__file__).resolve().parent
TESTS_DIR = SUPPORT_DIR.parent
ROOT = TESTS_DIR.parent
SHARED_DATA = Path(os.environ.get("TRANSFORMERKIT_DATA")
                   or ROOT.parent / "shared" / "data").resolve()


def load_bench(name):
    """The script ``bench/NAME.py`` as a module (its functions, without running it)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
