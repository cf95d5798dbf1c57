"""``python -m transformerkit.cli ...``: the ``transformerkit`` command."""

import sys

from transformerkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
