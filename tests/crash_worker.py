"""A worker process for crash tests: runs Outbox.run against a file-backed fake agent.

    python -m tests.crash_worker VALKEY_URL AGENT_DIR [hang]

The agent appends each entry ID it receives to AGENT_DIR/seen (its transcript) before it
answers; with ``hang`` it then never answers, so the test can SIGKILL the worker mid-send.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from prompt_outbox import Entry, Outbox
from prompt_outbox.storage.connect import connect
from tests.support.tunables import FAST


async def main(url: str, agent_dir: Path, hang: bool) -> None:
    seen = agent_dir / "seen"

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        with seen.open("a") as f:
            f.write(entry.id + "\n")
            f.flush()
            os.fsync(f.fileno())
        if hang:
            await asyncio.sleep(3600)

    client = connect(url, socket_timeout=5)
    await Outbox(client, FAST).run(deliver, tick=0.05)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "hang"))
