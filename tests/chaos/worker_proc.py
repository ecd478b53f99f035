"""A chaos worker process: the library's ``run`` with the webhook deliverer against the test's
flaky agent, writing each deliverer call and each OnDelivered to append-only files.

    python -m tests.chaos.worker_proc VALKEY_URL AGENT_URL VERIFY_URL LOG_DIR

Lines go out with os.write on O_APPEND descriptors: a SIGKILL cannot lose a line already
written (it is in the kernel), and lines of concurrent writers do not interleave.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from prompt_outbox import Entry, Outbox
from prompt_outbox.deliver import WebhookDeliverer
from prompt_outbox.storage.connect import connect
from tests.chaos.settings import CHAOS_TUNABLES, WEBHOOK_TIMEOUT, WORKER_SOCKET_TIMEOUT


def _appender(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


async def main(url: str, agent_url: str, verify_url: str, log_dir: Path) -> None:
    pid = os.getpid()
    calls, hooks = _appender(log_dir / f"calls.{pid}"), _appender(log_dir / f"hooks.{pid}")
    hook = WebhookDeliverer(
        agent_url, secret=b"chaos", verify_url=verify_url, timeout=WEBHOOK_TIMEOUT
    )

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        os.write(calls, f"{entry.id}\n".encode())
        await hook(ws, ses, entry)

    async def on_delivered(ws: str, ses: str, entry: Entry) -> None:
        os.write(hooks, f"{entry.id}\n".encode())

    client = connect(url, socket_timeout=WORKER_SOCKET_TIMEOUT, socket_connect_timeout=2)
    outbox = Outbox(client, CHAOS_TUNABLES)
    outbox.set_verifier(hook.verify)
    outbox.set_on_delivered(on_delivered)
    await outbox.run(deliver, tick=0.1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
