"""Scenario 1: workers SIGKILLed and restarted at random while prompts keep coming.

Checker: nothing lost (every acknowledged accept ends delivered, or in error / parked and
listed); the agent ran each prompt once (the verifier is truthful); OnDelivered at most once
per entry; each session's prompts reached the agent in accept order.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Outbox
from prompt_outbox.embedded import EmbeddedValkey
from tests.chaos import report
from tests.chaos.harness import (
    Workers,
    accept_paced,
    chaos_agent,
    closing,
    keep_killing,
    library_accept,
    library_worker,
    read_worker_logs,
    settle,
    take_agent_history,
)
from tests.chaos.history import History, check
from tests.chaos.settings import CHAOS_TUNABLES

RUNS = [
    pytest.param(1_000, 50, 10.0, id="short"),
    pytest.param(10_000, 200, 60.0, id="long", marks=pytest.mark.slow),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("prompts", "sessions", "seconds"), RUNS)
async def test_worker_kills_lose_nothing_and_run_nothing_twice(
    valkey_server: EmbeddedValkey,
    client: valkey_async.Valkey,
    tmp_path: Path,
    prompts: int,
    sessions: int,
    seconds: float,
) -> None:
    rng = random.Random(prompts)
    history = History()
    outbox = Outbox(client, CHAOS_TUNABLES)
    with closing(chaos_agent(seed=prompts)) as agent:
        workers = Workers(library_worker(valkey_server.url, agent, tmp_path), 3)
        try:
            await asyncio.gather(
                accept_paced(library_accept(outbox), history, prompts, sessions, seconds * 0.8),
                keep_killing(workers, seconds, rng),
            )
            await settle(outbox, history, within=120)
        finally:
            workers.stop()
        take_agent_history(agent, history)
    read_worker_logs(tmp_path, history)
    history.faults["kill"] = workers.kills
    verdict = check(history)
    faults = report.faults(history.faults)
    report.add(f"worker kills ({prompts} prompts, {seconds:.0f} s)", faults, verdict)
    assert workers.kills >= seconds / 3.5
    assert verdict.ok, verdict
    assert verdict.accepted == prompts
