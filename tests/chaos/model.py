"""A pure-Python reference model of the contract's state machine for one session, written from the
contract's rules (docs/contract.md; not from machine.py), for the model-based test to compare
against."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from prompt_outbox import Tunables
from prompt_outbox.core.ledger import LEDGER_DELIVERED, LEDGER_NOT_DELIVERED

BLOCKING = ("pending", "verifying")


@dataclass
class MEntry:
    id: str
    seq: int  # accept order
    status: str = "pending"
    attempts: int = 0
    verify_attempts: int = 0
    transient_fails: int = 0
    next_at: datetime | None = None  # None: due now
    stopped: str = ""  # why it stopped: exhausted | unverifiable | transient | parked | parked-v


def backoff(base: float, cap: float, n: int) -> float:
    """The contract's backoff: a BASE delay that doubles per failure and caps."""
    return min(cap, base * 2 ** (n - 1))


@dataclass
class Model:
    t: Tunables
    entries: list[MEntry] = field(default_factory=list)  # the queue, in accept order
    dedupe: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> first id, text
    delivered: list[str] = field(default_factory=list)  # OnDelivered, in order
    staged: MEntry | None = None  # taken out for a send by a worker that then died
    locked: bool = False  # a dead worker's lease has not lapsed yet: the session is busy
    accepted: int = 0

    def listed(self) -> list[MEntry]:
        """List's view: the staged (delivering) entry first, then the queue."""
        return ([self.staged] if self.staged else []) + self.entries

    def accept(self, cmid: str, new_id: str, text: str) -> str:
        """'dup:<id>', 'reused:<id>' (the key's first accept had another text), 'full' or
        'ok'."""
        if cmid in self.dedupe:
            first_id, first_text = self.dedupe[cmid]
            return ("dup:" if text == first_text else "reused:") + first_id
        if len(self.listed()) >= self.t.cap:
            return "full"
        self.accepted += 1
        self.entries.append(MEntry(new_id, self.accepted))
        self.dedupe[cmid] = (new_id, text)
        return "ok"

    def head(self, now: datetime) -> MEntry | None:
        """The first pending / verifying entry, if it is due (it blocks the rest either way)."""
        if self.locked or self.staged:
            return None
        for e in self.entries:
            if e.status in BLOCKING:
                return e if e.next_at is None or e.next_at <= now else None
        return None

    def send(self, e: MEntry, outcome: str, now: datetime) -> None:
        t = self.t
        if outcome == "ok":
            self._gone(e)
        elif outcome == "definitive":
            self._definitive(e, now)
        elif outcome == "ambiguous":
            e.status, e.verify_attempts = "verifying", 0
            e.next_at = now + timedelta(seconds=t.verify_delay)
        else:  # transient: no attempt number, its own budget
            e.transient_fails += 1
            if e.transient_fails >= t.max_transient_failures:
                self._stop(e, "transient")
            else:
                e.next_at = now + timedelta(
                    seconds=backoff(t.retry_backoff, t.max_backoff, e.transient_fails)
                )

    def verify(self, e: MEntry, verdict: str, now: datetime) -> None:
        t = self.t
        if verdict == "delivered":
            self._gone(e)
        elif verdict == "absent":
            e.verify_attempts = 0
            self._definitive(e, now)
        else:
            e.verify_attempts += 1
            if e.verify_attempts >= t.max_verify_attempts:
                self._stop(e, "unverifiable")
            else:
                e.next_at = now + timedelta(
                    seconds=backoff(t.verify_backoff, t.max_verify_backoff, e.verify_attempts)
                )

    def _definitive(self, e: MEntry, now: datetime) -> None:
        t = self.t
        e.attempts += 1
        if e.attempts >= t.max_attempts:
            self._stop(e, "exhausted")
        else:
            e.status = "pending"
            e.next_at = now + timedelta(seconds=backoff(t.retry_backoff, t.max_backoff, e.attempts))

    def _stop(self, e: MEntry, why: str) -> None:
        e.status, e.next_at, e.stopped = "error", None, why

    def _gone(self, e: MEntry) -> None:
        self.entries.remove(e)
        self.delivered.append(e.id)

    def died_sending(self, e: MEntry) -> None:
        """The worker took the head out for a send and died: staged, its lease still live."""
        self.entries.remove(e)
        e.status = "delivering"
        self.staged, self.locked = e, True

    def recover(self, now: datetime) -> int:
        """A staged entry without a holder: the send's outcome is unknown, so it is verified
        first; it goes back where it stood in accept order."""
        e = self.staged
        if e is None or self.locked:
            return 0
        self.staged = None
        e.status, e.verify_attempts, e.stopped = "verifying", 0, ""
        e.next_at = now + timedelta(seconds=self.t.verify_delay)
        at = next((i for i, o in enumerate(self.entries) if o.seq > e.seq), len(self.entries))
        self.entries.insert(at, e)
        return 1

    def find(self, entry_id: str) -> MEntry | None:
        return next((e for e in self.entries if e.id == entry_id), None)

    def may_act(self, now: datetime) -> bool:
        """Operator actions answer BUSY (or skip the session) while a holder's lease is live;
        otherwise they first recover a dead worker's staged entry, then act on the queue."""
        if self.locked:
            return False
        self.recover(now)
        return True

    def retry(self, entry_id: str, now: datetime) -> str:
        if not self.may_act(now):
            return "BUSY"
        e = self.find(entry_id)
        if e is None or e.status != "error":
            return "NOT_FOUND"
        e.status, e.next_at, e.stopped = "pending", None, ""
        e.attempts = e.verify_attempts = e.transient_fails = 0
        return "UPDATED"

    def dismiss(self, entry_id: str, now: datetime) -> str:
        if not self.may_act(now):
            return "BUSY"
        e = self.find(entry_id)
        if e is None:
            return "NOT_FOUND"
        self.entries.remove(e)
        return "REMOVED"

    def park(self, now: datetime) -> int:
        if not self.may_act(now):
            return 0
        n = 0
        for e in self.entries:
            if e.status in BLOCKING:
                e.stopped = "parked" if e.status == "pending" else "parked-v"
                e.status, e.next_at = "parked", None
                n += 1
        return n

    def unpark(self, now: datetime) -> int:
        if not self.may_act(now):
            return 0
        n = 0
        for e in self.entries:
            if e.status == "parked":
                if e.stopped == "parked-v":
                    e.status, e.verify_attempts = "verifying", 0
                else:
                    e.status = "pending"
                e.next_at, e.stopped = None, ""
                n += 1
        return n

    def sweep_unverifiable(self, now: datetime) -> int:
        if not self.may_act(now):
            return 0
        n = 0
        for e in self.entries:
            if e.status == "error" and e.stopped == "unverifiable":
                e.status, e.verify_attempts, e.next_at, e.stopped = "verifying", 0, None, ""
                n += 1
        return n

    def ledger_sweep(self, answer: str, now: datetime) -> int:
        """The parked-error sweep with every probe answering ``answer``: delivered settles
        the entry (OnDelivered), no row / failed re-arms it, anything else leaves it. Only
        sessions holding an error entry are visited; entries that spent their attempts on
        proven failures are not asked about."""
        if not any(e.status == "error" for e in self.entries) or not self.may_act(now):
            return 0
        n = 0
        for e in list(self.entries):
            if e.status != "error" or e.stopped == "exhausted":
                continue
            if answer in LEDGER_DELIVERED:
                self._gone(e)
                n += 1
            elif answer in LEDGER_NOT_DELIVERED:
                e.status, e.next_at, e.stopped = "pending", None, ""
                e.verify_attempts = e.transient_fails = 0
                n += 1
        return n
