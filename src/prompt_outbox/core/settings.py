"""Tunables: the contract's knobs (docs/contract.md, Tunables) and a few of ours, in one
frozen object passed to the Outbox."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Literal, get_args

_MINUTE = 60.0
_HOUR = 60 * _MINUTE
_DEFAULT_LEASE = 30.0
_SMALLEST = 0.001  # seconds: one millisecond, the resolution of a Valkey TTL
MIN_EVENT_LOG_BYTES = 64 * 1024
_RATIOS = ("accept_memory_ratio", "workspace_budget_share")  # shares, not durations


class _Derived(float):
    """A tunable's value derived from another one (left at its default): ``replace()`` on the
    Tunables passes it back in, and it is derived again from the new values."""


DurabilityLevel = Literal["none", "fsync", "replica"]
"""What an acknowledged accept promises: ``none``, what the server's own configuration gives;
``fsync``, in the primary's AOF on disk (``WAITAOF 1 0``); ``replica``, on disk on the primary
and on at least one replica (``WAITAOF 1 1``)."""

DURABILITY_LEVELS: tuple[DurabilityLevel, ...] = get_args(DurabilityLevel)


class _DefaultLevel(str):
    """``accept_durability`` left at its default: a server that cannot honour it is warned
    about, not refused (a level the caller chose is refused at start)."""

    __slots__ = ()


_DEFAULT_LEVEL = _DefaultLevel("fsync")


@dataclass(frozen=True, slots=True)
class Tunables:
    """Every duration is float seconds. Defaults are the contract's; tests pass small values.

    Three of ours follow another field unless set (0 means "derive it"): ``lock_ttl`` is
    ``delivery_timeout + 2 min`` (the contract's rule); ``lease_ttl``, the short delivery-lock lease
    the living worker renews (a killed worker's session unfreezes after at most this long), is
    30 s, or ``lock_ttl`` if that is shorter; ``hook_retry_after`` (an OnDelivered owed by a
    worker that died after its claim is fired again by another worker after this long) is twice
    ``bookkeeping_timeout``. ``lock_ttl`` is the hard ceiling on one hold. ``event_log_len`` /
    ``event_log_ttl`` bound each session's event log (``Outbox.watch``).

    ``accept_durability`` (``DurabilityLevel``) says what an acknowledged accept promises;
    ``durability_timeout`` bounds the wait for it (past it, ``accept`` raises NotDurable). The
    default, ``fsync``, costs nothing on a server with ``appendfsync always`` (the embedded one).

    ``workspace_cap`` bounds the entries of one workspace over all its sessions (``cap`` bounds
    one session's). ``workspace_budget_share`` bounds the bytes it holds (its queued entries,
    its event logs, its dedupe and claim markers) at that share of Valkey's ``maxmemory`` (of
    the machine's memory on a server without one): past it accepts, edits and retries stop
    (``WorkspaceBytesFull``). ``event_log_bytes`` bounds one session's event log in bytes (past
    it the log begins again; a reader behind gets a reset).
    ``accept_memory_ratio``: accepts stop (``StorageFull``) while Valkey's used
    memory is at that share of its ``maxmemory`` (a server without one has no such check), so
    deliveries, which free room, still have the rest; ``memory_check_interval`` is how long a
    node's reading is kept.

    Every combination of the contract's knobs that the contract allows constructs (counts >= 1,
    durations of at least a millisecond, ``lock_ttl > delivery_timeout``); a value the caller
    set that breaks a rule is refused with a ValueError naming that field. A derived value
    stays derived: handed to another Tunables (``dataclasses.replace`` does), it is derived
    again from that one's fields.
    """

    max_attempts: int = 5
    cap: int = 25
    # Ours: entries one workspace may hold over all its sessions (400 full sessions).
    workspace_cap: int = 10_000
    dedupe_ttl: float = 24 * _HOUR
    delivery_timeout: float = 10 * _MINUTE
    retry_backoff: float = 10.0
    max_backoff: float = 2 * _MINUTE
    lock_ttl: float = 0.0
    verify_delay: float = 3.0
    verify_backoff: float = 3.0
    max_verify_backoff: float = 2 * _MINUTE
    max_verify_attempts: int = 40
    max_transient_failures: int = 20
    parked_sweep_interval: float = 60.0
    # Ours: the lease, the worker pool, and the safety nets.
    lease_ttl: float = 0.0
    # Sessions one loop delivers at once: 1,000 deliverers that block for a whole turn (each
    # ~10 KiB of the worker's memory); a pass reads only what its free slots can start.
    concurrency: int = 1000
    repair_interval: float = 5 * _MINUTE
    idle_workspace_ttl: float = _HOUR
    bookkeeping_timeout: float = 30.0
    hook_retry_after: float = 0.0
    # Ours: long agent turns (docs/design.md, "Turns"). A turn nobody heard end is checked with
    # the agent every turn_check_interval; one past turn_ceiling is checked, aborted if it still
    # runs, and let go; while the agent cannot answer, the hold lasts at most turn_ceiling +
    # turn_grace.
    turn_ceiling: float = 2 * _HOUR
    turn_check_interval: float = _MINUTE
    turn_grace: float = 10 * _MINUTE
    # The per-session event log behind SSE: its newest events, at most event_log_bytes of
    # them, each log living event_log_ttl from its first event.
    event_log_len: int = 1000
    event_log_ttl: float = 24 * _HOUR
    event_log_bytes: int = 1024 * 1024
    # Ours: the share of Valkey's memory one workspace may hold (docs/configuration.md, "Byte
    # budgets", has the arithmetic).
    workspace_budget_share: float = 0.1
    # What an acknowledged accept promises, and how long an accept waits for that promise.
    accept_durability: DurabilityLevel = _DEFAULT_LEVEL  # type: ignore[assignment]
    durability_timeout: float = 5.0
    # Accepts stop while a node's used memory is past this share of its maxmemory (none: no
    # check), so deliveries keep the rest; the reading is cached this long per node.
    accept_memory_ratio: float = 0.8
    memory_check_interval: float = 1.0

    @property
    def durability_chosen(self) -> bool:
        """Whether ``accept_durability`` was set by the caller (not left at its default)."""
        return not isinstance(self.accept_durability, _DefaultLevel)

    def __post_init__(self) -> None:
        if self.accept_durability not in DURABILITY_LEVELS:
            raise ValueError(
                f"Tunables.accept_durability must be one of {', '.join(DURABILITY_LEVELS)}, "
                f"got {self.accept_durability!r}"
            )
        numbers = [f for f in fields(self) if f.name != "accept_durability"]
        for f in numbers:
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"Tunables.{f.name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"Tunables.{f.name} must be finite, got {value!r}")

        def derive(name: str, value: float) -> None:
            current = getattr(self, name)
            if current == 0 or isinstance(current, _Derived):
                object.__setattr__(self, name, _Derived(value))

        derive("lock_ttl", self.delivery_timeout + 2 * _MINUTE)
        derive("lease_ttl", min(_DEFAULT_LEASE, self.lock_ttl))
        # Clearing a hook's record retries for bookkeeping_timeout: firing it again sooner
        # would duplicate hooks whose record is merely slow to clear.
        derive("hook_retry_after", 2 * self.bookkeeping_timeout)
        for f in numbers:
            value = getattr(self, f.name)
            if f.type == "int":
                if not isinstance(value, int) or value < 1:
                    raise ValueError(
                        f"Tunables.{f.name} must be a whole number >= 1, got {value!r}"
                    )
            elif value < _SMALLEST and f.name not in _RATIOS:
                # Valkey's TTLs are whole milliseconds: a shorter lease would be PX 0.
                raise ValueError(f"Tunables.{f.name} must be at least 0.001 s, got {value!r}")
        for name in _RATIOS:
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(
                    f"Tunables.{name} must be a share of maxmemory, above 0 and at most 1, "
                    f"got {getattr(self, name)!r}"
                )
        if self.event_log_bytes < MIN_EVENT_LOG_BYTES:
            # A new log's first node alone takes ~4 KiB: below a few, every event would begin
            # a new log.
            raise ValueError(
                f"Tunables.event_log_bytes must be at least {MIN_EVENT_LOG_BYTES}, "
                f"got {self.event_log_bytes!r}"
            )
        if self.lock_ttl <= self.delivery_timeout:
            raise ValueError(
                f"Tunables.lock_ttl ({self.lock_ttl}) must exceed delivery_timeout "
                f"({self.delivery_timeout}): a delivery must not outlive its lock"
            )
        if self.lease_ttl > self.lock_ttl:
            raise ValueError(
                f"Tunables.lease_ttl ({self.lease_ttl}) must not exceed lock_ttl ({self.lock_ttl})"
            )
        if self.hook_retry_after <= self.bookkeeping_timeout:
            raise ValueError(
                f"Tunables.hook_retry_after ({self.hook_retry_after}) must exceed "
                f"bookkeeping_timeout ({self.bookkeeping_timeout})"
            )


def tunables_from_json(text: str) -> Tunables:
    """Tunables from a JSON object of field -> value (the CLI's ``PROMPT_OUTBOX_TUNABLES``);
    unknown fields and bad values raise ValueError."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("tunables must be a JSON object of field -> value")
    known = {f.name for f in fields(Tunables)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown tunables: {', '.join(unknown)}")
    return Tunables(**raw)
