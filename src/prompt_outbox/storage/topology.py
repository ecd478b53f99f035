"""Standalone server or Valkey Cluster, decided once: the operations that differ between them.

``topology_of(client)`` is the one place storage asks which kind of client it has; what it
returns is passed on, and a module holding it does not ask ``isinstance(client,
ValkeyCluster)`` again (tests/test_topology.py keeps it so). Each operation makes the same
Valkey calls, in the same order, as the code it replaced (tests/test_round_trips.py counts
them).

Who builds it: the Store, once, and hands it to what it builds (``DueIndex``,
``MemoryCeiling``, ``waitaof.confirm``) and to its callers (the run loop's and the feed's
``ShardSubscriber``) and to ``resolve_durability``; durability.py's public checks, which are
handed a client, once per check. The Store reads ``one_node`` once, when it is built, to
choose how a transition and its due mark travel (store.py); no other module branches on the
kind.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any

from valkey.asyncio import Valkey
from valkey.asyncio.cluster import ValkeyCluster
from valkey.commands.core import AsyncScript
from valkey.typing import ScriptTextT

from .autopipe import AutoPipeline
from .client import Client, address


class Topology(ABC):
    """What a standalone server and a cluster do differently (see the module's docstring)."""

    one_node: bool
    """Every key on one node (a standalone server): a script may name keys of any slot, and a
    pipeline is one connection whose commands, scripts included, run in order. False on a
    cluster, whose keys live in slots across nodes and whose pipeline refuses scripts."""

    @property
    @abstractmethod
    def client(self) -> Client:
        """The client this topology was decided for."""

    @abstractmethod
    async def config_per_primary(self, *names: str) -> dict[str, dict[Any, Any]]:
        """``CONFIG GET names`` on every primary: its address -> its answer."""

    @abstractmethod
    async def info_per_primary(self, section: str) -> dict[str, dict[str, Any]]:
        """``INFO section`` on every primary: its address -> its answer."""

    @abstractmethod
    def connection_settings(self) -> tuple[dict[str, Any], Any]:
        """The options a new connection to one of its nodes takes, and its connection class."""

    @abstractmethod
    async def on_one_connection(self, key: str, *commands: tuple[Any, ...]) -> list[Any]:
        """``commands`` on one connection to the node that owns ``key``; the answers, errors
        included (never raised)."""

    @abstractmethod
    async def key_per_primary(self, tries: int) -> dict[str, str]:
        """A key in the slots of each primary: its address -> the key (``outboxprobe:{n}``,
        at most ``tries`` tags tried)."""

    @abstractmethod
    async def run_each(
        self, script: AsyncScript, calls: list[tuple[list[str], list[str | int]]]
    ) -> list[Any]:
        """``script`` once per (keys, args) of ``calls``; the replies in order (an error
        raises)."""

    @abstractmethod
    async def in_order(self, *fills: Callable[[Any], None]) -> list[Any]:
        """Each fill queues commands on a pipeline it is given; the answers of all, in order,
        with every command of a fill run after every command of the fills before it (an error
        raises)."""

    @abstractmethod
    def connection_settings_at(self, host: str, port: int) -> tuple[dict[str, Any], Any]:
        """A copy of ``connection_settings`` for a new connection to the node at ``host`` /
        ``port`` (one server: its own address, which through Sentinel is asked anew)."""

    @abstractmethod
    def single_address(self) -> str | None:
        """The one server's ``host:port`` (through Sentinel, the primary found last); None
        on a cluster, whose nodes are found by slot."""

    @abstractmethod
    def primary_nodes(self) -> list[tuple[Any, str]]:
        """Each primary as (node, name) for ``info_of``; one server: ``[(None, "")]``."""

    @abstractmethod
    def node_of(self, key: str) -> tuple[Any, str]:
        """The node that owns ``key`` as (node, name); one server (or a slot no node
        serves yet): ``(None, "")``."""

    async def info_of(self, node: Any, section: str) -> dict[str, Any]:
        """``INFO section`` of ``node`` (from ``primary_nodes`` / ``node_of``; None: the
        client's default node)."""
        if node is None:
            info: dict[str, Any] = await self.client.info(section)
            return info
        answer = await self.client.info(section, target_nodes=node)
        if len(answer) == 1 and isinstance(next(iter(answer.values())), dict):
            [answer] = answer.values()  # keyed by the node's name
        return dict(answer)

    @abstractmethod
    async def load_scripts(self, sources: list[ScriptTextT]) -> None:
        """SCRIPT LOAD each source on every primary."""

    @abstractmethod
    def auto_pipeline(self, load_scripts: Callable[[], Awaitable[None]]) -> AutoPipeline | None:
        """The pipeline that batches concurrent script calls (autopipe.py), or None where
        scripts run alone (a cluster refuses scripts in a pipeline)."""


class Standalone(Topology):
    """One server (through Sentinel too: the primary it finds)."""

    one_node = True

    def __init__(self, client: Valkey) -> None:
        self._client = client

    @property
    def client(self) -> Valkey:
        """The standalone client."""
        return self._client

    async def config_per_primary(self, *names: str) -> dict[str, dict[Any, Any]]:
        """See ``Topology``."""
        config = await self._client.config_get(*names)  # type: ignore[arg-type]
        return {address(self._client): config}  # after the call: through Sentinel, the primary

    async def info_per_primary(self, section: str) -> dict[str, dict[str, Any]]:
        """See ``Topology``."""
        info = await self._client.info(section)
        return {address(self._client): info}

    def connection_settings(self) -> tuple[dict[str, Any], Any]:
        """See ``Topology``."""
        pool = self._client.connection_pool
        return pool.connection_kwargs, pool.connection_class

    async def on_one_connection(self, key: str, *commands: tuple[Any, ...]) -> list[Any]:
        """See ``Topology`` (one server: any connection of the pool)."""
        plain = self._client.pipeline(transaction=False)
        for command in commands:
            plain.execute_command(*command)
        return list(await plain.execute(raise_on_error=False))

    async def key_per_primary(self, tries: int) -> dict[str, str]:
        """See ``Topology`` (one primary, no call)."""
        return {address(self._client): "outboxprobe:{0}"}

    async def run_each(
        self, script: AsyncScript, calls: list[tuple[list[str], list[str | int]]]
    ) -> list[Any]:
        """See ``Topology`` (one pipeline)."""
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            await script(keys=keys, args=args, client=pipe)
        return list(await pipe.execute(raise_on_error=True))

    async def in_order(self, *fills: Callable[[Any], None]) -> list[Any]:
        """See ``Topology`` (one pipeline: one connection runs its commands in order)."""
        pipe = self._client.pipeline(transaction=False)
        for fill in fills:
            fill(pipe)
        return list(await pipe.execute(raise_on_error=True))

    def connection_settings_at(self, host: str, port: int) -> tuple[dict[str, Any], Any]:
        """See ``Topology``."""
        kwargs, kind = self.connection_settings()
        return dict(kwargs), kind

    def single_address(self) -> str:
        """See ``Topology``."""
        return address(self._client)

    def primary_nodes(self) -> list[tuple[Any, str]]:
        """See ``Topology``."""
        return [(None, "")]

    def node_of(self, key: str) -> tuple[Any, str]:
        """See ``Topology``."""
        return None, ""

    async def load_scripts(self, sources: list[ScriptTextT]) -> None:
        """See ``Topology`` (one pipeline)."""
        loading = self._client.pipeline(transaction=False)
        for source in sources:
            loading.script_load(source)
        await loading.execute()

    def auto_pipeline(self, load_scripts: Callable[[], Awaitable[None]]) -> AutoPipeline:
        """See ``Topology``."""
        return AutoPipeline(self._client, load_scripts)


class Cluster(Topology):
    """A Valkey Cluster: calls aimed at nodes by slot, or sent to every primary."""

    one_node = False

    def __init__(self, client: ValkeyCluster) -> None:
        self._client = client

    @property
    def client(self) -> ValkeyCluster:
        """The cluster client."""
        return self._client

    async def config_per_primary(self, *names: str) -> dict[str, dict[Any, Any]]:
        """See ``Topology``."""
        primaries = ValkeyCluster.PRIMARIES
        raw: dict[str, dict[Any, Any]] = await self._client.config_get(
            *names,  # type: ignore[arg-type]
            target_nodes=primaries,
        )
        return raw

    async def info_per_primary(self, section: str) -> dict[str, dict[str, Any]]:
        """See ``Topology``."""
        raw: dict[str, dict[str, Any]] = await self._client.info(
            section, target_nodes=ValkeyCluster.PRIMARIES
        )
        return raw

    def connection_settings(self) -> tuple[dict[str, Any], Any]:
        """See ``Topology``."""
        kwargs = self._client.get_connection_kwargs()
        return kwargs, kwargs.get("connection_class")

    async def on_one_connection(self, key: str, *commands: tuple[Any, ...]) -> list[Any]:
        """See ``Topology`` (a pipeline aimed at the key's node)."""
        node = self._client.get_node_from_key(key)
        pipe: Any = self._client.pipeline()
        for command in commands:
            pipe.execute_command(*command, target_nodes=node)
        # No redirections: a write re-sent alone would land on another connection.
        return list(await pipe.execute(raise_on_error=False, allow_redirections=False))

    async def key_per_primary(self, tries: int) -> dict[str, str]:
        """See ``Topology`` (the slot table read first, then keys tried until each primary
        that has slots has one)."""
        await self._client.initialize()
        targets: dict[str, str] = {}
        primaries = {node.name for node in self._client.get_primaries()}
        for n in range(tries):
            key = f"outboxprobe:{{{n}}}"
            node = self._client.get_node_from_key(key)
            if node is not None:
                targets.setdefault(node.name, key)
            if primaries <= targets.keys():
                break
        return targets

    async def run_each(
        self, script: AsyncScript, calls: list[tuple[list[str], list[str | int]]]
    ) -> list[Any]:
        """See ``Topology`` (concurrent calls: the cluster refuses scripts in a pipeline)."""
        return list(await asyncio.gather(*(script(keys=k, args=a) for k, a in calls)))

    async def in_order(self, *fills: Callable[[Any], None]) -> list[Any]:
        """See ``Topology`` (a pipeline per fill, one after the other: a cluster's pipeline
        spans nodes, with no order between them)."""
        answers: list[Any] = []
        for fill in fills:
            pipe = self._client.pipeline(transaction=False)
            fill(pipe)
            answers += await pipe.execute(raise_on_error=True)
        return answers

    def connection_settings_at(self, host: str, port: int) -> tuple[dict[str, Any], Any]:
        """See ``Topology``."""
        kwargs, kind = self.connection_settings()
        return {**kwargs, "host": host, "port": port}, kind

    def single_address(self) -> None:
        """See ``Topology``."""
        return None

    def primary_nodes(self) -> list[tuple[Any, str]]:
        """See ``Topology`` (the slot table the client holds)."""
        return [(node, str(node.name)) for node in self._client.get_primaries()]

    def node_of(self, key: str) -> tuple[Any, str]:
        """See ``Topology``."""
        node = self._client.get_node_from_key(key)
        return (None, "") if node is None else (node, str(node.name))

    async def load_scripts(self, sources: list[ScriptTextT]) -> None:
        """See ``Topology`` (one call at a time: the cluster client sends each to every
        primary)."""
        for source in sources:
            await self._client.script_load(source)

    def auto_pipeline(self, load_scripts: Callable[[], Awaitable[None]]) -> None:
        """See ``Topology`` (none: every script call runs alone)."""
        return None


def topology_of(client: Client) -> Topology:
    """The topology of ``client``: the one place storage asks which kind of client it has."""
    if isinstance(client, ValkeyCluster):
        return Cluster(client)
    return Standalone(client)
