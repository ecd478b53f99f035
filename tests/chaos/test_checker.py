"""The checker can fail: each kind of bad history is caught, and a good one passes."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime

import pytest

from prompt_outbox import Entry, Status, Turn, TurnState
from prompt_outbox.deliver import WebhookDeliverer
from tests.chaos import report
from tests.chaos.history import History, check
from tests.chaos.turn_agent import TurnAgent
from tests.support.waiting import eventually, holds


def entry(entry_id: str, status: Status) -> Entry:
    return Entry(entry_id, "c", "u", "t", datetime.now(UTC), status=status)


def good() -> History:
    return History(
        accepted={"s1": ["a", "b", "c"]},
        agent_seen=Counter({"a": 1, "b": 1, "c": 1}),
        agent_order={"s1": ["a", "b", "c"]},
        hooks=Counter({"a": 1, "b": 1, "c": 1}),
    )


def test_a_clean_history_passes() -> None:
    v = check(good())
    assert v.ok and (v.accepted, v.delivered, v.lost) == (3, 3, 0)


def test_a_lost_prompt_is_caught() -> None:
    h = good()
    del h.agent_seen["b"]
    h.agent_order["s1"].remove("b")
    assert check(h).lost == 1 and not check(h).ok


def test_a_prompt_stopped_in_error_and_listed_is_not_lost() -> None:
    h = good()
    del h.agent_seen["b"]
    h.agent_order["s1"].remove("b")
    h.final["s1"] = [entry("b", Status.ERROR)]
    v = check(h)
    assert v.ok and (v.lost, v.listed_stopped) == (0, 1)


def test_a_prompt_still_pending_is_stuck() -> None:
    h = good()
    del h.agent_seen["c"]
    h.agent_order["s1"].remove("c")
    h.final["s1"] = [entry("c", Status.VERIFYING)]
    assert check(h).stuck == 1 and not check(h).ok


def test_duplicates_and_reordering_are_caught() -> None:
    h = good()
    h.agent_seen["a"] = 2
    assert check(h).agent_duplicates == 1 and not check(h).ok
    h = good()
    h.hooks["c"] = 2
    assert check(h).hook_duplicates == 1 and not check(h).ok
    h = good()
    h.agent_order["s1"] = ["b", "a", "c"]
    assert check(h).order_violations == 1 and not check(h).ok


def test_a_missing_hook_is_caught() -> None:
    h = good()
    del h.hooks["a"]  # an owed OnDelivered must be made by another worker, even after a kill
    v = check(h)
    assert v.hook_missing == 1 and not v.ok


def test_a_second_hook_is_explained_only_by_a_killed_worker() -> None:
    h = good()
    h.hooks["a"] = 2
    assert check(h).hook_duplicates_unexplained == 1 and not check(h).ok
    h.hooks_by_killed["a"] = 1  # the first call's worker was killed before clearing its record
    assert check(h).ok and check(h).hook_duplicates == 1
    h.hooks["a"] = 3  # made three times, one extra call unexplained
    assert not check(h).ok


def test_a_prompt_sent_into_a_running_turn_is_caught() -> None:
    h = good()
    h.sent_in_turn = 1  # the agent stand-in counted a prompt that came during a turn
    v = check(h)
    assert v.sent_in_turn == 1 and not v.ok
    h.sent_in_turn = 0
    assert check(h).ok and check(h).sent_in_turn == 0


def test_an_agent_without_turns_shows_no_count_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    v = check(good())  # a blocking agent: nothing to count, shown "-" rather than a vacuous 0
    assert v.ok and v.sent_in_turn is None
    monkeypatch.setattr(report, "ROWS", [])  # not the session's summary
    report.add("blocking", "none", v)
    head, _, row = report.render().splitlines()
    assert head.split()[-1] == "sent_in_turn" and row.split()[-2:] == ["0", "-"]


async def test_the_turn_agent_counts_a_prompt_that_comes_during_a_turn() -> None:
    """The stand-in behind the column (turn_agent.py), driven by the real webhook deliverer:
    a prompt into a session whose turn runs counts; one into another session, or after the
    turn is over, does not; ``?turn=`` tells running from ended, by turn or entry ID."""
    ok = {"ok": 1.0}
    with_turns = TurnAgent(1, secret=b"s", faults=ok, turn_seconds=(0.3, 0.3), by_check_only=1)
    hook = WebhookDeliverer(with_turns.url, secret=b"s", verify_url=with_turns.verify_url)
    try:
        sent = [Entry(f"e{n}", f"c{n}", "u", "t", datetime.now(UTC)) for n in range(4)]
        first = await hook("ws", "s1", sent[0])
        assert isinstance(first, Turn)
        assert await hook.turn_state("ws", "s1", first.id) is TurnState.RUNNING
        assert await hook("ws", "s2", sent[1]) is not None  # another session: its own turn
        assert with_turns.sent_in_turn == 0
        await hook("ws", "s1", sent[2])  # s1's turn still runs
        assert with_turns.sent_in_turn == 1
        await eventually(lambda: holds(with_turns.running() == 0))
        assert await hook.turn_state("ws", "s1", first.id) is TurnState.ENDED
        assert await hook.turn_state("ws", "s1", "e0") is TurnState.ENDED  # by its entry
        assert await hook.turn_state("ws", "s1", "never") is TurnState.UNKNOWN
        await hook("ws", "s1", sent[3])
        assert with_turns.sent_in_turn == 1 and with_turns.turns["check_only"] == 3
        assert with_turns.order == {"s1": ["e0", "e2", "e3"], "s2": ["e1"]}
    finally:
        await hook.aclose()
        with_turns.close()
        await asyncio.sleep(0)  # the cancelled turns finish
