"""connect(): a cluster client that survives a failover: its slot table through the MOVED
storm, and the commands of other tasks while it rebuilds that table. Each workaround has a
test of the library bug it exists for: when a valkey-py release fixes one, that test fails, and
the workaround in storage/connect.py can go."""

from __future__ import annotations

from typing import Any

import pytest
from valkey.asyncio import Connection
from valkey.asyncio.cluster import ClusterNode, NodesManager, ValkeyCluster
from valkey.cluster import PRIMARY, REPLICA
from valkey.exceptions import ConnectionError, MovedError, NoScriptError

from prompt_outbox.storage.connect import connect
from prompt_outbox.storage.embedded import EmbeddedValkey
from tests.cluster import LocalCluster


def _after_failover(nodes: NodesManager) -> tuple[ClusterNode, ClusterNode]:
    old, new = ClusterNode("127.0.0.1", 1, PRIMARY), ClusterNode("127.0.0.1", 2, REPLICA)
    nodes.nodes_cache = {old.name: old, new.name: new}
    nodes.slots_cache = {7: [old, new]}
    return old, new


def test_one_moved_met_by_two_commands_is_applied_once() -> None:
    # Two commands in flight meet the same MOVED after a failover: valkey-py 6.2 applies it
    # twice, and the second time demotes the new primary (then SCRIPT LOAD skips it, and every
    # script on the shard answers NOSCRIPT). The client connect() builds applies it once.
    client = connect("valkey+cluster://127.0.0.1:1")
    assert isinstance(client, ValkeyCluster)
    nodes = client.nodes_manager
    old, new = _after_failover(nodes)
    for _ in range(2):
        nodes._moved_exception = MovedError("7 127.0.0.1:2")
        assert nodes.get_node_from_slot(7) is new
    assert new.server_type == PRIMARY and old.server_type == REPLICA
    assert nodes.get_nodes_by_server_type(PRIMARY) == [new]


def test_the_library_alone_demotes_the_new_primary() -> None:
    # The library bug the workaround exists for. When a valkey-py release fixes it, this test
    # fails, and _FailoverNodesManager's _update_moved_slots can go.
    nodes = NodesManager([ClusterNode("127.0.0.1", 1, PRIMARY)], False, {})
    _, new = _after_failover(nodes)
    for _ in range(2):
        nodes._moved_exception = MovedError("7 127.0.0.1:2")
        nodes.get_node_from_slot(7)
    assert new.server_type == REPLICA


async def _closed_under_a_write(client: ValkeyCluster) -> BaseException:
    """What a command meets when another task's table rebuild disconnects its connection as
    the write begins (valkey-py issue 185; the library writes in a task of its own, so the
    rebuild can run in between: with a socket timeout, as every client of ours has)."""
    await client.initialize()
    # A node with no connection yet (the client ran COMMAND on its default node).
    node = next(n for n in client.get_primaries() if n != client.get_default_node())
    kind = node.connection_class

    class Racing(kind):  # type: ignore[misc,valid-type]  # a class of the client's own kind
        async def _send_packed_command(self, command: Any) -> None:
            await self.disconnect()  # the other task's rebuild lands here, once the write began
            await super()._send_packed_command(command)

    node.connection_class = Racing
    try:
        await node.execute_command("PING")
    except BaseException as err:  # what it raised is the answer
        return err
    finally:
        node.connection_class = kind
        await client.aclose()
    raise AssertionError("the write met no closed connection")


async def test_a_connection_closed_under_a_write_is_a_connection_error(
    valkey_cluster: LocalCluster,
) -> None:
    # A ConnectionError is "Valkey unavailable": the client retries it, the service answers
    # 503. An AttributeError was an HTTP 500.
    client = connect(valkey_cluster.url, socket_timeout=5)  # as the service's (it writes in a task)
    assert isinstance(client, ValkeyCluster)
    err = await _closed_under_a_write(client)
    assert isinstance(err, ConnectionError), repr(err)
    assert "closed under the command" in str(err)


async def test_the_library_alone_raises_attribute_error_for_it(
    valkey_cluster: LocalCluster,
) -> None:
    client = ValkeyCluster.from_url(valkey_cluster.url.replace("+cluster", ""), socket_timeout=5)
    err = await _closed_under_a_write(client)
    assert isinstance(err, AttributeError), repr(err)


async def _pipeline_error_while_closing(client: ValkeyCluster) -> list[Any]:
    """A pipeline whose command fails, run while the client closes its nodes to rebuild the
    table (what a lost connection in another task starts)."""
    await client.initialize()
    await client.nodes_manager.aclose()
    pipe: Any = client.pipeline()
    pipe.execute_command("EVALSHA", "0" * 40, 1, "k")
    try:
        return list(await pipe.execute(raise_on_error=False))
    finally:
        await client.aclose()


async def test_a_pipeline_that_meets_an_error_while_the_table_closes_returns_it(
    valkey_cluster: LocalCluster,
) -> None:
    client = connect(valkey_cluster.url)
    assert isinstance(client, ValkeyCluster)
    [answer] = await _pipeline_error_while_closing(client)
    assert isinstance(answer, NoScriptError), answer


async def test_the_library_alone_loses_its_default_node_then(
    valkey_cluster: LocalCluster,
) -> None:
    client = ValkeyCluster.from_url(valkey_cluster.url.replace("+cluster", ""))
    with pytest.raises(AttributeError, match="name"):
        await _pipeline_error_while_closing(client)


def test_a_standalone_connection_is_the_librarys_own(valkey_server: EmbeddedValkey) -> None:
    # The workaround is for the cluster client's rebuild; a standalone client never rebuilds.
    client = connect(valkey_server.url)
    assert client.connection_pool.connection_class is Connection
