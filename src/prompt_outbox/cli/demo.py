"""``prompt-outbox demo``: the whole service on an embedded Valkey, a local agent that drops,
stalls and fails at random, and N prompts through the HTTP API from clients that re-send like
phones do. It ends with a table, and fails (exit 1) if anything was lost, run twice or
reordered."""

from __future__ import annotations

import asyncio
import logging
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import httpx
import uvicorn

from ..api import RateLimit, TokenTable, create_app
from ..core.settings import Tunables
from ..deliver import WebhookDeliverer
from ..outbox import Outbox
from ..storage.connect import connect
from ..storage.embedded import EmbeddedValkey, free_port, redacted
from .admin import table
from .flaky_agent import FlakyAgent

# Seconds, not the production minutes: the demo shows every path in a few seconds.
DEMO_TUNABLES = Tunables(
    max_attempts=20,
    delivery_timeout=10.0,
    retry_backoff=0.1,
    max_backoff=1.0,
    verify_delay=0.3,
    verify_backoff=0.2,
    max_verify_backoff=1.0,
    max_transient_failures=100,
    lease_ttl=5.0,
)
WEBHOOK_TIMEOUT = 1.0  # the agent's stalls (2 s) outlast it: ambiguous, then verified
# The agent checks every delivery's signature, as a real receiver should: a delivery it
# refused (401, definitive) would end in error and show in the table as lost.
WEBHOOK_SECRET = b"demo"


@dataclass
class ClientLog:
    accepted: dict[str, list[str]] = field(default_factory=dict)  # session -> IDs, in order
    posts: int = 0
    duplicates: int = 0
    refused: int = 0


async def _send_all(
    api: str, prompts: int, sessions: int, resend: float, rng: random.Random
) -> ClientLog:
    """Each session posts its prompts in order; some POSTs are repeated, like a phone that
    lost the answer and sends the same clientMessageID again."""
    log = ClientLog()

    async def one_session(http: httpx.AsyncClient, ses: str, count: int) -> None:
        url = f"/v1/workspaces/demo/sessions/{ses}/prompts"
        ids = log.accepted.setdefault(ses, [])
        for i in range(count):
            body = {"clientMessageID": f"{ses}-{i}", "text": f"prompt {i} of {ses}"}
            tries = 2 if rng.random() < resend else 1
            while tries:
                log.posts += 1
                r = await http.post(url, json=body)
                if r.status_code == 429:  # the session is full: wait for the agent
                    log.refused += 1
                    await asyncio.sleep(0.2)
                    continue
                r.raise_for_status()
                if r.json().get("duplicate"):
                    log.duplicates += 1
                else:
                    ids.append(r.json()["id"])
                tries -= 1

    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        per = [prompts // sessions + (1 if s < prompts % sessions else 0) for s in range(sessions)]
        await asyncio.gather(*(one_session(http, f"chat-{s}", n) for s, n in enumerate(per)))
    return log


async def _demo(prompts: int, sessions: int, seed: int, data_dir: Path, wait_s: float) -> int:
    rng = random.Random(seed)
    agent = FlakyAgent(seed, stall=2 * WEBHOOK_TIMEOUT, secret=WEBHOOK_SECRET)
    valkey = EmbeddedValkey(data_dir)
    valkey.start()
    client = connect(valkey.url, socket_timeout=10)
    hook = WebhookDeliverer(
        agent.url, secret=WEBHOOK_SECRET, verify_url=agent.verify_url, timeout=WEBHOOK_TIMEOUT
    )
    outbox = Outbox(client, DEMO_TUNABLES)
    outbox.set_verifier(hook.verify)
    port = free_port()
    # The demo's ten "phones" share --no-auth's one principal, so one token's accept rate
    # would throttle them all together: no rate limit here (the session cap still holds).
    app = create_app(outbox, TokenTable({}, disabled=True), accept_rate=RateLimit(0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    api_task = asyncio.create_task(server.serve())
    started = time.monotonic()
    try:
        for _ in range(3000):  # uvicorn says when it listens; it takes milliseconds
            if server.started:
                break
            await asyncio.sleep(0.01)
        click.echo(
            f"API on http://127.0.0.1:{port}, agent on {agent.url}, Valkey {redacted(valkey.url)}"
        )
        async with outbox.running(hook, tick=0.2):
            sending = asyncio.create_task(
                _send_all(f"http://127.0.0.1:{port}", prompts, sessions, 0.2, rng)
            )
            with click.progressbar(length=prompts, label="delivered") as bar:
                shown = 0
                while agent.delivered() < prompts and time.monotonic() - started < wait_s:
                    await asyncio.sleep(0.1)
                    bar.update(agent.delivered() - shown)
                    shown = agent.delivered()
                bar.update(agent.delivered() - shown)
            log = await sending
    finally:
        server.should_exit = True
        await api_task
        await hook.aclose()
        await client.aclose()
        valkey.stop()
        agent.close()
    return _report(log, agent, time.monotonic() - started)


def _report(log: ClientLog, agent: FlakyAgent, elapsed: float) -> int:
    accepted = [i for ids in log.accepted.values() for i in ids]
    lost = [i for i in accepted if not agent.seen[i]]
    twice = sum(1 for i in accepted if agent.seen[i] > 1)
    reordered = sum(1 for ses, ids in log.accepted.items() if agent.order.get(ses, []) != ids)
    rows = [
        ["POSTs by clients", str(log.posts)],
        ["accepted", str(len(accepted))],
        ["duplicates collapsed", str(log.duplicates)],
        ["refused while full (429, re-sent)", str(log.refused)],
        ["faults injected by the agent", str(sum(agent.faults.values()))],
        *([f"  {k.replace('_', ' ')}", str(v)] for k, v in sorted(agent.faults.items())),
        ["delivered", str(sum(1 for i in accepted if agent.seen[i]))],
        ["run twice by the agent", str(twice)],
        ["sessions out of order", str(reordered)],
        ["lost", str(len(lost))],
    ]
    click.echo(table(["", "count"], rows))
    click.echo(f"({elapsed:.1f} s)")
    return 1 if lost or twice or reordered else 0


@click.command()
@click.option("--prompts", default=200, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--sessions", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option("--seed", default=1, show_default=True, type=int, help="the agent's fault draw")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="the embedded Valkey's data (default: a temporary directory)",
)
@click.option("--timeout", default=300.0, show_default=True, help="seconds to wait for delivery")
def demo(prompts: int, sessions: int, seed: int, data_dir: Path | None, timeout: float) -> None:
    """Run N prompts through the service against an agent that fails at random."""
    # The table tells the story; per-request and per-failure logs would bury the progress bar.
    for name in ("httpx", "prompt_outbox"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="prompt-outbox-demo-") as tmp:
        code = asyncio.run(_demo(prompts, sessions, seed, data_dir or Path(tmp), timeout))
    raise SystemExit(code)
