"""The accept path's memory ceiling: accepts stop while a node's ``used_memory`` is at or past
``ratio`` x its ``maxmemory``, so that the transitions that move entries on and free room
(stage, complete, restore...) still have the rest.

Valkey with ``maxmemory-policy noeviction`` refuses a script's first write once
``used_memory`` passes ``maxmemory`` (deliveries included, part-way through: a complete.lua
that removed the entry and is refused its claim marker). So the ceiling is below it. The
reading (INFO memory) is cached per node for ``interval`` seconds: an accept pays no round
trip for it but once an interval per node (concurrent accepts share that read). A server
without ``maxmemory`` (0) has no ceiling; it is read again each interval, so a
``CONFIG SET maxmemory`` is seen within one.

The same reading sizes the byte budgets (a workspace's, a token's): a share of the node's
``maxmemory``, or of the machine's memory (``total_system_memory``) on a server without one,
the most it could take before the kernel stops it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from valkey.exceptions import ResponseError

from ..core.keys import SessionKeys
from .topology import Topology

log = logging.getLogger("prompt_outbox.storage")


@dataclass(frozen=True, slots=True)
class Memory:
    """One node's INFO memory: ``used`` and ``limit`` (maxmemory; 0: none) in bytes, when it
    was read (``time.monotonic``), and the machine's memory (``system``; 0: not said)."""

    used: int
    limit: int
    read_at: float
    system: int = 0

    def over(self, ratio: float) -> bool:
        """Whether accepts must stop: a maxmemory, and ``used`` at ``ratio`` of it or past."""
        return self.limit > 0 and self.used >= ratio * self.limit

    @property
    def basis(self) -> int:
        """What the byte budgets are shares of: ``maxmemory``, or with none the machine's
        memory (0: neither is known, and there is no budget)."""
        return self.limit or self.system

    def budget(self, share: float) -> int:
        """``share`` of ``basis`` in bytes, at least 1 (0: no budget)."""
        return max(1, int(share * self.basis)) if self.basis else 0


class MemoryCeiling:
    """Per node cached INFO memory readings, and the ceiling check on them (``Store.accept``)."""

    def __init__(
        self,
        topology: Topology,
        ratio: float,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topology = topology
        self.ratio = ratio
        self.interval = interval
        self._clock = clock
        self._readings: dict[str, Memory] = {}
        self._reads: dict[str, asyncio.Lock] = {}
        self._unreadable: set[str] = set()

    async def prime(self) -> None:
        """Read every primary now (``Outbox.check_durability`` does, before the first accept),
        so that no accept of the first interval pays the read."""
        for node, name in self.topology.primary_nodes():
            await self._read(node, name)

    async def over(self, k: SessionKeys) -> Memory | None:
        """The reading of the node that owns the session's slot if accepts must stop there,
        else None."""
        memory = await self.reading(k.queue)
        return memory if memory.over(self.ratio) else None

    async def reading(self, key: str) -> Memory:
        """The reading of the node that owns ``key``'s slot (cached ``interval``)."""
        node, name = self.topology.node_of(key)
        memory = self._readings.get(name)
        if memory is None or self._clock() - memory.read_at >= self.interval:
            memory = await self._read(node, name)
        return memory

    async def _read(self, node: Any, name: str) -> Memory:
        # One read per node at a time: the accepts that find it stale meanwhile wait for it.
        async with self._reads.setdefault(name, asyncio.Lock()):
            memory = self._readings.get(name)
            if memory is not None and self._clock() - memory.read_at < self.interval:
                return memory
            try:
                info = await self.topology.info_of(node, "memory")
            except ResponseError as exc:
                # INFO refused (an ACL without it, a renamed command): no ceiling to keep.
                if name not in self._unreadable:
                    log.warning("cannot read INFO memory (%s): no memory ceiling on %r", exc, name)
                    self._unreadable.add(name)
                info = {}
            memory = Memory(
                int(info.get("used_memory", 0)),
                int(info.get("maxmemory", 0)),
                self._clock(),
                int(info.get("total_system_memory", 0)),
            )
            self._readings[name] = memory
            return memory
