"""A primary and one replica from the bundled binary, for replicated-durability tests.

Both durable (``appendonly yes``, no RDB snapshots, ``noeviction``), each in its own directory,
on free loopback ports. ``start()`` returns once the initial sync is over (the replica's link is
up, the primary lists it ``state=online``, and the replica's post-sync AOF rewrite is done), so
``WAITAOF 1 1`` counts it at once. Freeze (SIGSTOP) the replica to make ``WAITAOF`` time out,
SIGKILL the primary and promote the replica (``REPLICAOF NO ONE``) to stage a failover.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import valkey

from prompt_outbox.embedded import answers_ping, free_port
from prompt_outbox.storage.compat import valkey_server_binary
from tests.support.waiting import within

Fsync = Literal["always", "everysec", "no"]

# Replication settings for tests: no 5 s wait before a diskless initial sync.
REPLICATION_FLAGS = ["--repl-diskless-sync-delay", "0", "--repl-diskless-load", "on-empty-db"]


def node_client(port: int, timeout: float = 10.0) -> valkey.Valkey:
    """A plain synchronous client of one server (setup, checks, operator commands)."""
    return valkey.Valkey(host="127.0.0.1", port=port, socket_timeout=timeout)


def info(port: int, section: str) -> dict[str, Any]:
    """``INFO <section>`` as valkey-py parses it (numbers as int, ``slave0`` as a dict)."""
    with node_client(port) as node:
        return dict(node.info(section))


def wait_until(check: Callable[[], bool], timeout: float, what: str, step: float = 0.02) -> None:
    """Poll ``check`` (connection errors count as "not yet") until true or ``timeout``."""

    def ready() -> bool:
        with contextlib.suppress(valkey.ValkeyError, OSError):
            return check()
        return False

    if not within(ready, timeout, interval=step):
        raise TimeoutError(f"{what}: not within {timeout}s")


def replica_synced(replica_port: int) -> bool:
    """The replica's link is up, its initial sync is loaded and its AOF rewritten."""
    repl = info(replica_port, "replication")
    persistence = info(replica_port, "persistence")
    return (
        repl.get("master_link_status") == "up"
        and repl.get("master_sync_in_progress") == 0
        and persistence.get("aof_rewrite_in_progress") == 0
        and persistence.get("aof_rewrite_scheduled") == 0
        and persistence.get("loading") == 0
    )


def online_replica_ports(primary_port: int) -> list[int]:
    """Ports of the replicas the primary lists ``state=online`` (initial sync finished)."""
    return [
        int(value["port"])
        for name, value in info(primary_port, "replication").items()
        if re.fullmatch(r"slave\d+", name) and value.get("state") == "online"
    ]


def settle_replication(
    primary_port: int, replicas: int, timeout: float, key: str = "replication:settle"
) -> None:
    """One write acknowledged by ``WAIT``, leaving no key behind: the end of "ready".

    A replica listed ``state=online`` may not be streamed to yet: after a diskless sync the
    primary starts the command stream on the replica's first ACK after it noticed the transfer
    ended ("Waiting for REPLCONF ACK from replica to enable streaming" in its log), and if that
    ACK came early the next one is the once-a-second one. Measured here: this WAIT took ~0.9 s
    in about one start in three, and without it the first ``WAITAOF 1 1`` took ~1.9 s in
    about one start in five, even with ``appendfsync always`` on both sides."""
    with node_client(primary_port) as primary:
        primary.set(key, "1")
        primary.delete(key)
        acked = primary.execute_command("WAIT", replicas, int(timeout * 1000))
    if acked < replicas:
        raise TimeoutError(f"WAIT {replicas}: only {acked} replicas acknowledged")


def spawn(folder: Path, port: int, flags: list[str]) -> subprocess.Popen[bytes]:
    """Start ``valkey-server`` on 127.0.0.1:``port``, data and log in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(valkey_server_binary()),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(folder),
        "--save", "",
        "--maxmemory-policy", "noeviction",
        *flags,
    ]  # fmt: skip
    with (folder / "valkey.log").open("ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def halt(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop a server for good: wake it if frozen, SIGTERM, SIGKILL if it will not exit."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGCONT)  # a SIGSTOPped server would sit on the SIGTERM
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ReplicatedPair:
    """One primary and one replica, both with ``appendonly yes``. Use as a context manager,
    or ``start()`` / ``stop()`` (``stop()`` is safe after any failure or kill)."""

    def __init__(
        self, root: Path, *, primary_fsync: Fsync = "everysec", replica_fsync: Fsync = "everysec"
    ) -> None:
        self.root = root
        self.primary_fsync = primary_fsync
        self.replica_fsync = replica_fsync
        self.primary_port = free_port()
        self.replica_port = free_port()
        self.primary_proc: subprocess.Popen[bytes] | None = None
        self.replica_proc: subprocess.Popen[bytes] | None = None

    @property
    def primary_url(self) -> str:
        return f"valkey://127.0.0.1:{self.primary_port}/0"

    @property
    def replica_url(self) -> str:
        return f"valkey://127.0.0.1:{self.replica_port}/0"

    def start(self, timeout: float = 20.0) -> None:
        """Start both and wait until the initial sync is over; on failure, stop both."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        durable = ["--appendonly", "yes", *REPLICATION_FLAGS]
        self.primary_proc = spawn(
            self.root / "primary",
            self.primary_port,
            [*durable, "--appendfsync", self.primary_fsync],
        )
        wait_until(lambda: answers_ping(self.primary_port), timeout, "primary PING")
        self.replica_proc = spawn(
            self.root / "replica",
            self.replica_port,
            [*durable, "--appendfsync", self.replica_fsync],
        )
        wait_until(lambda: answers_ping(self.replica_port), timeout, "replica PING")
        # The command connects at once; ``--replicaof`` would wait for the next cron second.
        with node_client(self.replica_port) as replica:
            replica.execute_command("REPLICAOF", "127.0.0.1", self.primary_port)
        wait_until(lambda: replica_synced(self.replica_port), timeout, "replica sync")
        wait_until(
            lambda: self.replica_port in online_replica_ports(self.primary_port),
            timeout,
            "primary lists the replica state=online",
        )
        settle_replication(self.primary_port, 1, timeout)

    def stop(self) -> None:
        for proc in (self.replica_proc, self.primary_proc):
            if proc is not None:
                halt(proc)

    def kill_primary(self) -> None:
        """SIGKILL the primary, as a crash would (nothing flushed, no goodbye to the replica)."""
        assert self.primary_proc is not None
        if self.primary_proc.poll() is None:
            self.primary_proc.kill()
            self.primary_proc.wait()

    def promote_replica(self, timeout: float = 10.0) -> None:
        """``REPLICAOF NO ONE`` on the replica, then wait until it accepts a write."""
        with node_client(self.replica_port) as replica:
            replica.execute_command("REPLICAOF", "NO", "ONE")

            def writable() -> bool:
                replica.set("replicated-pair:promoted", "1")
                return True

            wait_until(writable, timeout, "promoted replica accepts writes")

    def freeze_replica(self) -> None:
        """SIGSTOP the replica: it neither applies nor fsyncs nor acknowledges anything."""
        assert self.replica_proc is not None
        self.replica_proc.send_signal(signal.SIGSTOP)

    def thaw_replica(self) -> None:
        assert self.replica_proc is not None
        self.replica_proc.send_signal(signal.SIGCONT)

    def wait_caught_up(self, timeout: float = 10.0) -> None:
        """Wait until the replica has applied everything the primary has written so far."""

        def caught_up() -> bool:
            target = int(info(self.primary_port, "replication")["master_repl_offset"])
            done = int(info(self.replica_port, "replication")["slave_repl_offset"])
            return done >= target

        wait_until(caught_up, timeout, "replica caught up")

    def __enter__(self) -> ReplicatedPair:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
