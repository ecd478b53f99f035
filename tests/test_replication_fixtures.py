"""The replicated-durability fixtures do what they say: the pair replicates, a frozen replica
makes WAITAOF time out, a promoted replica takes writes; the cluster has a replica per master,
fails over, and an EVALSHA + WAITAOF pipelined on one connection waits for the replica."""

from __future__ import annotations

import time

import pytest
import valkey
from valkey.asyncio.cluster import ValkeyCluster

from tests.cluster import LocalCluster, key_served_by, slot_table
from tests.replication import ReplicatedPair, node_client

pytest_plugins = ["tests.replication_fixtures"]

WRITE = "redis.call('SET', KEYS[1], ARGV[1]) return 1"


def test_the_pair_replicates_a_write(replicated_pair: ReplicatedPair) -> None:
    with (
        node_client(replicated_pair.primary_port) as primary,
        node_client(replicated_pair.replica_port) as replica,
    ):
        primary.set("k", "v")
        assert primary.execute_command("WAIT", 1, 2000) == 1
        assert replica.get("k") == b"v"
        assert primary.execute_command("WAITAOF", 1, 1, 3000) == [1, 1]
        with pytest.raises(valkey.exceptions.ReadOnlyError):
            replica.set("k", "w")


def test_a_frozen_replica_makes_waitaof_time_out(replicated_pair: ReplicatedPair) -> None:
    with node_client(replicated_pair.primary_port) as primary:
        replicated_pair.freeze_replica()
        try:
            primary.set("k", "v")
            started = time.monotonic()
            assert primary.execute_command("WAITAOF", 1, 1, 500) == [1, 0]
            assert time.monotonic() - started >= 0.5
        finally:
            replicated_pair.thaw_replica()
        assert primary.execute_command("WAITAOF", 1, 1, 3000) == [1, 1]


def test_a_promoted_replica_takes_writes_and_kept_the_acknowledged_ones(
    replicated_pair: ReplicatedPair,
) -> None:
    with node_client(replicated_pair.primary_port) as primary:
        primary.set("k", "v")
        assert primary.execute_command("WAITAOF", 1, 1, 3000) == [1, 1]
    replicated_pair.kill_primary()
    replicated_pair.promote_replica()
    with node_client(replicated_pair.replica_port) as promoted:
        assert promoted.get("k") == b"v"
        promoted.set("k", "w")
        assert promoted.info("replication")["role"] == "master"


async def test_the_replicated_cluster_fails_over_and_the_client_follows(
    replicated_cluster: LocalCluster,
) -> None:
    primaries = replicated_cluster.primaries()
    assert len(primaries) == 3
    replicas = {replicated_cluster.replica_of(p) for p in primaries}
    assert len(replicas) == 3 and not replicas & set(primaries)
    assert all(n == 1 for n in slot_table(primaries[0]).values())

    client = ValkeyCluster.from_url(replicated_cluster.url.replace("+cluster", ""))
    try:
        key = key_served_by(primaries[0])
        await client.set(key, "before")
        assert await client.execute_command(
            "WAITAOF", 1, 1, 3000, target_nodes=client.get_node_from_key(key)
        ) == [1, 1]
        promoted = replicated_cluster.failover(primaries[0])
        assert promoted in replicated_cluster.primaries()
        assert primaries[0] not in replicated_cluster.primaries()
        assert await client.get(key) == b"before"  # the client follows MOVED
        await client.set(key, "after")
        node = client.get_node_from_key(key)
        assert node is not None and int(node.port) == promoted
    finally:
        await client.aclose()


async def test_a_pipelined_evalsha_and_waitaof_share_one_connection(
    replicated_cluster: LocalCluster,
) -> None:
    """The way a durable accept can run on a cluster: the script and WAITAOF on one
    connection to the key's node, so WAITAOF waits for that script's write."""
    client = ValkeyCluster.from_url(replicated_cluster.url.replace("+cluster", ""))
    try:
        sha = await client.script_load(WRITE)
        key = "accept{ws}"
        node = client.get_node_from_key(key)
        assert node is not None

        async def accept(wait_ms: int) -> list[object]:
            pipe = client.pipeline()
            pipe.execute_command("CLIENT", "ID", target_nodes=node)
            pipe.execute_command("EVALSHA", sha, 1, key, "v")
            pipe.execute_command("WAITAOF", 1, 1, wait_ms, target_nodes=node)
            pipe.execute_command("CLIENT", "ID", target_nodes=node)
            return await pipe.execute(raise_on_error=False, allow_redirections=False)

        first_id, written, acks, last_id = await accept(3000)
        assert (written, acks) == (1, [1, 1]) and first_id == last_id

        replica = replicated_cluster.replica_of(int(node.port))
        replicated_cluster.freeze_node(replica)
        try:
            started = time.monotonic()
            first_id, written, acks, last_id = await accept(300)
            assert (written, acks) == (1, [1, 0]) and first_id == last_id
            assert time.monotonic() - started >= 0.3
        finally:
            replicated_cluster.thaw_node(replica)
    finally:
        await client.aclose()


@pytest.mark.slow
async def test_a_killed_master_is_replaced_by_its_replica(
    replicated_cluster: LocalCluster,
) -> None:
    victim = replicated_cluster.primaries()[1]
    heir = replicated_cluster.replica_of(victim)
    key = key_served_by(victim)
    client = ValkeyCluster.from_url(replicated_cluster.url.replace("+cluster", ""))
    try:
        await client.set(key, "acknowledged")
        node = client.get_node_from_key(key)
        assert await client.execute_command("WAITAOF", 1, 1, 3000, target_nodes=node) == [1, 1]
        replicated_cluster.kill_node(victim)
        replicated_cluster.wait_promoted(heir, timeout=20)
        assert await client.get(key) == b"acknowledged"
        await client.set(key, "after")
    finally:
        await client.aclose()
    with node_client(heir) as promoted:
        assert promoted.get(key) == b"after"
