"""A worker process for the fencing tests (test_fencing.py): the library's ``run`` with the
webhook deliverer, like worker_proc.py, but with the tunables and the HTTP timeout the test
passes (a held send must outlast a pause or a stall without timing out), a note of what each
send returned, and an optional gate it waits at before it starts delivering.

    python -m tests.chaos.fenced_worker VALKEY_URL AGENT_URL VERIFY_URL LOG_DIR TUNABLES [GATE]

Files in LOG_DIR, one line per event, written with os.write on O_APPEND descriptors:
  ready.<pid>    imports done, client made (then it waits for GATE to exist, if given)
  running.<pid>  about to run the delivery loop
  calls.<pid>    "<entry id>" as the deliverer is called (before the POST)
  sends.<pid>    "<entry id> ok" or "<entry id> failed <error>" when the POST returned
  hooks.<pid>    "<entry id>" for each OnDelivered
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from prompt_outbox import Entry, Outbox
from prompt_outbox.core.settings import tunables_from_json
from prompt_outbox.deliver import WebhookDeliverer
from prompt_outbox.storage.connect import connect
from tests.chaos.settings import WORKER_SOCKET_TIMEOUT


def _appender(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _note(log_dir: Path, name: str, line: str) -> None:
    fd = _appender(log_dir / f"{name}.{os.getpid()}")
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


async def main(url: str, agent_url: str, verify_url: str, log_dir: Path, tunables: str) -> None:
    t = tunables_from_json(tunables)
    # The HTTP timeout is the whole delivery budget: a held send is not cut by the client.
    hook = WebhookDeliverer(
        agent_url, secret=b"chaos", verify_url=verify_url, timeout=t.delivery_timeout
    )

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        _note(log_dir, "calls", entry.id)
        try:
            await hook(ws, ses, entry)
        except Exception as exc:
            _note(log_dir, "sends", f"{entry.id} failed {type(exc).__name__}")
            raise
        _note(log_dir, "sends", f"{entry.id} ok")

    async def on_delivered(ws: str, ses: str, entry: Entry) -> None:
        _note(log_dir, "hooks", entry.id)

    client = connect(url, socket_timeout=WORKER_SOCKET_TIMEOUT, socket_connect_timeout=2)
    outbox = Outbox(client, t)
    outbox.set_verifier(hook.verify)
    outbox.set_on_delivered(on_delivered)
    _note(log_dir, "running", "running")
    await outbox.run(deliver, tick=0.1)


if __name__ == "__main__":
    log_dir = Path(sys.argv[4])
    _note(log_dir, "ready", "ready")  # imported: the run loop starts in milliseconds from here
    gate = Path(sys.argv[6]) if len(sys.argv) > 6 else None
    while gate is not None and not gate.exists():
        time.sleep(0.02)
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], log_dir, sys.argv[5]))
