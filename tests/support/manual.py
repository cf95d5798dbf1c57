"""The user manual as the tests read it: README.md and the docs pages that are manuals, and
the code blocks and commands they show (``tests/test_readme.py`` runs them; the serving
tests check the requests and metrics the pages show)."""

import re
import shlex

from paths import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# The docs pages that are user manuals, in the order their blocks run (after the README's,
# whose runs they use).
MANUAL_PAGES = ["cli.md", "decoding.md", "serving.md", "models.md", "training.md",
                "encoders.md", "data.md", "pretrained.md"]
DOCUMENTS = [README, *(DOCS / name for name in MANUAL_PAGES)]


def blocks(language, document=None):
    """The fenced code blocks in ``language`` of ``document`` (default: every document of the
    manual, README.md first), in order."""
    found = []
    for path in [document] if document else DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        found += re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)
    return found


def commands(document=None):
    """The commands of the ``bash`` blocks of ``document`` (default: every document):
    continuation lines joined, comments dropped."""
    found = []
    for block in blocks("bash", document):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                found.append(line.split(" #")[0].strip())
    return found
