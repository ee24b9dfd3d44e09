"""Every relative link in the README, the contributor pages and the docs leads to a file of the repository (and,
with a #fragment, to a heading of that page): a reader never meets a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT

PAGES = sorted({ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md",
                *(ROOT / "docs").glob("*.md")})
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
"""A Markdown link's target (images and reference-style links are not used)."""


def anchors(page: Path) -> set[str]:
    """The fragments a page's headings answer to, as GitHub and mkdocs make them: lower case, punctuation but hyphens
    and underscores dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no links in code blocks
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    dead = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            dead.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            dead.append(f"{target}: no such heading")
    assert dead == [], dead


def test_the_link_check_finds_a_dead_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nSee [there](missing.md), [here](#title), [nowhere](#nope) and [out](https://x.org).\n")
    assert links(page) == ["missing.md", "#title", "#nope"]
    assert anchors(page) == {"title"}
