"""No private jargon in what the repository ships: the issue tracker, the first contract's
nickname and design notes kept outside the repository are not in it, so a newcomer cannot
follow "issue 22", "the seed" or "DESIGN.md §8". Say what a rule is and why, and point to a
page that is here (docs/contract.md, docs/design.md, docs/security.md). An upstream project's
tracker is fine where the line names the project (valkey-py issue 185, redis/redis#13793)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ["src", "docs", "bench", "devtools", "deploy", "examples", "clients", "tests"]
FILES = ["README.md", "CONTRIBUTING.md", "Makefile", "pyproject.toml"]
SUFFIXES = {".py", ".md", ".ts", ".mjs", ".js", ".lua", ".sh", ".yaml", ".yml", ".toml", ".html"}
SKIP = {"node_modules", "dist", "static", "__pycache__", ".venv", ".cache"}

JARGON = re.compile(
    r"\bissues? #?\(?\d"  # our tracker: "issue 22", "issues 10-14", "issue (13)"
    r"|\bthis issue\b"
    r"|\bthe seed\b|\bseed's\b"  # the first contract's nickname: docs/contract.md
    r"|(?-i:\bDESIGN\.md\b)"  # design notes outside the repository: docs/design.md
    r"|\bred-team hole\b|\bholes? \d",  # docs/security.md names each by what got through
    flags=re.I,
)
# "#22" in prose (Markdown and Python; a stylesheet's "#333" is no reference)
TRACKER_REF = re.compile(r"(?<![\w&/#-])#\d{1,4}\b")
UPSTREAM = re.compile(r"valkey-py|redis/redis|valkey-io/")


def jargon(text: str, *, prose: bool) -> list[str]:
    """Each line of ``text`` that uses a private reference, stripped."""
    found = []
    for line in text.splitlines():
        if UPSTREAM.search(line):
            continue
        if JARGON.search(line) or (prose and TRACKER_REF.search(line)):
            found.append(line.strip())
    return found


def shipped() -> list[Path]:
    paths = [ROOT / f for f in FILES]
    for top in TOP:
        for path in sorted((ROOT / top).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if path.is_file() and path.suffix in SUFFIXES and not parts & SKIP:
                paths.append(path)
    return paths


def test_no_private_reference_in_the_repository() -> None:
    found = {}
    for path in shipped():
        name = path.relative_to(ROOT).as_posix()
        if path == Path(__file__).resolve():
            continue
        prose = path.suffix in {".md", ".py"}
        if hits := jargon(path.read_text(errors="replace"), prose=prose):
            found[name] = hits
    assert found == {}


def test_the_check_finds_each_kind_and_spares_upstream_trackers() -> None:
    caught = [
        "before issue 22: 64 -> 371 MB",
        "(issues 10-14)",
        "left for the client-side issue (13)",
        "before this issue: 19.6x",
        "what the seed says",
        "the seed's knobs",
        "(DESIGN.md §8)",
        "red-team hole 1",
        "(hole 6: pieces stayed)",
        "fixed in #22",
    ]
    for line in caught:
        assert jargon(line, prose=True) == [line], line
    spared = [
        "valkey-py issue 185: connections closed under a pipeline",
        "the bug Redis fixed in redis/redis#13793",
        "docs/design.md, Turns",
        "seed_entry_for_test appends a raw entry",
        "[Tunables](library.md#tunables), &#39;",
        "# 1. a numbered comment",
    ]
    assert [line for line in spared if jargon(line, prose=True)] == []
