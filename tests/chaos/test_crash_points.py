"""Scenario 3: crash the worker at every named point between Valkey calls (a subprocess that
``os._exit``s there), then recover with a fresh worker and check the invariant: every entry
still exists until it is delivered, and none is delivered more than twice (with the truthful
verifier used here: exactly once); and OnDelivered is made for every delivered entry, once
(twice only when the crash came after the hook ran, before its record was cleared). Prints a
table of crash point -> outcome."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Entry, Outbox, RetryResult, Status, ambiguous
from prompt_outbox.core.failpoints import CRASH_EXIT_CODE, CrashPoint
from prompt_outbox.embedded import EmbeddedValkey
from tests.chaos import report
from tests.chaos.crash_proc import SES, WS, file_agent, hook_log, transcript, truthful
from tests.chaos.harness import ROOT
from tests.chaos.settings import CRASH_TUNABLES
from tests.support.waiting import eventually

# point -> (how the entries are set up, what the crashing process does)
PLAN = {
    "after-acquire": ("pending", "run-ok"),
    "after-stage": ("pending", "run-ok"),
    "after-deliver": ("pending", "run-ok"),
    # Two queued: the claim also leases the next head (the drain's next step) before the crash.
    "after-complete": ("backlog", "run-ok"),
    "after-hook": ("pending", "run-ok"),
    "after-restore": ("pending", "run-fail"),
    "after-verify": ("pending", "run-ambiguous-once"),
    "after-requeue": ("staged", "run-ok"),
    "retry-before-write": ("error", "retry"),
    "dismiss-before-write": ("pending", "dismiss"),
    "park-between-sessions": ("two-sessions", "park"),
    "sweep-after-probe": ("unverifiable", "sweep"),
}


def crash(point: str, action: str, url: str, agent_dir: Path, arg: str = "") -> int:
    env = {**os.environ, "PROMPT_OUTBOX_CRASH_AT": point}
    argv = [sys.executable, "-m", "tests.chaos.crash_proc", action, url, str(agent_dir), arg]
    return subprocess.run(argv, cwd=ROOT, env=env, timeout=60, stderr=subprocess.DEVNULL).returncode


async def make_error(outbox: Outbox, agent_dir: Path) -> str:
    entry = await outbox.accept(WS, SES, "u", "c-err", "this one failed")
    failing = file_agent(agent_dir, "fail")
    while (await outbox.list(WS, SES))[0].status is not Status.ERROR:
        await outbox.deliver_once(WS, SES, failing)
        await asyncio.sleep(CRASH_TUNABLES.max_backoff)
    return entry.id


def test_every_crash_point_is_planned() -> None:
    assert set(PLAN) == {str(p) for p in CrashPoint}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", list(PLAN))
async def test_a_crash_at_each_point_loses_nothing(
    point: str, valkey_server: EmbeddedValkey, client: valkey_async.Valkey, tmp_path: Path
) -> None:
    setup, action = PLAN[point]
    outbox = Outbox(client, CRASH_TUNABLES)
    ids: list[str] = []
    arg = ""
    if setup in ("pending", "staged", "backlog"):
        ids.append((await outbox.accept(WS, SES, "u", "c1", "the prompt")).id)
        arg = ids[0]
    if setup == "backlog":
        ids.append((await outbox.accept(WS, SES, "u", "c2", "the next prompt")).id)
    if setup == "staged":  # a worker died after staging: the staging list holds it
        assert crash("after-stage", "run-ok", valkey_server.url, tmp_path) == CRASH_EXIT_CODE
    if setup == "error":
        arg = await make_error(outbox, tmp_path)
        ids.append(arg)
    if setup == "unverifiable":  # an ambiguous send with no verifier: the ledger may settle it
        entry = await outbox.accept(WS, SES, "u", "c-unv", "outcome unknown")
        assert await outbox.deliver_once(WS, SES, _cut_unrecorded)
        assert (await outbox.list(WS, SES))[0].status is Status.ERROR
        arg = entry.id
        ids.append(arg)
    if setup == "two-sessions":
        for ses in (SES, "s2"):
            ids.append((await outbox.accept(WS, ses, "u", "c1", f"prompt of {ses}")).id)

    code = crash(point, action, valkey_server.url, tmp_path, arg)
    assert code == CRASH_EXIT_CODE, f"{point} was never reached (exit {code})"
    sessions = [SES, "s2"] if setup == "two-sessions" else [SES]
    # The invariant, right after the crash: every entry not yet delivered is still there.
    listed = {e.id for ses in sessions for e in await outbox.list(WS, ses)}
    assert {i for i in ids if i not in transcript(tmp_path)} <= listed, point

    # Recovery: a fresh worker (and the operator undoing a park / re-arming errors).
    await outbox.unpark_workspace(WS)
    for ses in sessions:
        for e in await outbox.list(WS, ses):
            if e.status is Status.ERROR:  # busy until the dead process's lease lapses
                await eventually(lambda s=ses, i=e.id: _retried(outbox, s, i), within=10)
    outbox.set_verifier(truthful(tmp_path))
    outbox.set_on_delivered(hook_log(tmp_path))
    worker = asyncio.create_task(outbox.run(file_agent(tmp_path, "ok"), tick=0.05))
    try:
        for ses in sessions:
            await eventually(lambda s=ses: _empty(outbox, s), within=30)  # type: ignore[misc]
        grace = CRASH_TUNABLES.hook_retry_after
        await eventually(lambda: _hooked(tmp_path, ids), within=grace + 10)
        await asyncio.sleep(grace * 1.5)  # long enough for a second call to show
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
    seen, hooks = Counter(transcript(tmp_path)), Counter(transcript(tmp_path, "hooks"))
    sent, fired = sorted({seen[i] for i in ids}), sorted({hooks[i] for i in ids})
    report.add_crash_point(point, f"delivered {_times(sent)}, OnDelivered {_times(fired)}")
    assert all(1 <= seen[i] <= 2 for i in ids), (point, seen)
    assert sent == [1], (point, seen)  # the verifier is truthful: never twice
    # Twice only by design: killed after the hook ran, before its record was cleared.
    assert fired == ([2] if point == "after-hook" else [1]), (point, hooks)


async def _cut_unrecorded(ws: str, ses: str, entry: Entry) -> None:
    raise ambiguous("cut before the agent recorded it")


async def _retried(outbox: Outbox, ses: str, entry_id: str) -> bool:
    return await outbox.retry(WS, ses, entry_id) is RetryResult.UPDATED


def _times(counts: list[int]) -> str:
    return {(1,): "once", (2,): "twice"}.get(tuple(counts), f"{counts} times")


async def _hooked(agent_dir: Path, ids: list[str]) -> bool:
    return set(ids) <= set(transcript(agent_dir, "hooks"))


async def _empty(outbox: Outbox, ses: str) -> bool:
    return not await outbox.list(WS, ses)
