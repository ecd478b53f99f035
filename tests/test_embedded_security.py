"""The embedded Valkey keeps other local users out (docs/security.md, finding 4): a password
made once and kept 0600 in the data dir, given to the server in a 0600 config file (not argv);
the data dir 0700 and every file 0600, modes from before fixed; attaching reads the password; no
log line carries it. And its maxmemory (finding 12)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import valkey
from valkey.exceptions import AuthenticationError, ResponseError

from prompt_outbox.embedded import (
    MAXMEMORY_CAP,
    EmbeddedValkey,
    UnsafeDataDir,
    answers_ping,
    default_maxmemory,
    read_password,
    running_url,
)
from tests.support.serve import BIN


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Run as a user whose umask lets everyone read new files (the common 022)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def raw(port: int, command: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), 2) as s:
        s.sendall(command)
        return s.recv(200)


def modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (and root itself, as '.') -> its permission bits."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        out[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return out


def test_a_client_without_the_password_gets_nothing(tmp_path: Path) -> None:
    with EmbeddedValkey(tmp_path) as server:
        valkey.Valkey.from_url(server.url).set("secret", "prompt text")
        assert raw(server.port, b"PING\r\n").startswith(b"-NOAUTH")
        assert raw(server.port, b"GET secret\r\n").startswith(b"-NOAUTH")
        assert not answers_ping(server.port)
        assert answers_ping(server.port, server.password)
        assert not answers_ping(server.port, "guessed")
        with pytest.raises(AuthenticationError):
            valkey.Valkey(port=server.port).get("secret")
        assert server.url == f"valkey://:{server.password}@127.0.0.1:{server.port}/0"


def test_the_data_dir_is_0700_and_every_file_0600(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with umask(0o022), EmbeddedValkey(data) as server:
        client = valkey.Valkey.from_url(server.url)
        for i in range(100):
            client.rpush("q", f"prompt {i}")
        client.bgrewriteaof()  # a rewrite makes new AOF files
        # Walk once it is over: its temporary files come and go meanwhile.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = client.info("persistence")
            if not (info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]):
                break
            time.sleep(0.05)
        found = modes(data)
    assert {"appendonlydir", "valkey.password", "valkey.conf", "valkey.log"} <= set(found)
    assert any(name.endswith(".aof") for name in found)
    for name, mode in found.items():
        want = 0o700 if (data / name).is_dir() else 0o600
        assert mode == want, f"{name} is {mode:04o}"


def test_the_password_is_in_0600_files_never_on_the_command_line(tmp_path: Path) -> None:
    with EmbeddedValkey(tmp_path) as server:
        assert server.proc is not None
        argv = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
        assert server.password.encode() not in argv
        assert (tmp_path / "valkey.password").read_text().strip() == server.password
        assert server.password in (tmp_path / "valkey.conf").read_text()
        assert len(server.password) >= 40  # secrets.token_urlsafe(32)


def test_a_second_attach_reads_the_password_and_a_restart_keeps_it(tmp_path: Path) -> None:
    with EmbeddedValkey(tmp_path) as first:
        url = running_url(tmp_path)
        assert url == first.url
        assert valkey.Valkey.from_url(url).ping()
        password = first.password
    assert running_url(tmp_path) is None  # stopped
    with EmbeddedValkey(tmp_path) as again:
        assert again.password == password  # made once, kept
    other = tmp_path / "other"
    with EmbeddedValkey(other) as elsewhere:
        assert elsewhere.password != password


def test_an_existing_world_readable_data_dir_is_fixed_and_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A data dir from before: the server ran without umask, so 0755 / 0644 everywhere.
    data = tmp_path / "data"
    with EmbeddedValkey(data) as server:
        valkey.Valkey.from_url(server.url).set("k", "v")
    (data / "valkey.password").unlink()  # as before there was one
    data.chmod(0o755)
    for path in data.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    with caplog.at_level(logging.WARNING), EmbeddedValkey(data) as server:
        assert valkey.Valkey.from_url(server.url).get("k") == b"v"  # its data kept
        found = modes(data)
    assert all(mode in (0o700, 0o600) for mode in found.values()), found
    [warning] = [r.getMessage() for r in caplog.records if "open to other users" in r.getMessage()]
    assert ". 0755" in warning and "appendonlydir 0755" in warning


def test_a_password_file_others_may_read_is_refused(tmp_path: Path) -> None:
    with EmbeddedValkey(tmp_path) as server:
        password_file = tmp_path / "valkey.password"
        password_file.chmod(0o644)
        with pytest.raises(UnsafeDataDir, match="mode 0600"):
            running_url(tmp_path)
    with pytest.raises(UnsafeDataDir, match="others may have read"):
        EmbeddedValkey(tmp_path).start()
    r = subprocess.run(
        [BIN, "list", "ws", "s", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and "others may have read the Valkey password" in r.stderr
    assert server.password not in r.stderr
    password_file.unlink()  # the remedy the message gives: a new password at the next start
    with EmbeddedValkey(tmp_path) as again:
        assert again.password != server.password


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_a_password_file_of_another_user_is_refused(tmp_path: Path) -> None:
    with EmbeddedValkey(tmp_path):
        pass
    os.chown(tmp_path / "valkey.password", 65534, 65534)
    with pytest.raises(UnsafeDataDir, match="this user's"):
        read_password(tmp_path)
    os.chown(tmp_path, 65534, 65534)
    with pytest.raises(UnsafeDataDir, match="not to this user"):
        EmbeddedValkey(tmp_path).start()


def test_no_log_line_carries_the_password(tmp_path: Path) -> None:
    # The CLI starts its own server, and once one runs, attaches to it: both log the URL.
    started = subprocess.run(
        [BIN, "list", "ws", "s", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    password = (tmp_path / "valkey.password").read_text().strip()
    assert started.returncode == 0, started.stderr
    assert "valkey://:***@127.0.0.1:" in started.stderr
    with EmbeddedValkey(tmp_path):
        attached = subprocess.run(
            [BIN, "list", "ws", "s", "--data-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert "already running" in attached.stderr and "valkey://:***@" in attached.stderr
    for out in (started, attached):
        assert password not in out.stdout + out.stderr
    assert password not in (tmp_path / "valkey.log").read_text()


def test_maxmemory_defaults_to_a_quarter_of_memory_capped_and_can_be_set(tmp_path: Path) -> None:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < default_maxmemory() <= min(total // 4, MAXMEMORY_CAP)
    with EmbeddedValkey(tmp_path / "a") as server:
        config = valkey.Valkey.from_url(server.url).config_get("maxmemory*")
        assert int(config["maxmemory"]) == default_maxmemory()
        assert config["maxmemory-policy"] == "noeviction"
    with EmbeddedValkey(tmp_path / "b", maxmemory=64 * 1024**2) as server:
        assert valkey.Valkey.from_url(server.url).config_get("maxmemory") == {
            "maxmemory": str(64 * 1024**2)
        }
    r = subprocess.run(
        [BIN, "list", "ws", "s", "--data-dir", str(tmp_path / "c"), "--valkey-maxmemory", "96mb"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0 and f"maxmemory {96 * 1024**2} bytes" in r.stderr


def test_a_full_embedded_server_refuses_writes_past_maxmemory(tmp_path: Path) -> None:
    # What the accept ceiling stays below (tests/test_memory_ceiling.py): noeviction refuses.
    with EmbeddedValkey(tmp_path, maxmemory=4 * 1024**2) as server:
        client = valkey.Valkey.from_url(server.url)
        with pytest.raises(ResponseError, match="maxmemory"):
            for i in range(1000):
                client.set(f"k{i}", "x" * 10_000)
