"""Every relative link in README.md, CONTRIBUTING.md and docs/ resolves: the file exists, and a #fragment names a
heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def test_the_anchor_rule_matches_github_on_headings_of_these_pages():
    assert anchor("## `anydraft serve`".lstrip("# ")) == "anydraft-serve"
    assert anchor("Where the entry points' defaults differ, and why") == "where-the-entry-points-defaults-differ-and-why"
    assert anchor("Server metrics (`/metrics`)") == "server-metrics-metrics"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert page.is_file(), f"{page} is missing"
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):   # http:, https:, mailto: are not checked here
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: {resolved} does not exist")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{fragment} in {resolved.name}")
    assert not broken, f"{page.name}: broken links:\n" + "\n".join(broken)
