"""Sharded subscriptions: any number of shard channels (SSUBSCRIBE) over a few connections.

A ``ShardSubscriber`` keeps a changing set of channels subscribed and calls ``on_notice`` for
what arrives: ``(channel, message)`` for each SPUBLISH, and ``(channel, None)`` each time a
subscription is (re)confirmed, meaning "anything published before now may have been missed:
look at the source of truth". That second kind is what makes pub/sub (at most once) safe to
build on: a caller that re-reads on ``None`` loses latency on a broken connection, never data.

Connections: one on a standalone server; on a cluster one per primary that owns the slot of a
subscribed channel (a shard channel lives on its slot's primary only). The asyncio cluster
client has no pub/sub, so each link is a plain connection made with the client's own options.
The slot map is this module's, read with CLUSTER SLOTS and patched by MOVED replies: when a
slot moves, its old owner pushes ``sunsubscribe``; the link asks again, the old owner answers
MOVED with the new address, and the channel follows it. A link that fails hands its channels
back, and they are routed again (after a fresh CLUSTER SLOTS) after ``retry_after``, doubled
at each failure in a row up to 20 times that (a server down is not asked 2 times a second).

Not a queue: ``on_notice`` runs synchronously on the reading task, so it must be quick (set
flags, wake tasks) and there is nothing to buffer. Channel names are general: the event feed
(``feed.py``) subscribes session logs; anything else may subscribe its own channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from valkey.asyncio.connection import AbstractConnection, Connection
from valkey.crc import key_slot
from valkey.exceptions import MovedError

from ..core.stopping import loss_level
from .client import Client
from .topology import Topology

log = logging.getLogger("prompt_outbox.storage")

Notice = Callable[[str, str | None], None]
Address = tuple[str, int]

# What a node connection is not built with: pool and client settings, not connection ones.
_NOT_CONNECTION_KWARGS = ("connection_class", "max_connections", "response_callbacks")


def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _own_task(work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """A task of the subscriber's, whichever caller's ``add`` started it: in a context of
    its own, so that its log records do not carry that caller's fields (an HTTP request's
    ID, ``core/logctx.py``) for as long as the process runs."""
    return asyncio.get_running_loop().create_task(work, context=contextvars.Context())


class ShardSubscriber:
    """Keeps ``channels`` subscribed, over one connection per node that owns one of them.

    ``add`` / ``discard`` may be called at any time (from the event loop); the subscription
    follows within a round trip. Nothing is connected while no channel is wanted. ``ping_every``
    bounds how long a silent link goes unchecked (a PING; no answer by the next check: the
    link is dropped and made again). ``aclose`` ends everything.
    """

    def __init__(
        self,
        topology: Topology,
        on_notice: Notice,
        *,
        ping_every: float = 5.0,
        retry_after: float = 0.5,
    ) -> None:
        self.topology = topology
        self.client: Client = topology.client
        self.on_notice = on_notice
        self.ping_every = ping_every
        self.retry_after = retry_after
        self.channels: set[str] = set()
        """The channels wanted now."""
        self._links: dict[Address, _Link] = {}
        self._route: dict[str, Address] = {}  # channel -> the link it was given to
        self._unrouted: set[str] = set()
        self._slots: dict[int, Address] | None = None  # cluster only; None: read it again
        self._kick = asyncio.Event()
        self._router: asyncio.Task[None] | None = None
        self._backoff = False
        self._delay = retry_after  # grows while failures follow each other
        self._closed = False

    @property
    def connections(self) -> int:
        """How many node connections are open now."""
        return sum(1 for link in self._links.values() if link.connected)

    def add(self, channel: str) -> None:
        """Subscribe ``channel`` (no-op if it is already wanted)."""
        if self._closed:
            raise RuntimeError("the subscriber is closed")
        if channel in self.channels:
            return
        self.channels.add(channel)
        self._unrouted.add(channel)
        self._wake_router()

    def discard(self, channel: str) -> None:
        """Unsubscribe ``channel`` (no-op if it is not wanted)."""
        if channel not in self.channels:
            return
        self.channels.discard(channel)
        self._unrouted.discard(channel)
        address = self._route.pop(channel, None)
        link = self._links.get(address) if address is not None else None
        if link is not None:
            link.drop(channel)

    async def aclose(self) -> None:
        """Unsubscribe everything and close every connection."""
        self._closed = True
        self.channels.clear()
        self._unrouted.clear()
        for link in self._links.values():
            # Also ends a link whose task swallowed the cancel below (valkey-py 6.2 asyncio
            # commands sometimes do): it finds nothing wanted and returns.
            link.channels.clear()
            link.kick.set()
        tasks = [t for t in (self._router, *(lk.task for lk in self._links.values())) if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._links.clear()
        self._route.clear()

    # -- called by the links (same module: one protocol split in two classes) -------------

    @property
    def closed(self) -> bool:
        return self._closed

    def notify(self, channel: str, message: str | None) -> None:
        """Call ``on_notice``; a failing callback is logged, never fatal to the link."""
        try:
            self.on_notice(channel, message)
        except Exception:
            log.exception("shard subscriptions: the notice callback failed")

    def connected_again(self) -> None:
        """A link subscribed: the next failure waits ``retry_after`` again."""
        self._delay = self.retry_after

    def moved(self, slot: int, address: Address) -> None:
        """A node answered MOVED for ``slot``: its channels go to the link at ``address``."""
        if self._slots is not None:
            self._slots[slot] = address
        for channel, at in list(self._route.items()):
            if at != address and key_slot(channel.encode()) == slot:
                old = self._links.get(at)
                if old is not None:
                    old.forget(channel)
                self._give(channel, address)

    def failed(self, link: _Link) -> None:
        """``link`` lost its connection: route its channels again, from a fresh slot map."""
        if self._links.get(link.address) is link:
            del self._links[link.address]
        for channel in link.channels:
            if self._route.get(channel) == link.address:
                del self._route[channel]
                self._unrouted.add(channel)
        link.channels.clear()
        self._slots = None
        self._backoff = True
        if self._unrouted:
            self._wake_router()

    def connection(self, address: Address) -> AbstractConnection:
        """A new connection to ``address`` with the client's options (auth, TLS, timeouts)."""
        kwargs, cls = self.topology.connection_settings_at(*address)
        for name in _NOT_CONNECTION_KWARGS:
            kwargs.pop(name, None)
        connection: AbstractConnection = (cls or Connection)(**kwargs)
        return connection

    # -- routing ---------------------------------------------------------------------------

    def _wake_router(self) -> None:
        self._kick.set()
        if self._router is None or self._router.done():
            self._router = _own_task(self._route_all())

    async def _route_all(self) -> None:
        """Give each unrouted channel to the link of the node that owns it; ends when none
        is left (started again by the next ``add`` or failure)."""
        while self._unrouted and not self._closed:
            self._kick.clear()
            if self._backoff:
                self._backoff = False
                await asyncio.sleep(self._delay)
                self._delay = min(self._delay * 2, self.retry_after * 20)
            try:
                owners = await self._owners(sorted(self._unrouted))
            except Exception as exc:  # the next attempt reads the map again
                log.warning("shard subscriptions: cannot read the slot map: %s", exc)
                self._slots, self._backoff = None, True
                continue
            for channel, address in owners.items():
                if channel in self._unrouted:
                    self._unrouted.discard(channel)
                    self._give(channel, address)

    async def _owners(self, channels: list[str]) -> dict[str, Address]:
        name = self.topology.single_address()
        if name is not None:
            # One node: the address only names the link (in logs). Through Sentinel it is the
            # primary found last: the link's connection asks the sentinels itself.
            host, _, port = name.rpartition(":")
            here = (host, int(port)) if port.isdigit() else (name, 0)
            return dict.fromkeys(channels, here)
        if self._slots is None:
            self._slots = await self._slot_map()
        out = {}
        for channel in channels:
            address = self._slots.get(key_slot(channel.encode()))
            if address is None:
                raise LookupError(f"no node serves the slot of {channel!r}")
            out[channel] = address
        return out

    async def _slot_map(self) -> dict[int, Address]:
        ranges: dict[tuple[int, int], dict[str, Any]] = await self.client.execute_command(
            "CLUSTER SLOTS"
        )
        slots: dict[int, Address] = {}
        for (start, end), nodes in ranges.items():
            host, port = nodes["primary"]
            for slot in range(int(start), int(end) + 1):
                slots[slot] = (_str(host), int(port))
        return slots

    def _give(self, channel: str, address: Address) -> None:
        self._route[channel] = address
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = _Link(self, address)
        link.want(channel)


class _Link:
    """One connection to one node and the channels routed to it. Its task connects,
    subscribes what is wanted, unsubscribes what is not, and ends when nothing is left."""

    def __init__(self, owner: ShardSubscriber, address: Address) -> None:
        self.owner = owner
        self.address = address
        self.channels: set[str] = set()  # wanted on this link
        self.subscribed: set[str] = set()  # asked for on the current connection
        self.unsubscribing: Counter[str] = Counter()  # SUNSUBSCRIBEs not answered yet
        self.connected = False
        self.kick = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def want(self, channel: str) -> None:
        self.channels.add(channel)
        self._wake()

    def drop(self, channel: str) -> None:
        self.channels.discard(channel)
        self._wake()

    def forget(self, channel: str) -> None:
        """The node no longer holds ``channel`` (its slot moved): no SUNSUBSCRIBE owed."""
        self.channels.discard(channel)
        self.subscribed.discard(channel)
        self._wake()

    def _wake(self) -> None:
        self.kick.set()
        if self.task is None or self.task.done():
            self.task = _own_task(self._run())

    async def _run(self) -> None:
        conn: AbstractConnection | None = None
        reader: asyncio.Task[None] | None = None
        try:
            if not self.channels:
                return
            conn = self.owner.connection(self.address)
            await conn.connect()  # type: ignore[no-untyped-call]
            if self.owner.closed:
                return
            self.connected = True
            reader = asyncio.get_running_loop().create_task(self._read(conn))
            while True:
                self.kick.clear()
                if not self.channels:
                    return  # closing the connection unsubscribes the rest
                await self._sync(conn)
                kicked = asyncio.ensure_future(self.kick.wait())
                await asyncio.wait({reader, kicked}, return_when=asyncio.FIRST_COMPLETED)
                kicked.cancel()
                if reader.done():
                    reader.result()  # raises what ended it
                    raise ConnectionError("the subscription connection ended")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Closing, or the process's own stop (its signal may have stopped the server
            # too): expected, so not a warning. A real loss is.
            level = loss_level(self.owner.closed)
            log.log(level, "shard subscriptions to %s:%s lost: %s", *self.address, exc)
            self.owner.failed(self)
        finally:
            self.connected = False
            self.subscribed.clear()
            self.unsubscribing.clear()
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(BaseException):
                    await reader
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.disconnect()
            # A channel wanted while this task was closing: start over (want() saw it running).
            if self.channels and not self.owner.closed:
                self.task = _own_task(self._run())

    async def _sync(self, conn: AbstractConnection) -> None:
        """Send the (S)SUBSCRIBEs and SUNSUBSCRIBEs that make the connection match ``channels``,
        in one write. A shard command names one slot's channels: one command per channel."""
        new = sorted(self.channels - self.subscribed)
        gone = sorted(self.subscribed - self.channels)
        if not new and not gone:
            return
        commands = [("SSUBSCRIBE", c) for c in new] + [("SUNSUBSCRIBE", c) for c in gone]
        self.subscribed.update(new)
        self.subscribed.difference_update(gone)
        self.unsubscribing.update(gone)
        await conn.send_packed_command(conn.pack_commands(commands), check_health=False)

    async def _read(self, conn: AbstractConnection) -> None:
        """Dispatch what the node pushes; PING a silent connection, give up on a dead one."""
        pinged = False
        while True:
            try:
                msg = await conn.read_response(timeout=self.owner.ping_every, push_request=True)
            except MovedError as moved:  # an SSUBSCRIBE sent to a node that lost the slot
                self.owner.moved(moved.slot_id, (moved.host, int(moved.port)))
                continue
            if msg is None:
                if pinged:
                    raise ConnectionError("no answer to PING")
                await conn.send_command("PING", check_health=False)
                pinged = True
                continue
            pinged = False
            if isinstance(msg, list) and len(msg) >= 3:
                self._dispatch(_str(msg[0]).lower(), _str(msg[1]), msg[2])

    def _dispatch(self, kind: str, channel: str, payload: Any) -> None:
        if kind == "smessage":
            if channel in self.channels:
                self.owner.notify(channel, _str(payload))
        elif kind == "ssubscribe":
            self.owner.connected_again()
            if channel in self.channels:
                self.owner.notify(channel, None)  # subscribed from now: look back once
        elif kind == "sunsubscribe":
            if self.unsubscribing[channel] > 0:
                self.unsubscribing[channel] -= 1
                if not self.unsubscribing[channel]:
                    del self.unsubscribing[channel]
            elif channel in self.channels:
                # The node dropped it by itself: its slot moved. Ask again; the node answers
                # MOVED with the new owner (moved() re-routes), or subscribes it again.
                self.subscribed.discard(channel)
                self.kick.set()
