"""The short form of the overview benchmark (bench/overview.py): a real serve answers the two
overview routes and a /metrics count while one workspace holds ~20 MB of entries. No timing is
asserted; memory is, against the idle RSS of the same run: before the tally (docs/security.md:
the overview read every entry) each of the three took serve from about 64 MB to 97-102 MB here
(1.5-1.6x), and to 254 MB at 100 MB held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import overview

MEGABYTES = 20
OVER_IDLE_KB = 6 * 1024  # a page's answer and the allocator's slack, far below one entry's bytes


@pytest.mark.timeout(300)
def test_an_overview_costs_serve_no_memory_for_the_bytes_held(tmp_path: Path) -> None:
    report = overview.run(megabytes=MEGABYTES)
    assert report.entries == MEGABYTES * 1_000_000 // overview.ENTRY_BYTES
    assert [row.request for row in report.rows] == [
        "GET /v1/workspaces",
        "GET /v1/workspaces/acme/sessions",
        "/metrics (its count)",
    ]
    for row in report.rows:
        assert row.status == 200, row
        assert row.peak_kb - report.idle_kb < OVER_IDLE_KB, row
    assert "| request | status |" in report.markdown()
    results = tmp_path / "results.jsonl"
    overview.give_verdict(report, results)
    [verdict] = [json.loads(line) for line in results.read_text().splitlines()]
    assert verdict["target"] == overview.TARGET and verdict["met"] is True
