"""A primary, two replicas and three sentinels, all from the bundled binary, on loopback.

Every data node is durable (``appendonly yes``, ``appendfsync always``, ``noeviction``) so that
``accept_durability replica`` holds there. The sentinels watch the service ``SERVICE`` with
a quorum of 2, and decide quickly (``down_after_ms``, ``failover_timeout_ms``): a test kills
the primary and waits for a replica to take over, not for defaults made for real networks.
``down_after_ms`` stays above a second: a sentinel pings every second at most, and a link it
opens counts as waiting for a reply from the start, so at 1000 ms or less it judged every
newly promoted primary down before its first ping and failed over a second time.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import TracebackType

from prompt_outbox.embedded import answers_ping, free_port
from tests.replication import (
    REPLICATION_FLAGS,
    halt,
    info,
    node_client,
    online_replica_ports,
    replica_synced,
    settle_replication,
    spawn,
    wait_until,
)

SERVICE = "outbox"


class SentinelGroup:
    """Use as a context manager (or ``start()`` / ``stop()``)."""

    def __init__(
        self, root: Path, *, down_after_ms: int = 1500, failover_timeout_ms: int = 3000
    ) -> None:
        self.root = root
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.data_ports = [free_port() for _ in range(3)]  # the first starts as the primary
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"valkey+sentinel://{hosts}/{SERVICE}"

    def start(self, timeout: float = 30.0) -> None:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, port: int) -> None:
        flags = ["--appendonly", "yes", "--appendfsync", "always", *REPLICATION_FLAGS]
        self.procs[port] = spawn(self.root / f"node{self.data_ports.index(port)}", port, flags)

    def _start(self, timeout: float) -> None:
        for port in self.data_ports:
            self._spawn(port)
        for port in self.data_ports:
            wait_until(lambda p=port: answers_ping(p), timeout, f"node {port} PING")  # type: ignore[misc]
        primary, *replicas = self.data_ports
        for port in replicas:
            with node_client(port) as node:
                node.execute_command("REPLICAOF", "127.0.0.1", primary)
        for port in replicas:
            wait_until(lambda p=port: replica_synced(p), timeout, f"replica {port} sync")  # type: ignore[misc]
        wait_until(
            lambda: set(replicas) <= set(online_replica_ports(primary)),
            timeout,
            "primary lists both replicas online",
        )
        settle_replication(primary, 2, timeout)
        for n, port in enumerate(self.sentinel_ports):
            folder = self.root / f"sentinel{n}"
            folder.mkdir(parents=True, exist_ok=True)
            conf = folder / "sentinel.conf"  # the sentinel rewrites it: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 2\n"
            )
            with (folder / "sentinel.log").open("ab") as log:
                self.procs[port] = subprocess.Popen(
                    [_binary(), str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT
                )
        # Ready: every sentinel knows both replicas and the two other sentinels.
        for port in self.sentinel_ports:
            wait_until(lambda p=port: self._sees_all(p), timeout, f"sentinel {port} ready")  # type: ignore[misc]

    def _sees_all(self, port: int) -> bool:
        with node_client(port) as sentinel:
            master = sentinel.sentinel_master(SERVICE)
        return bool(int(master["num-slaves"]) == 2 and int(master["num-other-sentinels"]) == 2)

    def primary_port(self) -> int:
        """The port the sentinels name as the primary now (asked of the first that answers)."""
        for port in self.sentinel_ports:
            try:
                with node_client(port, timeout=2) as sentinel:
                    _host, primary = sentinel.sentinel_get_master_addr_by_name(SERVICE)
                return int(primary)
            except OSError:
                continue
        raise RuntimeError("no sentinel answers")

    def kill_primary(self) -> int:
        """SIGKILL the primary (a crash: nothing flushed, no goodbye); its port."""
        port = self.primary_port()
        proc = self.procs[port]
        proc.kill()
        proc.wait()
        return port

    def wait_failover(self, old: int, timeout: float = 30.0) -> int:
        """Wait until every sentinel names a new primary and it takes writes; its port."""

        def moved() -> bool:
            ports = set()
            for port in self.sentinel_ports:
                with node_client(port, timeout=2) as sentinel:
                    ports.add(int(sentinel.sentinel_get_master_addr_by_name(SERVICE)[1]))
            return len(ports) == 1 and old not in ports

        wait_until(moved, timeout, "the sentinels fail over", step=0.1)
        new = self.primary_port()
        wait_until(lambda: info(new, "replication")["role"] == "master", timeout, "promoted")
        return new

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Start a killed node again on its own data: the sentinels make it a replica of the
        primary they chose; wait until that primary lists both replicas online and every
        sentinel sees them up (the next failover may pick either). The primary is asked again
        on each look: a loaded machine can stall a sentinel past ``down_after_ms`` and make
        it fail over once more on its own."""
        self._spawn(port)

        def rejoined() -> bool:
            primary = self.primary_port()
            others = {p for p in self.data_ports if p != primary}
            return others <= set(online_replica_ports(primary)) and all(
                self._replicas_up(s) for s in self.sentinel_ports
            )

        wait_until(rejoined, timeout, "the killed node rejoined as a replica", step=0.1)
        settle_replication(self.primary_port(), 2, timeout)

    def _replicas_up(self, port: int) -> bool:
        with node_client(port) as sentinel:
            replicas = sentinel.sentinel_slaves(SERVICE)
        up = [r for r in replicas if not (r["is_sdown"] or r["is_odown"])]
        return len(up) == 2

    def stop(self) -> None:
        for proc in self.procs.values():
            halt(proc)

    def __enter__(self) -> SentinelGroup:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _binary() -> str:
    from prompt_outbox.storage.compat import valkey_server_binary

    return str(valkey_server_binary())
