"""docs/contract.md names everything the contract covers: every Tunables field, every Status
value and every public Outbox method, each in backticks, so a new one cannot go undocumented."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from prompt_outbox.core.entry import Status
from prompt_outbox.core.settings import Tunables
from prompt_outbox.outbox import Outbox

CONTRACT = Path(__file__).resolve().parent.parent / "docs" / "contract.md"


def _named() -> set[str]:
    """Every word written in backticks in the contract (``Outbox.x`` counts as ``x`` too)."""
    words = set(re.findall(r"`([^`]+)`", CONTRACT.read_text(encoding="utf-8")))
    return words | {w.removeprefix("Outbox.") for w in words}


def _missing(names: list[str]) -> list[str]:
    named = _named()
    return [n for n in names if n not in named]


def test_every_tunable_is_in_the_contract() -> None:
    assert _missing([f.name for f in dataclasses.fields(Tunables)]) == []


def test_every_status_is_in_the_contract() -> None:
    assert _missing([s.value for s in Status]) == []


def test_every_public_outbox_method_is_in_the_contract() -> None:
    public = [n for n, _ in inspect.getmembers(Outbox) if not n.startswith("_")]
    assert public, "Outbox has no public names: the check would pass on nothing"
    assert _missing(public) == []
