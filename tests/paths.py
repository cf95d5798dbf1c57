"""Where the tests find things: their own folder (helpers, probe scripts), the repository,
and the shared data (``$TRANSFORMERKIT_DATA``, else ``../shared/data`` beside the checkout).

The one place these locations are written; tests in any folder of ``tests/`` import them
(``conftest.py`` puts this folder on ``sys.path``).
"""

import os
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent
SHARED_DATA = Path(os.environ.get("TRANSFORMERKIT_DATA")
                   or ROOT.parent / "shared" / "data").resolve()
