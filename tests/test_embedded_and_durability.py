"""The embedded server's data-dir lock, and the durability check of a server's configuration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox.durability import DurabilityError, check_durability, durability_problems
from prompt_outbox.embedded import DataDirInUse, EmbeddedValkey


def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    with EmbeddedValkey(tmp_path) as first:
        with pytest.raises(DataDirInUse, match="in use"):
            EmbeddedValkey(tmp_path).start()
        assert first.proc is not None and first.proc.poll() is None  # untouched
    with EmbeddedValkey(tmp_path):  # free again once the first stopped
        pass


def test_an_orphaned_server_still_holds_the_data_dir(tmp_path: Path) -> None:
    # The owning process is SIGKILLed; its valkey-server lives on, writing the AOF. A new
    # instance must refuse the directory until that server is gone too.
    code = (
        "import sys, time\n"
        "from prompt_outbox.embedded import EmbeddedValkey\n"
        "s = EmbeddedValkey(sys.argv[1]); s.start(); print(s.proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    server_pid = int(owner.stdout.readline())
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    try:
        with pytest.raises(DataDirInUse):
            EmbeddedValkey(tmp_path).start()
    finally:
        subprocess.run(["kill", "-9", str(server_pid)], check=False)
    _wait_gone(server_pid)
    with EmbeddedValkey(tmp_path):
        pass


def _wait_gone(pid: int) -> None:
    for _ in range(500):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not exit")


async def test_the_embedded_server_is_durable(valkey_server: EmbeddedValkey) -> None:
    client = valkey_async.Valkey.from_url(valkey_server.url)
    assert await durability_problems(client) == []
    await client.aclose()


async def test_a_lax_server_is_reported_and_refused_in_strict_mode(lax_server: int) -> None:
    client = valkey_async.Valkey.from_url(f"valkey://127.0.0.1:{lax_server}")
    try:
        problems = await check_durability(client, strict=False)
        assert any("allkeys-lru" in p for p in problems)
        assert any("no persistence" in p for p in problems)
        with pytest.raises(DurabilityError, match="noeviction"):
            await check_durability(client, strict=True)
        await client.config_set("appendonly", "yes")
        await client.config_set("appendfsync", "everysec")
        await client.config_set("maxmemory-policy", "noeviction")
        assert [p for p in await durability_problems(client) if "appendfsync" in p]
        await client.config_set("appendfsync", "always")
        assert await check_durability(client, strict=True) == []
    finally:
        await client.aclose()
