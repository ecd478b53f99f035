"""connect(): a cluster client that survives a failover: its slot table through the MOVED
storm, and the commands of other tasks while it rebuilds that table. Each workaround has a
test of the library bug it exists for: when a valkey-py release fixes one, that test fails, and
the workaround in storage/compat.py can go."""

from __future__ import annotations

from typing import Any

import pytest
from valkey.asyncio import Connection, SSLConnection, UnixDomainSocketConnection
from valkey.asyncio.cluster import ClusterNode, NodesManager, ValkeyCluster
from valkey.cluster import PRIMARY, REPLICA
from valkey.exceptions import ConnectionError, DataError, MovedError, NoScriptError

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
    # fails, and FailoverNodesManager._update_moved_slots (storage/compat.py) can go.
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


def test_a_standalone_connection_is_the_librarys_own_packing_in_c(
    valkey_server: EmbeddedValkey,
) -> None:
    # The cluster workarounds are for the cluster client's rebuild; a standalone client never
    # rebuilds. Its connection is valkey-py's own, with the packing done by libvalkey.
    kind = connect(valkey_server.url).connection_pool.connection_class
    assert issubclass(kind, Connection) and kind is not Connection
    assert kind.pack_command is not Connection.pack_command


_ARGUMENTS: list[tuple[Any, ...]] = [
    ("SET", "k", "v"),
    (b"EVALSHA", "a" * 40, 2, "outboxq:{w}:s", b"bytes", 1.5, -3, 10**20, "é😀"),
    ("CONFIG GET", "maxmemory"),  # a two-word command name is two arguments
    (b"CLIENT SETNAME", b"x"),
    ("SET", "big", "x" * 70_000),  # past valkey-py's 6 000-byte chunking
    ("SET", "view", memoryview(b"abc")),
]


@pytest.mark.parametrize("args", _ARGUMENTS, ids=lambda a: str(a[0])[:14])
def test_the_c_packer_sends_the_bytes_valkey_py_would(args: tuple[Any, ...]) -> None:
    ours = connect("valkey://127.0.0.1:1").connection_pool.connection_class()
    theirs = Connection()
    assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args))
    both = [args, ("WAITAOF", 1, 0, 5000)]
    assert b"".join(ours.pack_commands(both)) == b"".join(theirs.pack_commands(both))


@pytest.mark.parametrize("bad", [True, None, bytearray(b"x")])
def test_what_is_no_argument_is_the_same_data_error(bad: Any) -> None:
    ours = connect("valkey://127.0.0.1:1").connection_pool.connection_class()
    with pytest.raises(DataError):
        Connection().pack_command("SET", "k", bad)
    with pytest.raises(DataError):
        ours.pack_command("SET", "k", bad)


def test_another_encoding_keeps_valkey_pys_packer() -> None:
    # libvalkey encodes text as strict UTF-8 only.
    kind = connect("valkey://127.0.0.1:1").connection_pool.connection_class
    ours, theirs = kind(encoding="latin-1"), Connection(encoding="latin-1")
    assert ours.pack_command("SET", "k", "é") == theirs.pack_command("SET", "k", "é")
    assert b"\xe9" in b"".join(ours.pack_command("SET", "k", "é"))


def test_every_scheme_gets_its_transport_and_a_class_of_the_callers_own_is_kept() -> None:
    tls = connect("valkeys://127.0.0.1:1").connection_pool.connection_class
    unix = connect("unix:///tmp/nowhere.sock").connection_pool.connection_class
    assert issubclass(tls, SSLConnection) and tls is not SSLConnection
    assert issubclass(unix, UnixDomainSocketConnection) and unix is not UnixDomainSocketConnection
    own = connect("valkey://127.0.0.1:1", connection_class=_Own).connection_pool
    assert own.connection_class is _Own


class _Own(Connection):
    """A caller's own connection class."""


async def test_a_client_that_packs_in_c_round_trips(valkey_server: EmbeddedValkey) -> None:
    client = connect(valkey_server.url)
    try:
        await client.set("k:é", "😀" * 5_000)
        assert await client.get("k:é") == "😀".encode() * 5_000
        async with client.pipeline(transaction=False) as pipe:
            pipe.eval("return ARGV[1]", 0, "é")
            pipe.strlen("k:é")
            assert await pipe.execute() == ["é".encode(), 20_000]
    finally:
        await client.aclose()
