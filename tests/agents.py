"""Test deliverers, verifiers and hook recorders (real callables; the agent side of a test)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from prompt_outbox import Entry, Verdict


class WorkerDied(BaseException):
    """Raised by a test's agent or verifier: the worker process is gone at that instant.

    A BaseException, so no outbox code handles it: nothing after the call runs, as in a
    SIGKILL (the chaos crash points do the same with real processes). The lease it took is
    still live; the test deletes the lock key to make it lapse."""


async def dying_agent(ws: str, ses: str, entry: Entry) -> None:
    """A deliverer whose worker dies inside the call: the entry stays staged."""
    raise WorkerDied


@dataclass
class ScriptedAgent:
    """A deliverer whose n-th call does what ``outcomes[n]`` says (None = success)."""

    outcomes: list[BaseException | None] = field(default_factory=list)
    delay: float = 0.0
    calls: list[tuple[str, str, Entry]] = field(default_factory=list)

    async def __call__(self, ws: str, ses: str, entry: Entry) -> None:
        self.calls.append((ws, ses, entry))
        if self.delay:
            await asyncio.sleep(self.delay)
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome

    @property
    def texts(self) -> list[str]:
        return [e.text for _, _, e in self.calls]


@dataclass
class ScriptedVerifier:
    verdicts: list[Verdict | BaseException] = field(default_factory=list)
    calls: list[Entry] = field(default_factory=list)

    async def __call__(self, ws: str, ses: str, entry: Entry) -> Verdict:
        self.calls.append(entry)
        v = self.verdicts.pop(0) if self.verdicts else Verdict.INCONCLUSIVE
        if isinstance(v, BaseException):
            raise v
        return v


@dataclass
class HookLog:
    events: list[tuple[str, str, Entry]] = field(default_factory=list)
    on_call: Callable[[Entry], None] | None = None

    async def __call__(self, ws: str, ses: str, entry: Entry) -> None:
        self.events.append((ws, ses, entry))
        if self.on_call:
            self.on_call(entry)

    @property
    def ids(self) -> list[str]:
        return [e.id for _, _, e in self.events]
