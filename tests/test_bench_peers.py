"""The short form of the peer benchmark (bench/peers): our driver always, each peer only where
its venv is already built in .cache/ (``make bench`` builds them; a clean clone, as on CI, does
not install four packages for a smoke test). No timing is asserted: the figures are read as
ratios within one run (docs/performance.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from bench.peers import venvs
from bench.peers.__main__ import (
    MEMORY_TARGET,
    RSS_TARGET,
    latency_verdict,
    memory_verdicts,
    run,
    throughput_verdicts,
)
from bench.peers.runner import Size
from bench.peers.server import key_kind
from bench.peers.systems import OURS, SYSTEMS, System, by_names
from bench.scale import LATENCY_TARGET

TINY = Size(jobs=40, sessions=4, concurrency=50, timeout=60.0)
# The memory phase's short form (cap 25 a session holds 10 each) and the latency phase's:
# 3 jobs, for at most 2 s (arq polls every 0.5 s).
SMALL_MEMORY = Size(jobs=40, sessions=4, concurrency=50, timeout=60.0)
FEW_SAMPLES = Size(jobs=3, sessions=3, concurrency=50, timeout=2.0)
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
    report = run([TINY], by_names([OURS]), "no")
    [ours] = report.table.measured
    assert ours.done == TINY.jobs and ours.process_rate is not None
    assert (ours.order_violations, ours.overlaps) == (0, 0)
    assert ours.commands[0] > 0 and ours.scripts[1] > 0  # INFO commandstats was read
    assert "appendonly no" in report.header and "accept_durability=none" in report.header
    assert "| sessions | jobs | system |" in report.markdown()


@pytest.mark.timeout(120)
def test_repeated_runs_keep_the_median_and_give_the_end_to_end_verdict(tmp_path: Path) -> None:
    report = run([TINY], by_names([OURS]), "no", repeat=3)
    [ours] = report.table.measured  # one row: the median of three runs
    assert ours.done == TINY.jobs and "median of 3 runs" in report.header
    results = tmp_path / "results.jsonl"
    throughput_verdicts(report, results)
    [row] = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["target"] == "End to end, 4 sessions x 10"
    assert row["ours"].endswith("prompts/s")
    assert (row["peers"], row["met"]) == ("no peer ran", None)  # no verdict without a peer


def test_a_key_kind_is_the_key_with_its_numbered_segments_starred() -> None:
    assert key_kind("outboxq:{bench}:{s12}") == "outboxq:{bench}:*"
    assert key_kind("outboxdedupe:{bench}:{s3}:s3-7") == "outboxdedupe:{bench}:*:*"
    assert key_kind("bull:benchpeers:17") == "bull:benchpeers:*"
    assert key_kind("bull:benchpeers:wait") == "bull:benchpeers:wait"


@pytest.mark.timeout(120)
def test_our_memory_and_latency_phases_measure_and_give_their_verdicts(tmp_path: Path) -> None:
    report = run([], by_names([OURS]), "no", memory=SMALL_MEMORY, latency=FEW_SAMPLES)
    [memory] = report.memory.measured
    kinds = {kind.split(":")[0] for kind in memory.outcome.keys}
    assert {"outboxq", "outboxdedupe", "outboxev"} <= kinds  # what the doc's breakdown names
    assert memory.outcome.keys[key_kind("outboxdedupe:{bench}:{s0}:s0-0")].keys == 40
    assert memory.queued.used > 0 and memory.outcome.work["done"] == SMALL_MEMORY.jobs
    start, peak, _ = memory.rss
    assert 0 < memory.outcome.imports_rss_kb <= peak and 0 < start <= peak
    assert memory.idle_rss_kb  # from the latency phase's idle worker
    [latency] = report.latency.measured
    assert latency.latency.samples == FEW_SAMPLES.jobs and latency.latency.p50 > 0
    markdown = report.markdown()
    assert "| system | jobs / sessions |" in markdown and "| system | key kind |" in markdown
    assert "| system | samples | p50 |" in markdown
    results = tmp_path / "results.jsonl"
    results.write_text(
        json.dumps({"target": LATENCY_TARGET, "ours": "scale's", "met": True}) + "\n"
    )
    memory_verdicts(report, results)
    latency_verdict(report, results)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["target"] for r in rows] == [
        LATENCY_TARGET,
        MEMORY_TARGET,
        RSS_TARGET,
        LATENCY_TARGET,
    ]
    assert rows[1]["met"] is None and "dedupe " in rows[1]["ours"]
    assert rows[3]["ours"] == "scale's" and "prompt-outbox" in rows[3]["peers"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("peer", PEERS, ids=[p.name for p in PEERS])
def test_a_peer_already_installed_works_off_every_job(peer: System) -> None:
    if venvs.ready(peer) is None:
        pytest.skip(f"{peer.name}'s venv is not built in .cache/ (make bench builds it)")
    report = run([TINY], [peer], "no", memory=SMALL_MEMORY, latency=FEW_SAMPLES)
    [row] = report.table.measured
    assert row.done == TINY.jobs and row.process_rate is not None
    assert row.commands[0] > 0
    [memory] = report.memory.measured
    assert memory.queued.used > 0 and memory.outcome.work["done"] >= SMALL_MEMORY.jobs
    assert sum(k.keys for k in memory.outcome.keys.values()) >= SMALL_MEMORY.jobs
    assert memory.rss[0] > 0 and memory.rss[1] > 0
    [latency] = report.latency.measured
    assert latency.latency.samples >= 1 and latency.latency.p50 > 0
