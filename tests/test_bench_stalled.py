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
