"""The short form of the peer benchmark (bench/peers): our driver always, each peer only where
its venv is already built in .cache/ (``make bench`` builds them; a clean clone, as on CI, does
not install four packages for a smoke test). No timing is asserted: the figures are read as
ratios within one run (docs/performance.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from bench.peers import venvs
from bench.peers.__main__ import run
from bench.peers.runner import Size
from bench.peers.systems import OURS, SYSTEMS, System, by_names

TINY = Size(jobs=40, sessions=4, concurrency=50, timeout=60.0)
PEERS = [s for s in SYSTEMS if s.name != OURS]


def _proto() -> ModuleType:
    path = Path(venvs.ROOT, "bench", "peers", "drivers", "_proto.py")
    spec = importlib.util.spec_from_file_location("bench_peers_proto", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_plan_adds_each_sessions_jobs_in_order_from_one_task() -> None:
    lanes = _proto().plan(jobs=103, sessions=7, tasks=5)
    pairs = [pair for lane in lanes for pair in lane]
    assert sorted(pairs) == sorted((j % 7, j // 7) for j in range(103))
    for lane in lanes:
        for session in {s for s, _ in lane}:
            numbers = [n for s, n in lane if s == session]
            assert numbers == sorted(numbers)
        assert all(s % 5 == lane[0][0] % 5 for s, _ in lane)  # one task per session


@pytest.mark.timeout(120)
def test_our_driver_works_off_every_job_in_session_order() -> None:
    table, header = run([TINY], by_names([OURS]), "no")
    [ours] = table.measured
    assert ours.done == TINY.jobs and ours.process_rate is not None
    assert (ours.order_violations, ours.overlaps) == (0, 0)
    assert ours.commands[0] > 0 and ours.scripts[1] > 0  # INFO commandstats was read
    assert "appendonly no" in header and "accept_durability=none" in header
    assert "| sessions | jobs | system |" in table.markdown()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("peer", PEERS, ids=[p.name for p in PEERS])
def test_a_peer_already_installed_works_off_every_job(peer: System) -> None:
    if venvs.ready(peer) is None:
        pytest.skip(f"{peer.name}'s venv is not built in .cache/ (make bench builds it)")
    table, _ = run([TINY], [peer], "no")
    [row] = table.measured
    assert row.done == TINY.jobs and row.process_rate is not None
    assert row.commands[0] > 0
