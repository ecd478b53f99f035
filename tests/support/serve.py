"""`prompt-outbox serve` as a real process, and waiting for it to be ready or to have delivered."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.agent import Agent
from tests.support.processes import process_group

BIN = str(Path(sys.executable).parent / "prompt-outbox")


@contextmanager
def service(
    args: list[str], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    # Its own process group: the service and its embedded Valkey.
    env = {**os.environ, **(env or {})}
    with process_group([BIN, "serve", *args], env, stderr=subprocess.DEVNULL) as proc:
        yield proc


def wait_healthy(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("service did not become ready")


def post_five(url: str) -> list[str]:
    """Five prompts into one session over HTTP; their IDs, in order."""
    ids = []
    for i in range(5):
        r = httpx.post(url, json={"clientMessageID": f"m{i}", "text": f"prompt {i}"})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    return ids


def wait_delivered_in_order(agent: Agent, ids: list[str]) -> None:
    deadline = time.monotonic() + 30
    while sorted(agent.ids()) != sorted(ids):
        assert time.monotonic() < deadline, f"delivered {agent.ids()} of {ids}"
        time.sleep(0.05)
    assert agent.ids() == ids  # in order, once each
