"""A chaos run's history and the checker that judges it (Jepsen style: record, then check).

The history holds every acknowledged accept (per session, in accept order), what the agent
recorded (its truthful transcript; an agent that works in turns also counts the prompts that
reached it while the session's previous turn ran), every OnDelivered the workers wrote, and
what the outbox still lists at the end. ``check`` turns it into counts; a run passes when the
bad ones are 0.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from prompt_outbox import Entry, Status


@dataclass
class History:
    accepted: dict[str, list[str]] = field(default_factory=dict)  # session -> IDs, accept order
    agent_seen: Counter[str] = field(default_factory=Counter)  # entry ID -> times recorded
    agent_order: dict[str, list[str]] = field(default_factory=dict)  # session -> first sightings
    hooks: Counter[str] = field(default_factory=Counter)  # entry ID -> OnDelivered calls
    hooks_by_killed: Counter[str] = field(default_factory=Counter)  # ...made by killed workers
    hooks_recorded: bool = True  # False where the workers cannot report OnDelivered
    sends: int = 0  # deliverer calls, every worker together
    final: dict[str, list[Entry]] = field(default_factory=dict)  # session -> List at the end
    faults: Counter[str] = field(default_factory=Counter)  # what was injected, by kind
    # Prompts that reached the agent while a turn of their session ran (docs/design.md,
    # "Turns"); None where the agent has no turns to count in (it answers each prompt when it
    # is done).
    sent_in_turn: int | None = None


@dataclass(frozen=True)
class Verdict:
    accepted: int
    sends: int
    delivered: int
    listed_stopped: int  # in error / parked, and listed: not lost, an operator sees them
    lost: int
    stuck: int  # still pending / verifying / delivering when the run ended
    agent_duplicates: int
    hook_duplicates: int  # entries whose OnDelivered was made more than once
    hook_duplicates_unexplained: int  # ...without a killed worker behind every extra call
    hook_missing: int  # delivered and gone, but no OnDelivered was seen
    order_violations: int
    sent_in_turn: int | None  # None: the agent has no turns (shown "-")

    @property
    def ok(self) -> bool:
        """Nothing lost, stuck, run twice by the agent, reordered or sent into a running turn;
        every delivered entry's OnDelivered made. A second OnDelivered is by design only when
        the worker that made the first was killed before clearing its record: every extra call
        must be explained by a call from a worker that was then SIGKILLed."""
        return not (
            self.lost or self.stuck or self.agent_duplicates or self.hook_missing
            or self.order_violations or self.hook_duplicates_unexplained or self.sent_in_turn
        )  # fmt: skip


def check(h: History) -> Verdict:
    listed = {e.id: e for entries in h.final.values() for e in entries}
    ids = [i for ids in h.accepted.values() for i in ids]
    delivered = [i for i in ids if h.agent_seen[i]]
    stopped = [
        i
        for i in ids
        if not h.agent_seen[i] and i in listed and listed[i].status in (Status.ERROR, Status.PARKED)
    ]
    stuck = [
        i for i in ids if i in listed and listed[i].status not in (Status.ERROR, Status.PARKED)
    ]
    lost = [i for i in ids if not h.agent_seen[i] and i not in listed]
    order = 0
    for ses, want in h.accepted.items():
        seen = set(h.agent_order.get(ses, []))
        if [i for i in h.agent_order.get(ses, []) if i in set(want)] != [
            i for i in want if i in seen
        ]:
            order += 1
    gone = [i for i in delivered if i not in listed]
    return Verdict(
        accepted=len(ids),
        sends=h.sends,
        delivered=len(delivered),
        listed_stopped=len(stopped),
        lost=len(lost),
        stuck=len(stuck),
        agent_duplicates=sum(1 for i in ids if h.agent_seen[i] > 1),
        hook_duplicates=sum(1 for i in ids if h.hooks[i] > 1),
        hook_duplicates_unexplained=sum(1 for i in ids if h.hooks[i] - 1 > h.hooks_by_killed[i]),
        hook_missing=sum(1 for i in gone if h.hooks[i] == 0) if h.hooks_recorded else 0,
        order_violations=order,
        sent_in_turn=h.sent_in_turn,
    )
