"""The short form of the stalled-streams benchmark (bench/stalled.py): both setups run against
a real serve, and the feed's own figures say what the bounds did. No memory figure or timing
is asserted: those are read as a ratio within one run of the benchmark (docs/performance.md)."""

from __future__ import annotations

import pytest
from bench import stalled

MIB = 1024 * 1024


@pytest.mark.timeout(240)
async def test_the_stalled_streams_benchmark_runs_both_setups() -> None:
    setups = (stalled.Setup("bounded", 1, 64), stalled.Setup("events only", 100_000, 100_000))
    report = await stalled.run(streams=2, edits=80, text_kb=100, setups=setups)
    bounded, events_only = report.rows
    assert all(r.rss_before > 0 and r.rss_after > 0 and r.peak >= r.rss_after for r in report.rows)
    # 80 events of 100 KB per stream: past what the sockets absorb (about 4 MB on loopback)
    # and a 1 MiB bound (each stream cut off there, holding about that much), while the
    # events-only setup keeps the rest of each, and cuts none.
    assert bounded.cut["bytes"] == 2 and bounded.cut["process"] == 0
    assert bounded.buffered <= 2 * (1 * MIB + 300_000)
    assert events_only.cut == {"bytes": 0, "process": 0, "events": 0}
    assert events_only.buffered > 2 * 2 * MIB
    markdown = report.markdown()
    assert "| bounded |" in markdown and "growth, bounded / events only:" in markdown


@pytest.mark.timeout(300)
def test_the_stalled_answers_benchmark_runs_before_and_after() -> None:
    # A stalled client kept whole answers (docs/security.md), short: 4 stalled clients of each
    # kind on the 5.1 MB session.
    # Before, each held its answer formatted whole and its snapshot: 5-12 MiB of serve's
    # memory each; after, its entries and one piece in flight, about 0.5 MiB, all counted.
    report = stalled.run_answers(stalled=4, before=stalled.before_rev())
    for row in report.rows:
        assert row.idle > 0 and row.held > 0
    for kind in stalled.KINDS:
        after = report.row("after", kind)
        assert after.counted is not None and 4 * 0.3 * MIB < after.counted < 4 * 1.5 * MIB
        assert after.per_answer < 2.5, after  # MiB each, against the idle RSS of its run
        assert report.ratio(kind) < 0.5, report.markdown()
    assert "| after | events |" in report.markdown()
