"""Tunables: every combination of the contract's knobs that the contract allows constructs; our
own knobs follow theirs unless set; a bad value the caller set is refused, naming that field."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prompt_outbox import Tunables
from prompt_outbox.core.settings import tunables_from_json

# The contract's knobs (its package variables), as Tunables fields; lock_ttl is drawn apart:
# the contract's one rule between them is LockTTL > DeliveryTimeout.
CONTRACT_COUNTS = ("max_attempts", "cap", "max_verify_attempts", "max_transient_failures")
CONTRACT_DURATIONS = (
    "dedupe_ttl",
    "delivery_timeout",
    "retry_backoff",
    "max_backoff",
    "verify_delay",
    "verify_backoff",
    "max_verify_backoff",
    "parked_sweep_interval",
)
seconds = st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def contract_knobs(draw: st.DrawFn) -> dict[str, float | int]:
    """Any subset of the contract's knobs, each any value the contract allows."""
    knobs: dict[str, float | int] = {}
    for name in CONTRACT_COUNTS:
        if draw(st.booleans()):
            knobs[name] = draw(st.integers(min_value=1, max_value=10_000))
    for name in CONTRACT_DURATIONS:
        if draw(st.booleans()):
            knobs[name] = draw(seconds)
    if draw(st.booleans()):
        timeout = knobs.get("delivery_timeout", Tunables().delivery_timeout)
        knobs["lock_ttl"] = timeout + draw(seconds)
    return knobs


def test_the_documented_example_constructs() -> None:
    # The contract's knobs only, obeying its rule: once refused over lease_ttl, never set.
    t = Tunables(delivery_timeout=2.0, lock_ttl=3.0)
    assert (t.lock_ttl, t.lease_ttl) == (3.0, 3.0)


@given(contract_knobs())
def test_every_combination_the_contract_allows_constructs(knobs: dict[str, float | int]) -> None:
    t = Tunables(**knobs)  # type: ignore[arg-type]
    for name, value in knobs.items():
        assert getattr(t, name) == value  # what the caller set is kept as set
    assert t.lock_ttl > t.delivery_timeout
    assert 0 < t.lease_ttl <= t.lock_ttl
    assert t.hook_retry_after > t.bookkeeping_timeout
    # replace() derives the followers again from the new values: no stale lock or lease.
    again = dataclasses.replace(Tunables(), **knobs)  # type: ignore[arg-type]
    assert again == t


def test_followers_follow_unless_set() -> None:
    t = Tunables()
    assert (t.lock_ttl, t.lease_ttl, t.hook_retry_after) == (720.0, 30.0, 60.0)
    longer = dataclasses.replace(t, delivery_timeout=1800.0, bookkeeping_timeout=45.0)
    assert (longer.lock_ttl, longer.lease_ttl, longer.hook_retry_after) == (1920.0, 30.0, 90.0)
    set_ = Tunables(delivery_timeout=1.0, lock_ttl=5.0, lease_ttl=2.0, hook_retry_after=31.0)
    assert (set_.lock_ttl, set_.lease_ttl, set_.hook_retry_after) == (5.0, 2.0, 31.0)
    # A base above its cap is the contract's own behaviour (every delay is the cap), not an error.
    assert Tunables(retry_backoff=300.0).max_backoff == 120.0


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"lock_ttl": 10.0}, "Tunables.lock_ttl (10.0) must exceed delivery_timeout"),
        ({"lease_ttl": 800.0}, "Tunables.lease_ttl (800.0) must not exceed lock_ttl"),
        ({"delivery_timeout": 1.0, "lock_ttl": 2.0, "lease_ttl": 3.0}, "Tunables.lease_ttl"),
        ({"hook_retry_after": 5.0}, "Tunables.hook_retry_after (5.0) must exceed"),
        ({"cap": 0}, "Tunables.cap must be a whole number >= 1, got 0"),
        ({"max_attempts": 2.5}, "Tunables.max_attempts must be a whole number >= 1"),
        ({"retry_backoff": -1.0}, "Tunables.retry_backoff must be at least 0.001 s"),
        ({"concurrency": True}, "Tunables.concurrency must be a number, got True"),
        ({"lease_ttl": False}, "Tunables.lease_ttl must be a number, got False"),
        ({"lock_ttl": float("nan")}, "Tunables.lock_ttl must be finite, got nan"),
        ({"dedupe_ttl": float("inf")}, "Tunables.dedupe_ttl must be finite, got inf"),
        # A Valkey TTL is whole milliseconds: a shorter lease would be PX 0, refused by Valkey.
        ({"delivery_timeout": 0.0001, "lock_ttl": 0.0002}, "Tunables.delivery_timeout must be"),
    ],
)
def test_a_bad_value_the_caller_set_is_refused_by_name(
    knobs: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        Tunables(**knobs)  # type: ignore[arg-type]


def test_a_derived_value_stays_derived() -> None:
    # Read from one Tunables and handed to another, a derived lock_ttl is derived again there
    # (what lets dataclasses.replace change delivery_timeout without a stale lock_ttl).
    assert Tunables(delivery_timeout=1.0, lock_ttl=Tunables().lock_ttl).lock_ttl == 121.0
    assert Tunables(delivery_timeout=1.0, lock_ttl=720.0).lock_ttl == 720.0


def test_tunables_from_json() -> None:
    t = tunables_from_json(json.dumps({"delivery_timeout": 2.0, "lock_ttl": 3.0}))
    assert t == Tunables(delivery_timeout=2.0, lock_ttl=3.0)
    with pytest.raises(ValueError, match="unknown tunables: nope"):
        tunables_from_json('{"nope": 1}')
    with pytest.raises(ValueError, match="JSON object"):
        tunables_from_json("[1]")
    with pytest.raises(ValueError, match="finite"):
        tunables_from_json('{"dedupe_ttl": NaN}')


def test_accept_durability_is_a_level_and_remembers_whether_it_was_chosen() -> None:
    default = Tunables()
    assert default.accept_durability == "fsync" and not default.durability_chosen
    assert not dataclasses.replace(default, cap=3).durability_chosen  # still the default
    chosen = Tunables(accept_durability="fsync")
    assert chosen.durability_chosen and dataclasses.replace(chosen, cap=3).durability_chosen
    assert tunables_from_json('{"accept_durability": "replica"}').durability_chosen
    with pytest.raises(ValueError, match=r"accept_durability must be one of none, fsync"):
        Tunables(accept_durability="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"durability_timeout must be at least 0\.001"):
        Tunables(durability_timeout=0)
