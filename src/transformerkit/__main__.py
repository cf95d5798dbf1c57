"""``python -m transformerkit ...``: the ``transformerkit`` command (what ``torchrun -m
transformerkit train CONFIG`` starts in each process)."""

import sys

from transformerkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
