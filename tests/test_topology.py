"""storage/topology.py: standalone or cluster decided once; each operation reaches what it
names (every primary, the node that owns a key) on both kinds of server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from valkey.exceptions import ResponseError

from prompt_outbox.storage import topology as topology_module
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.topology import Cluster, Standalone, topology_of

pytestmark = pytest.mark.cluster_too


async def test_the_kind_is_the_clients(client: Client, server_kind: str) -> None:
    topology = topology_of(client)
    assert isinstance(topology, Cluster if server_kind == "cluster" else Standalone)
    assert topology.one_node is (server_kind != "cluster")
    assert topology.client is client


async def test_every_primary_answers_once(client: Client, server_kind: str) -> None:
    topology = topology_of(client)
    primaries = 3 if server_kind == "cluster" else 1
    configs = await topology.config_per_primary("maxmemory-policy")
    infos = await topology.info_per_primary("replication")
    assert len(configs) == primaries and configs.keys() == infos.keys()
    for config, info in zip(configs.values(), infos.values(), strict=True):
        assert {str(k, "utf-8") if isinstance(k, bytes) else k for k in config} == {
            "maxmemory-policy"
        }
        assert info["role"] == "master"
    kwargs, kind = topology.connection_settings()
    assert "host" in kwargs or server_kind == "cluster"
    assert isinstance(kind, type)
    # A key on each primary, and the node named is the one that owns it.
    keys = await topology.key_per_primary(100_000)
    assert keys.keys() == configs.keys()
    for node, key in keys.items():
        answers = await topology.on_one_connection(key, ("SET", key, node), ("GET", key))
        assert answers == [True, node.encode()]
        if server_kind == "cluster":
            owner = client.get_node_from_key(key)  # type: ignore[union-attr]
            assert owner is not None and owner.name == node


async def test_an_error_on_one_connection_is_an_answer_not_a_raise(client: Client) -> None:
    answers = await topology_of(client).on_one_connection(
        "k{1}", ("SET", "k{1}", "1"), ("INCRBY", "k{1}", "x"), ("GET", "k{1}")
    )
    assert answers[0] is True and answers[2] == b"1"
    assert isinstance(answers[1], ResponseError)


async def test_a_connection_to_a_node_and_the_one_address(client: Client, server_kind: str) -> None:
    topology = topology_of(client)
    kwargs, _ = topology.connection_settings_at("127.0.0.9", 1)
    if server_kind == "cluster":
        assert topology.single_address() is None
        assert (kwargs["host"], kwargs["port"]) == ("127.0.0.9", 1)
    else:  # one server: its own address, whatever node was named
        assert topology.single_address() == f"{kwargs['host']}:{kwargs['port']}"
    kwargs["host"] = "changed"  # a copy: the client's own settings are left alone
    assert topology.connection_settings()[0].get("host") != "changed"


async def test_in_order_runs_each_fill_after_the_ones_before(client: Client) -> None:
    keys = [f"order{{{n}}}" for n in range(6)]  # tags spread over a cluster's nodes

    def write(pipe: object) -> None:
        for key in keys:
            pipe.set(key, key)  # type: ignore[attr-defined]

    def read(pipe: object) -> None:
        for key in keys:
            pipe.get(key)  # type: ignore[attr-defined]

    answers = await topology_of(client).in_order(write, read)
    assert answers == [True] * len(keys) + [key.encode() for key in keys]
    await client.delete(*keys)


def test_only_topology_asks_which_kind_of_client() -> None:
    # The rest of storage takes the Topology: a new isinstance(..., ValkeyCluster) elsewhere
    # would decide the kind a second time.
    storage = Path(topology_module.__file__).parent
    asking = [
        path.name
        for path in sorted(storage.glob("*.py"))
        if path.name != "topology.py"
        and re.search(r"isinstance\([^)]*ValkeyCluster", path.read_text())
    ]
    assert asking == []


def test_only_the_store_reads_the_kind_once() -> None:
    # ``one_node`` is read where the Store is built, to choose how a transition and its due
    # mark travel; a module reading it elsewhere would branch on the kind again.
    src = Path(topology_module.__file__).parent.parent
    reads = {
        str(path.relative_to(src)): len(re.findall(r"\.one_node\b", path.read_text()))
        for path in sorted(src.rglob("*.py"))
        if path.name != "topology.py"
    }
    assert {name: n for name, n in reads.items() if n} == {"storage/store.py": 1}
