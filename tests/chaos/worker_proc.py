"""A chaos worker process: the library's ``run`` with the webhook deliverer against the test's
flaky agent, writing each deliverer call and each OnDelivered to append-only files.

    python -m tests.chaos.worker_proc VALKEY_URL AGENT_URL VERIFY_URL LOG_DIR [turns]

``turns``: the agent works in turns (tests/chaos/turn_agent.py): the deliverer handed to
``run`` keeps the webhook deliverer's ``TurnWatcher`` side (a verified send's turn is checked
with the agent, a check asks the verify URL), and the turns are checked every
``TURN_TUNABLES.turn_check_interval``.

Lines go out with os.write on O_APPEND descriptors: a SIGKILL cannot lose a line already
written (it is in the kernel), and lines of concurrent writers do not interleave.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from prompt_outbox import Entry, Outbox, Turn, TurnEnded, TurnState
from prompt_outbox.deliver import WebhookDeliverer
from prompt_outbox.storage.connect import connect
from tests.chaos.settings import (
    CHAOS_TUNABLES,
    TURN_TUNABLES,
    WEBHOOK_TIMEOUT,
    WORKER_SOCKET_TIMEOUT,
)


def _appender(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


class Logged:
    """The webhook deliverer, each call written to ``calls`` first."""

    def __init__(self, hook: WebhookDeliverer, calls: int) -> None:
        self.hook, self.calls = hook, calls

    async def __call__(self, ws: str, ses: str, entry: Entry) -> Turn | None:
        os.write(self.calls, f"{entry.id}\n".encode())
        return await self.hook(ws, ses, entry)


class LoggedWatcher(Logged):
    """...and its TurnWatcher side: without it the outbox could not ask the agent about a
    turn (a plain function hides the capability)."""

    def watch_turns(self, ended: TurnEnded | None) -> None:
        self.hook.watch_turns(ended)

    async def turn_state(self, ws: str, ses: str, turn_id: str) -> TurnState:
        return await self.hook.turn_state(ws, ses, turn_id)


async def main(url: str, agent_url: str, verify_url: str, log_dir: Path, turns: bool) -> None:
    pid = os.getpid()
    calls, hooks = _appender(log_dir / f"calls.{pid}"), _appender(log_dir / f"hooks.{pid}")
    hook = WebhookDeliverer(
        agent_url, secret=b"chaos", verify_url=verify_url, timeout=WEBHOOK_TIMEOUT
    )
    deliver = LoggedWatcher(hook, calls) if turns else Logged(hook, calls)

    async def on_delivered(ws: str, ses: str, entry: Entry) -> None:
        os.write(hooks, f"{entry.id}\n".encode())

    client = connect(url, socket_timeout=WORKER_SOCKET_TIMEOUT, socket_connect_timeout=2)
    outbox = Outbox(client, TURN_TUNABLES if turns else CHAOS_TUNABLES)
    outbox.set_verifier(hook.verify)
    outbox.set_on_delivered(on_delivered)
    await outbox.run(deliver, tick=0.1)


if __name__ == "__main__":
    turns = sys.argv[5:] == ["turns"]
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), turns))
