"""Every link between the manual's pages (README.md, docs/*.md) reaches a file that exists
and, with a ``#fragment``, a heading of that file (GitHub's anchors)."""

import re

import pytest
from paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchor(heading):
    """GitHub's anchor of a heading: lower-cased, punctuation but ``-`` and ``_`` dropped,
    spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_anchor_follows_github():
    assert anchor("The compiled step (`bench/decode_precision.py --systems`, "
                  "`bench/compiled_step.py`)") == (
        "the-compiled-step-benchdecode_precisionpy---systems-benchcompiled_steppy")
    assert anchor("Multi30k de→en in one hour") == "multi30k-deen-in-one-hour"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_between_pages_reach_their_file_and_heading(page):
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(target)
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"
