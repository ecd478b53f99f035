"""Scenario 1: workers SIGKILLed and restarted at random while prompts keep coming.

Checker: nothing lost (every acknowledged accept ends delivered, or in error / parked and
listed); the agent ran each prompt once (the verifier is truthful); OnDelivered at most once
per entry; each session's prompts reached the agent in accept order. With an agent that works
in turns, also: no prompt reached it while the session's previous turn ran (``sent_in_turn``).
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import httpx
import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Outbox
from prompt_outbox.core.keys import OWNERS, session_keys
from prompt_outbox.core.turns import is_turn
from prompt_outbox.embedded import EmbeddedValkey, free_port
from prompt_outbox.storage.client import Client
from tests.chaos import report
from tests.chaos.harness import (
    Workers,
    accept_paced,
    chaos_agent,
    closing,
    http_accept,
    keep_killing,
    library_accept,
    library_worker,
    read_worker_logs,
    settle,
    take_agent_history,
    workspace_of,
)
from tests.chaos.history import History
from tests.chaos.settings import CHAOS_TUNABLES, CHAOS_TUNABLES_JSON, TURN_TUNABLES
from tests.chaos.turn_agent import TurnAgent
from tests.support.serve import BIN, wait_healthy
from tests.support.serve import service as service_process

RUNS = [
    pytest.param(1_000, 50, 10.0, id="short"),
    pytest.param(10_000, 200, 60.0, id="long", marks=pytest.mark.slow),
]


@pytest.mark.timeout(600)
@pytest.mark.cluster_too
@pytest.mark.parametrize(("prompts", "sessions", "seconds"), RUNS)
async def test_worker_kills_lose_nothing_and_run_nothing_twice(
    server_url: str,
    server_kind: str,
    client: Client,
    tmp_path: Path,
    prompts: int,
    sessions: int,
    seconds: float,
) -> None:
    rng = random.Random(prompts)
    history = History()
    outbox = Outbox(client, CHAOS_TUNABLES)
    with closing(chaos_agent(seed=prompts)) as agent:
        workers = Workers(library_worker(server_url, agent, tmp_path), 3)
        try:
            await asyncio.gather(
                accept_paced(library_accept(outbox), history, prompts, sessions, seconds * 0.8),
                keep_killing(workers, seconds, rng),
            )
            await settle(outbox, client, history, within=120)
        finally:
            workers.stop()
        take_agent_history(agent, history)
    read_worker_logs(tmp_path, history, workers.killed)
    history.faults["kill"] = workers.kills
    where = ", 3-master cluster" if server_kind == "cluster" else ""
    verdict = report.judge(f"worker kills ({prompts} prompts, {seconds:.0f} s{where})", history)
    assert workers.kills >= seconds / 3.5
    assert verdict.ok, verdict
    assert verdict.accepted == prompts


@pytest.mark.timeout(600)
async def test_worker_kills_through_the_http_api_and_the_cli_workers(
    valkey_server: EmbeddedValkey, client: valkey_async.Valkey, tmp_path: Path
) -> None:
    """The short run through the product: ``serve`` takes the prompts over HTTP, three
    ``prompt-outbox worker`` processes deliver and are SIGKILLed at random."""
    prompts, sessions, seconds = 300, 20, 10.0
    rng = random.Random(3)
    history = History(hooks_recorded=False)  # the CLI workers have no OnDelivered to report
    port = free_port()
    env = {
        **os.environ,
        "PROMPT_OUTBOX_TUNABLES": CHAOS_TUNABLES_JSON,
        "PROMPT_OUTBOX_WEBHOOK_SECRET": "chaos",
    }
    url = valkey_server.url
    serve_args = ["--no-auth", "--port", str(port), "--valkey-url", url]
    with closing(chaos_agent(seed=11)) as agent, service_process(serve_args, env):
        wait_healthy(port)
        hook = ["--webhook-url", agent.url, "--webhook-verify-url", agent.verify_url]
        workers = Workers(lambda: [BIN, "worker", "--valkey-url", url, *hook], 3, env)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                await asyncio.gather(
                    accept_paced(http_accept(http), history, prompts, sessions, seconds * 0.8),
                    keep_killing(workers, seconds, rng),
                )
            await settle(Outbox(client, CHAOS_TUNABLES), client, history, within=120)
        finally:
            workers.stop()
        take_agent_history(agent, history)
    history.faults["kill"] = workers.kills
    verdict = report.judge(f"worker kills, HTTP + CLI workers ({prompts} prompts)", history)
    assert verdict.ok, verdict
    assert verdict.accepted == prompts


@pytest.mark.timeout(600)
@pytest.mark.cluster_too
async def test_replicas_joining_and_leaving_change_nothing_visible(
    server_url: str, server_kind: str, client: Client, tmp_path: Path
) -> None:
    """``serve`` takes prompts over HTTP while ``prompt-outbox worker`` replicas come and go
    the way an orchestrator moves them: one joins, then one leaves on SIGTERM (finishing its
    delivery in flight, exit 0). Nothing is lost, nothing is run twice, order holds."""
    prompts, sessions, seconds = 300, 20, 9.0
    history = History(hooks_recorded=False)  # the CLI workers have no OnDelivered to report
    port = free_port()
    env = {
        **os.environ,
        "PROMPT_OUTBOX_TUNABLES": CHAOS_TUNABLES_JSON,
        "PROMPT_OUTBOX_WEBHOOK_SECRET": "chaos",
    }
    serve_args = ["--no-auth", "--port", str(port), "--valkey-url", server_url]
    with closing(chaos_agent(seed=13)) as agent, service_process(serve_args, env):
        wait_healthy(port)
        hook = ["--webhook-url", agent.url, "--webhook-verify-url", agent.verify_url]
        workers = Workers(lambda: [BIN, "worker", "--valkey-url", server_url, *hook], 2, env)

        async def come_and_go() -> int:
            await asyncio.sleep(seconds / 3)
            workers.join_one()
            await asyncio.sleep(seconds / 3)
            return await asyncio.to_thread(workers.leave_one)

        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                _, left_with = await asyncio.gather(
                    accept_paced(http_accept(http), history, prompts, sessions, seconds * 0.8),
                    come_and_go(),
                )
            await settle(Outbox(client, CHAOS_TUNABLES), client, history, within=120)
        finally:
            workers.stop()
        take_agent_history(agent, history)
    where = ", 3-master cluster" if server_kind == "cluster" else ""
    verdict = report.judge(f"replicas join and leave ({prompts} prompts{where})", history)
    assert left_with == 0  # a graceful leave: in-flight deliveries finished first
    assert verdict.ok, verdict
    assert verdict.accepted == prompts


async def _worker_kills_with_turns(
    server_url: str,
    server_kind: str,
    client: Client,
    log_dir: Path,
    prompts: int,
    sessions: int,
    seconds: float,
) -> None:
    """The library run above, with an agent that answers each send at once with a turn
    (202 {"turn": id}) and runs it for 0.05-0.5 s. It reports most ends through
    ``Outbox.end_turn``; a share (settings.TURN_BY_CHECK_ONLY) it tells no one, and a worker's
    check asks its verify URL (``?turn=``). Workers are SIGKILLed mid-send, mid-check and
    between turns. Besides the checker: no session is left held in turn once the agent's turns
    are over, and every turn the outbox asked about was one the agent had started."""
    rng = random.Random(prompts + 1)
    history = History()
    outbox = Outbox(client, TURN_TUNABLES)

    async def end(ws: str, ses: str, turn_id: str) -> bool:
        return (await outbox.end_turn(ws, ses, turn_id)).ended

    with closing(TurnAgent(prompts, secret=b"chaos", end=end)) as agent:

        async def held() -> dict[str, str]:
            """Each session the outbox holds in turn -> its turn record (the lock's value)."""
            locks = {ses: session_keys(workspace_of(ses), ses).lock for ses in history.accepted}
            values = {ses: await client.get(key) for ses, key in locks.items()}
            return {s: v.decode() for s, v in values.items() if v and is_turn(v.decode())}

        async def all_over() -> bool:
            """The agent runs no turn, and the outbox holds no session in turn."""
            return agent.running() == 0 and not await held()

        workers = Workers(library_worker(server_url, agent, log_dir), 3)
        try:
            await asyncio.gather(
                accept_paced(library_accept(outbox), history, prompts, sessions, seconds * 0.8),
                keep_killing(workers, seconds, rng),
            )
            await settle(outbox, client, history, within=120)
            # The last turn of each session ends too, however it was told (checks every 0.3 s).
            over = False
            for _ in range(300):  # 30 s
                if over := await all_over():
                    break
                await asyncio.sleep(0.1)
            # What a failure needs to be read: the turns still held, and the live owners.
            still = await held()
            owners = await client.zrange(OWNERS, 0, -1, withscores=True)
        finally:
            workers.stop()
        take_agent_history(agent, history)
    read_worker_logs(log_dir, history, workers.killed)
    history.faults["kill"] = workers.kills
    where = ", 3-master cluster" if server_kind == "cluster" else ""
    t, asked = agent.turns, agent.asked
    told = (
        f"turns {t['started']}: ended by end_turn {t['reported']}, by a check "
        f"{t['check_only'] + t['report_gone']} ({t['report_gone']} of them after an end_turn "
        f"that found no such hold); asked running {asked['running']}, ended {asked['ended']}"
    )
    scenario = f"worker kills, turns ({prompts} prompts, {seconds:.0f} s{where}; {told})"
    verdict = report.judge(scenario, history)
    assert workers.kills >= seconds / 3.5
    why = f"{verdict}; held in turn: {sorted(still.items())[:10]}; heartbeats: {owners}"
    assert verdict.ok, why
    assert verdict.accepted == prompts and verdict.sent_in_turn == 0
    assert over, f"a session is still held in turn though the agent's turns are over: {why}"
    # Each way a turn ends was taken: by end_turn, and by a check that found it over.
    assert t["reported"] and t["check_only"] and asked["ended"]
    assert asked["unknown"] == 0  # the outbox asked only about turns the agent started


@pytest.mark.timeout(300)
async def test_worker_kills_with_turns_send_nothing_into_a_running_turn(
    server_url: str, server_kind: str, client: Client, tmp_path: Path
) -> None:
    """Short form (``make test``): 400 prompts over 40 sessions, 10 s of kills."""
    await _worker_kills_with_turns(server_url, server_kind, client, tmp_path, 400, 40, 10.0)


@pytest.mark.slow
@pytest.mark.cluster_too
@pytest.mark.timeout(900)
async def test_worker_kills_with_turns_long(
    server_url: str, server_kind: str, client: Client, tmp_path: Path
) -> None:
    """Long form (``make chaos``), on a standalone server and on a 3-master cluster."""
    await _worker_kills_with_turns(server_url, server_kind, client, tmp_path, 6_000, 200, 60.0)
