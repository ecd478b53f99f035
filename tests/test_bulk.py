"""Bulk actions on error entries (the queue page's "retry all" / "dismiss all"), and who the
token is (``GET /v1/me``), against a real Valkey (and the cluster): only error entries change,
a session a delivery holds is skipped and named, never waited for."""

from __future__ import annotations

import asyncio

import pytest

from prompt_outbox import BulkResult, Entry, Outbox, Status
from prompt_outbox.api import TokenTable
from tests.support.entries import error_entry

pytestmark = pytest.mark.cluster_too


async def statuses(outbox: Outbox, ses: str) -> list[str]:
    return [str(e.status) for e in await outbox.list("acme", ses)]


async def seed(outbox: Outbox) -> None:
    for ses in ("s1", "s2", "s3"):
        await outbox.seed_entry_for_test("acme", ses, error_entry(f"{ses}-e1"))
        await outbox.accept("acme", ses, "u", f"{ses}-c", "pending one")
    await outbox.seed_entry_for_test("acme", "s1", error_entry("s1-e2"))


async def test_retry_errors_of_a_session_then_of_the_workspace(outbox: Outbox) -> None:
    await seed(outbox)
    assert await outbox.retry_errors("acme", "s1") == BulkResult(2)
    assert await statuses(outbox, "s1") == ["pending"] * 3
    assert await statuses(outbox, "s2") == ["error", "pending"]
    assert await outbox.retry_errors("acme") == BulkResult(2)  # s2 and s3
    assert [await statuses(outbox, s) for s in ("s2", "s3")] == [["pending"] * 2] * 2
    assert await outbox.retry_errors("acme") == BulkResult(0)
    assert outbox.metrics.retried.labels(reason="operator")._value.get() == 4


async def test_dismiss_errors_removes_only_error_entries(outbox: Outbox) -> None:
    await seed(outbox)
    assert await outbox.dismiss_errors("acme", "s1") == BulkResult(2)
    assert await statuses(outbox, "s1") == ["pending"]
    assert await outbox.dismiss_errors("acme") == BulkResult(2)
    assert [await statuses(outbox, s) for s in ("s2", "s3")] == [["pending"], ["pending"]]


async def test_a_session_a_delivery_holds_is_skipped_and_named(outbox: Outbox) -> None:
    release, sending = asyncio.Event(), asyncio.Event()

    async def held(ws: str, ses: str, entry: Entry) -> None:
        sending.set()
        await release.wait()

    await outbox.accept("acme", "s1", "u", "c1", "in flight")
    await outbox.seed_entry_for_test("acme", "s1", error_entry("e1"))
    await outbox.seed_entry_for_test("acme", "s2", error_entry("e2"))
    delivery = asyncio.create_task(outbox.deliver_once("acme", "s1", held))
    await asyncio.wait_for(sending.wait(), 5)
    assert await outbox.dismiss_errors("acme") == BulkResult(1, ("s1",))
    assert await outbox.retry_errors("acme", "s1") == BulkResult(0, ("s1",))
    release.set()
    await delivery
    assert [e.status for e in await outbox.list("acme", "s1")] == [Status.ERROR]
    assert await outbox.dismiss_errors("acme", "s1") == BulkResult(1)


async def test_the_routes_and_who_am_i(outbox: Outbox) -> None:
    from tests.support.api import ALICE, OPS, serve

    await seed(outbox)
    async for http in serve(outbox):
        bob = {"Authorization": "Bearer bob-token"}
        r = await http.post("/v1/workspaces/acme/sessions/s1/errors/retry", headers=ALICE)
        assert (r.status_code, r.json()) == (200, {"done": 2, "busy": []})
        r = await http.post("/v1/workspaces/acme/errors/dismiss", headers=ALICE)
        assert (r.status_code, r.json()) == (200, {"done": 2, "busy": []})
        r = await http.post("/v1/workspaces/acme/sessions/s1/errors/dismiss", headers=bob)
        assert (r.status_code, r.json()["error"]) == (403, "forbidden")
        r = await http.post("/v1/workspaces/acme/errors/retry")
        assert r.status_code == 401
        me = await http.get("/v1/me", headers=ALICE)
        assert me.json() == {"user": "alice", "admin": False, "workspaces": ["acme"]}
        assert (await http.get("/v1/me", headers=OPS)).json()["admin"] is True
        assert (await http.get("/v1/me")).status_code == 401
    async for http in serve(outbox, TokenTable({}, disabled=True)):
        assert (await http.get("/v1/me")).json() == {"user": "dev", "admin": True, "workspaces": []}
