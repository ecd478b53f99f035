"""connect(): a cluster client whose slot table survives a failover's MOVED storm."""

from __future__ import annotations

from valkey.asyncio.cluster import ClusterNode, NodesManager, ValkeyCluster
from valkey.cluster import PRIMARY, REPLICA
from valkey.exceptions import MovedError

from prompt_outbox.storage.connect import connect


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
    # fails, and _OnceMovedNodesManager in connect.py can go.
    nodes = NodesManager([ClusterNode("127.0.0.1", 1, PRIMARY)], False, {})
    _, new = _after_failover(nodes)
    for _ in range(2):
        nodes._moved_exception = MovedError("7 127.0.0.1:2")
        nodes.get_node_from_slot(7)
    assert new.server_type == REPLICA
