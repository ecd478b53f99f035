"""The short form of the flood benchmark (bench/flood.py): a few oversized requests of each
kind against a real serve. No timing is asserted; memory is, against the idle RSS of the same
run: before the body and head limits, this flood took serve from about 60 MB to 230-500 MB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import flood

MEGABYTES = 16
OVER_IDLE_KB = 24 * 1024  # a few connections' buffers, far below one body


@pytest.mark.timeout(300)
def test_a_flood_of_oversized_requests_leaves_serves_memory_bounded(tmp_path: Path) -> None:
    report = flood.run(requests=6, connections=3, megabytes=MEGABYTES)
    assert [row.kind for row in report.rows] == [k.name for k in flood.kinds(MEGABYTES)]
    assert report.idle_kb > 0
    for row in report.rows:
        # Each refused by its head (or closed while the client still sent): never read whole.
        assert sum(row.ends.values()) == 6, row
        assert set(row.ends) <= {"413", "431", "closed"}, row
        assert row.peak_kb - report.idle_kb < OVER_IDLE_KB, row
    assert "| flood | ended as |" in report.markdown()
    results = tmp_path / "results.jsonl"
    flood.give_verdict(report, results)
    [verdict] = [json.loads(line) for line in results.read_text().splitlines()]
    assert verdict["target"] == flood.TARGET and verdict["met"] is True
