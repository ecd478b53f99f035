"""Sentinel failovers, long form (the short form is tests/test_sentinel.py in ``make test``). A
primary, two replicas and three sentinels from the bundled binary; serve and a worker on the
``valkey+sentinel://`` URL at ``--accept-durability replica``; 20 clients accept into a session
each. Four times: the primary is SIGKILLed under that load, the sentinels promote a replica, and
the killed node comes back as a replica (so each failover has two candidates). Every accept
answers 2xx or 503 within its bound, 503s only from a kill until its switch settled; every
acknowledged prompt is delivered once, in its session's order. The one-line result goes to the
chaos report (docs/reliability.md, "Sentinel")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import report
from tests.support.failover import run_failovers


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_four_sentinel_failovers_under_load_lose_no_acknowledged_accept(tmp_path: Path) -> None:
    run = run_failovers(tmp_path, sessions=20, failovers=4, acks=30)
    report.add_line(run.line("sentinel failovers, replica (20 sessions)"))
    run.check()
