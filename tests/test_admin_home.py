"""Operator actions have one home, ``Outbox.admin``: the ``Outbox`` methods of the same names
are aliases of its methods (the same bound methods, docstrings and results), not copies."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest

from prompt_outbox import DismissResult, EditResult, Entry, Outbox, RetryResult, Status
from prompt_outbox.admin import Admin

ACTIONS = [
    "retry",
    "edit",
    "dismiss",
    "park_workspace",
    "unpark_workspace",
    "sweep_workspace_unverifiable",
    "sweep_workspace_parked_errors",
    "retry_errors",
    "dismiss_errors",
    "cleanup_workspace",
    "count_by_workspace",
    "count_by_status",
]


def error_entry(entry_id: str) -> str:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    return Entry(entry_id, entry_id, "u", "t", at, status=Status.ERROR, attempts=5).to_json()


@pytest.mark.parametrize("name", ACTIONS)
def test_each_alias_is_the_admin_method(outbox: Outbox, name: str) -> None:
    alias, real = getattr(outbox, name), getattr(outbox.admin, name)
    assert alias == real  # the same function, bound to the same Admin
    assert alias.__func__ is getattr(Admin, name)
    assert inspect.signature(alias) == inspect.signature(real)
    doc = getattr(Admin, name).__doc__
    assert doc and getattr(Outbox, name).__doc__ == doc  # written once, in admin.py


async def test_aliases_and_admin_act_on_the_same_entries(outbox: Outbox) -> None:
    for entry_id in ("e1", "e2"):
        await outbox.seed_entry_for_test("acme", "s1", error_entry(entry_id))
    assert await outbox.retry("acme", "s1", "e1") is RetryResult.UPDATED
    assert await outbox.admin.retry("acme", "s1", "e1") is RetryResult.NOT_FOUND  # pending now
    assert await outbox.edit("acme", "s1", "e2", text="new") is EditResult.UPDATED
    with pytest.raises(TypeError):  # text and model stay keyword-only, as they were
        await outbox.admin.edit("acme", "s1", "e2", "positional")  # type: ignore[call-arg]
    # Reached on the class, unbound, as the CLI does.
    assert await Outbox.dismiss(outbox, "acme", "s1", "e2") is DismissResult.REMOVED
    assert await outbox.admin.dismiss("acme", "s1", "e2") is DismissResult.NOT_FOUND
    assert await outbox.count_by_status() == await outbox.admin.count_by_status() == {"pending": 1}


def test_the_class_shows_each_alias_as_its_admin_method() -> None:
    for name in ACTIONS:
        alias, real = getattr(Outbox, name), getattr(Admin, name)
        assert inspect.signature(alias) == inspect.signature(real)  # help(Outbox) reads both
