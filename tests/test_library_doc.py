"""docs/library.md names everything the library makes public: every name of ``__all__`` in
``prompt_outbox`` and in the submodules the page documents, every public method and attribute
of an ``Outbox`` (with ``outbox.admin``'s and ``outbox.overview``'s), and every field of
``Tunables`` in its section, so nothing public can ship undocumented (what the contract's
methods and tunables mean, in words, is in docs/contract.md, checked there)."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

from prompt_outbox import Outbox, Tunables, connect

DOC = (Path(__file__).resolve().parent.parent / "docs" / "library.md").read_text()
MODULES = [
    "prompt_outbox",
    "prompt_outbox.durability",
    "prompt_outbox.embedded",
    "prompt_outbox.events",
    "prompt_outbox.metrics",
]


def named(doc: str) -> set[str]:
    """Every identifier written in the doc's inline code (fenced blocks left out): a name
    counts only in full, so `LEDGER_STATE_LEDGERED / ADMITTED` names ADMITTED, not
    LEDGER_STATE_ADMITTED."""
    text = re.sub(r"^```.*?^```", "", doc, flags=re.S | re.M)
    spans = re.findall(r"`([^`]+)`", text)
    return {word for span in spans for word in re.findall(r"[A-Za-z_]\w*", span)}


def public(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_every_public_name_of_the_package_is_named() -> None:
    names = named(DOC)
    missing = {m: sorted(set(importlib.import_module(m).__all__) - names) for m in MODULES}
    assert {m: gaps for m, gaps in missing.items() if gaps} == {}


def test_every_public_method_of_the_outbox_is_named() -> None:
    outbox = Outbox(connect("valkey://127.0.0.1:1"))  # never connects: only its names are read
    names = named(DOC)
    assert public(outbox) - names == set()
    # Their methods (an Admin's wiring, store and engine, is not for callers).
    assert public(type(outbox.admin)) - names == set()
    assert public(type(outbox.overview)) - names == set()


def test_a_name_counts_only_in_full() -> None:
    assert named("`LEDGER_STATE_LEDGERED / ADMITTED` and `f(x,\n y)`") == {
        "LEDGER_STATE_LEDGERED",
        "ADMITTED",
        "f",
        "x",
        "y",
    }
    assert "TurnWatcher" not in named("**TurnWatcher** and\n```\nTurnWatcher\n```\n")


def test_every_tunables_field_is_named_in_its_section() -> None:
    start = DOC.index("### `Tunables`")
    section = DOC[start : DOC.index("\n### ", start + 1)]
    named = set(re.findall(r"`([a-z_]+)", section))
    assert {f.name for f in dataclasses.fields(Tunables)} - named == set()
