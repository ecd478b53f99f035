"""The short form of the HTTP accept benchmark (bench/http.py): one round of a second, few
connections, every stack and side. No timing is asserted: the figures are read as ratios
within one run (docs/performance.md). Without node and npm it is skipped, with the reason;
on CI (``CI`` set) that fails instead, as the opencode integration test does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import http

from tests.support.tools import unavailable

CONNECTIONS = 4


@pytest.fixture(scope="module")
def node() -> Path:
    try:
        return http.ensure_load()
    except http.LoadUnavailable as exc:
        unavailable(str(exc))


@pytest.mark.timeout(240)
def test_the_http_benchmark_measures_baseline_and_ours_on_every_stack(
    node: Path, tmp_path: Path
) -> None:
    report = http.run(seconds=1.0, connections=CONNECTIONS, repeat=1, warmup=0.3)
    sides = {(s.name, side) for s in http.STACKS for side in ("baseline", "ours")}
    assert set(report.runs) == sides | {(http.DEFAULT.name, http.ACCESS_LOG)}
    for key, run in report.runs.items():
        load = run.load
        assert load.ok > 0 and load.rate > 0, key
        assert (load.non2xx, load.errors, load.timeouts) == (0, 0, 0), (key, load.codes)
        assert set(load.codes) == {"202"}, key  # each an accept, none a duplicate
        # The load generator reports whole milliseconds: a fast stack's p50 can be 0.
        assert 0 <= load.p50 <= load.p99, key
        assert run.server_cpu_us > 0 and run.valkey_cpu_us > 0, key
        # Every 2xx was stored; a request the load generator dropped at its end may be too.
        assert run.answered <= run.stored <= run.answered + 2 * CONNECTIONS, key
    for stack in http.STACKS:
        assert report.ratio(stack) > 0
    assert report.access_log_cost() is not None
    assert "json.dumps" in report.encode_us and report.log_line_us > 0
    markdown = report.markdown()
    assert "| stack | server | accepts/s |" in markdown and "Access log on" in markdown
    results = tmp_path / "results.jsonl"
    http.give_verdict(report, results)
    [row] = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["target"] == http.TARGET and row["met"] in (True, False)
    assert "accepts/s" in row["ours"] and "RPUSH" in row["peers"]
