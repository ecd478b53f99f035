"""The short form of ``make bench`` (bench/scale.py): every figure is produced and sane. No
timing is asserted here: speed and cost targets live in the benchmark's report, read as
ratios within one run (docs/performance.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import durability, transitions
from bench.scale import LATENCY_TARGET, Figures, latency_verdict, percentile, run


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 301)]
    assert percentile(values, 0.99) == 297.0  # the 4th largest of 300
    assert percentile(values, 0.5) == 150.0
    assert percentile([7.0], 0.99) == 7.0


@pytest.mark.timeout(300)
async def test_the_scale_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    figures = await run(workspaces=40, stream_count=10, samples=3, figures=Figures(0.5, 1.0))
    rows = figures.rows
    assert set(rows) == {
        "start-up with 10 workspaces: recovery pass and first visits done after",
        "start-up with 40 workspaces: recovery pass and first visits done after",
        "idle run(), 10 workspaces: Valkey commands/s",
        "accept -> delivery start, 10 workspaces",
        "idle run(), 40 workspaces: Valkey commands/s",
        "accept -> delivery start, 40 idle workspaces",
        "repair pass over 40 idle workspaces: Valkey commands",
        "serve with 10 open SSE streams: Valkey connections",
        "accept p50 over HTTP, 10 streams open vs none",
    }
    assert float(rows["idle run(), 10 workspaces: Valkey commands/s"]) > 0
    assert int(rows["serve with 10 open SSE streams: Valkey connections"].split()[0]) >= 1
    assert rows["accept -> delivery start, 10 workspaces"].startswith("p50 ")
    small = figures.latencies[10]
    assert small.samples == 3 and 0 < small.p50 <= small.p95 <= small.p99
    results = tmp_path / "results.jsonl"
    latency_verdict(figures, results)
    [row] = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["target"] == LATENCY_TARGET and row["met"] in (True, False)
    assert "p99 " in row["ours"] and "40 idle workspaces" in row["note"]


@pytest.mark.timeout(300)
async def test_the_durability_benchmark_measures_every_level() -> None:
    report = await durability.run(seconds=0.2)
    cells = {(setup, level) for setup, level, _, _ in report.rows}
    assert cells == {(s.name, level) for s in durability.SETUPS for level in s.levels}
    for _, _, latency, rate in report.rows:
        assert latency.startswith("p50 ") and float(rate) > 0
    assert "| setup | level |" in report.markdown()


@pytest.mark.timeout(120)
async def test_the_transition_benchmark_measures_each_queue_length() -> None:
    report = await transitions.run([1, 30], rounds=5)
    assert [r.length for r in report.rows] == [1, 30]
    for row in report.rows:
        assert row.usec_per_call > 0 and row.calls_per_prompt >= 4  # accept + a delivery step
    assert "| queue length |" in report.markdown()
