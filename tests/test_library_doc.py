"""docs/library.md's ``Tunables`` section names every field ``Tunables`` has, so a new tunable
cannot ship undocumented (its meaning in words is in docs/contract.md, checked there)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from prompt_outbox import Tunables

DOC = (Path(__file__).resolve().parent.parent / "docs" / "library.md").read_text()


def test_every_tunables_field_is_named_in_its_section() -> None:
    start = DOC.index("### `Tunables`")
    section = DOC[start : DOC.index("\n### ", start + 1)]
    named = set(re.findall(r"`([a-z_]+)", section))
    assert {f.name for f in dataclasses.fields(Tunables)} - named == set()
