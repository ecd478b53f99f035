"""One step of the crash-point scenario, in a process that crashes at a named point.

    PROMPT_OUTBOX_CRASH_AT=<point> python -m tests.chaos.crash_proc ACTION URL AGENT_DIR [ID]

ACTION: ``run-ok`` / ``run-fail`` / ``run-ambiguous-once`` (the run loop with an agent that
records and succeeds; refuses without recording; records and answers ambiguously once),
``retry ID``, ``dismiss ID``, ``park``, ``sweep`` (the ledger sweep, the probe saying
"no row"). The agent is a file: one line per prompt it recorded (its transcript).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import valkey.asyncio as valkey_async

from prompt_outbox import Entry, Outbox, Verdict, ambiguous
from tests.chaos.settings import CRASH_TUNABLES

WS, SES = "crash", "s1"


def transcript(agent_dir: Path, name: str = "seen") -> list[str]:
    """What the agent recorded ("seen"), or the OnDelivered calls made ("hooks")."""
    path = agent_dir / name
    return path.read_text().split() if path.exists() else []


def hook_log(agent_dir: Path):  # type: ignore[no-untyped-def]
    async def on_delivered(ws: str, ses: str, entry: Entry) -> None:
        with (agent_dir / "hooks").open("a") as f:
            f.write(entry.id + "\n")

    return on_delivered


def file_agent(agent_dir: Path, mode: str):  # type: ignore[no-untyped-def]
    calls = 0

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        nonlocal calls
        calls += 1
        if mode == "fail":
            raise RuntimeError("the agent refuses")
        with (agent_dir / "seen").open("a") as f:
            f.write(entry.id + "\n")
        if mode == "ambiguous-once" and calls == 1:
            raise ambiguous("cut after recording")

    return deliver


def truthful(agent_dir: Path):  # type: ignore[no-untyped-def]
    async def verify(ws: str, ses: str, entry: Entry) -> Verdict:
        return Verdict.DELIVERED if entry.id in transcript(agent_dir) else Verdict.ABSENT

    return verify


async def main(action: str, url: str, agent_dir: Path, arg: str) -> None:
    client = valkey_async.Valkey.from_url(url, socket_timeout=5)
    outbox = Outbox(client, CRASH_TUNABLES)
    outbox.set_verifier(truthful(agent_dir))
    outbox.set_on_delivered(hook_log(agent_dir))

    async def no_row(ws: str, ses: str, entry_id: str, attempt: int) -> str:
        return ""

    outbox.set_ledger_probe(no_row)
    if action.startswith("run-"):
        await outbox.run(file_agent(agent_dir, action.removeprefix("run-")), tick=0.05)
    elif action == "retry":
        await outbox.retry(WS, SES, arg)
    elif action == "dismiss":
        await outbox.dismiss(WS, SES, arg)
    elif action == "park":
        await outbox.park_workspace(WS, "crash test")
    elif action == "sweep":
        await outbox.sweep_workspace_parked_errors(WS)
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(
        main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
    )
