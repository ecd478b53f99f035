"""The embedded server's data-dir lock, and the durability check of a server's configuration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import valkey as valkey_sync
import valkey.asyncio as valkey_async

from prompt_outbox.durability import DurabilityError, check_durability, durability_problems
from prompt_outbox.embedded import DataDirInUse, EmbeddedValkey
from tests.support.processes import gone


def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    with EmbeddedValkey(tmp_path) as first:
        with pytest.raises(DataDirInUse, match="in use"):
            EmbeddedValkey(tmp_path).start()
        assert first.proc is not None and first.proc.poll() is None  # untouched
    with EmbeddedValkey(tmp_path):  # free again once the first stopped
        pass


def _killed_owner(data_dir: Path, outlive_owner: bool) -> tuple[int, int]:
    """Start an embedded server in a process of its own, write a key, SIGKILL that process:
    the server's pid and port."""
    code = (
        "import sys, time, valkey\n"
        "from prompt_outbox.embedded import EmbeddedValkey\n"
        "s = EmbeddedValkey(sys.argv[1], outlive_owner=sys.argv[2] == 'yes'); s.start()\n"
        "valkey.Valkey.from_url(s.url).set('kept', 'yes')\n"
        "print(s.proc.pid, s.port, flush=True)\n"
        "time.sleep(60)\n"
    )
    argv = [sys.executable, "-c", code, str(data_dir), "yes" if outlive_owner else "no"]
    owner = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    server_pid, port = map(int, owner.stdout.readline().split())
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    return server_pid, port


def _orphan(data_dir: Path) -> tuple[int, int]:
    """An embedded server started to outlive its owner, whose owner was SIGKILLed: the
    server's pid and port (it lives on, holding the data dir's lock)."""
    server_pid, port = _killed_owner(data_dir, outlive_owner=True)
    os.kill(server_pid, 0)  # the orphan lives on
    return server_pid, port


def test_a_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    # kill -9 on serve alone: its server goes too (the parent-death signal), as it did when
    # the two shared a process group, and the data dir is free for the next start at once.
    server_pid, _ = _killed_owner(tmp_path, outlive_owner=False)
    assert gone(server_pid)
    with EmbeddedValkey(tmp_path) as again:
        assert valkey_sync.Valkey.from_url(again.url).get("kept") == b"yes"  # from the AOF


def test_a_lock_let_go_a_moment_after_its_holder_died_is_waited_for(tmp_path: Path) -> None:
    # A server that dies with its SIGKILLed owner lets the data dir's lock go a moment after
    # the owner is gone: a restart in that moment waits for it rather than refusing.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / "prompt-outbox.lock"
    os.close(os.open(lock, os.O_WRONLY | os.O_CREAT, 0o600))
    lock.write_text(f"{dead.pid}\n")  # the recorded holder, gone
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True); time.sleep(0.3)\n"
    )
    dying = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE)
    assert dying.stdout is not None and dying.stdout.readline() == b"held\n"
    with EmbeddedValkey(tmp_path) as server:
        assert server.proc is not None and server.proc.poll() is None
    dying.wait()


def test_an_orphaned_server_is_stopped_and_its_place_taken(tmp_path: Path) -> None:
    # Only the owner was SIGKILLed (kill -9 on serve's pid); a restart must not be refused
    # for ever by its server: that one is asked to shut down, and the new one takes its port.
    server_pid, port = _orphan(tmp_path)
    with EmbeddedValkey(tmp_path) as again:
        assert gone(server_pid)
        assert again.port == port and again.proc is not None and again.proc.pid != server_pid
        assert valkey_sync.Valkey.from_url(again.url).get("kept") == b"yes"  # from the AOF


def test_an_orphan_that_does_not_answer_keeps_the_data_dir(tmp_path: Path) -> None:
    server_pid, _ = _orphan(tmp_path)
    os.kill(server_pid, signal.SIGSTOP)  # it cannot be asked to stop
    try:
        with pytest.raises(DataDirInUse, match="has exited, and its server did not stop"):
            EmbeddedValkey(tmp_path).start()
    finally:
        os.kill(server_pid, signal.SIGKILL)
        os.kill(server_pid, signal.SIGCONT)
    assert gone(server_pid)
    with EmbeddedValkey(tmp_path):  # free once it is gone
        pass


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
