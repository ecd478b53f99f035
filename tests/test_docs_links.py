"""Every relative link in README.md, CONTRIBUTING.md, docs/*.md and the clients' READMEs names a
file and, with a ``#fragment``, a heading of that file (GitHub's anchors), so moving text between
pages cannot leave a link dangling."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "clients").glob("*/README.md")),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _outside_code(text: str) -> str:
    """The text without fenced blocks and inline code (a link inside code is an example)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but ``-`` and ``_`` dropped, spaces
    as ``-``; a repeated heading gets ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    found = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(_outside_code(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...: not ours to check
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no such heading")
    return broken


def test_every_relative_link_in_the_docs_resolves() -> None:
    broken = {p.relative_to(ROOT).as_posix(): b for p in PAGES if (b := broken_links(p))}
    assert broken == {}


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## A `code` heading: yes\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-code-heading-yes) [ok](#here) [web](https://example.org/x)\n"
        "[gone](missing.md) [bad](other.md#nope) `[in code](nowhere.md)`\n\n## Here\n"
    )
    assert broken_links(page) == ["missing.md: no such file", "other.md#nope: no such heading"]
