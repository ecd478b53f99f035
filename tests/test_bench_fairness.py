"""The short form of the fairness benchmark (bench/fairness.py): it runs both phases and
reports each sample where it belongs. No timing is asserted: the figure is read as a ratio
within one run of the benchmark (docs/performance.md)."""

from __future__ import annotations

import pytest
from bench import fairness


@pytest.mark.timeout(240)
async def test_the_fairness_benchmark_samples_behind_a_backlog() -> None:
    report = await fairness.run(backlog=1500, samples=3, send_ms=100.0)
    assert report.concurrency == 1000 and report.backlog == 1500
    assert len(report.idle) == 3 and all(wait > 0 for wait in report.idle)
    # Each sample is taken behind the backlog, or counted as not taken once all of it started.
    assert len(report.behind) + report.late == 3
    assert all(wait > 0 for wait in report.behind)
    assert report.backlog_s > 0
    markdown = report.markdown()
    assert "| no backlog | 3 |" in markdown and "| behind the backlog |" in markdown
