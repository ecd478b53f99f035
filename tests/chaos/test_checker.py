"""The checker can fail: each kind of bad history is caught, and a good one passes."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from prompt_outbox import Entry, Status
from tests.chaos.history import History, check


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
