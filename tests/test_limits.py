"""What bounds a caller's cost beyond auth: the accept rate per token (api/limits.py: a token
bucket per bearer token, answered 429 with Retry-After before the body is read, nothing
written, other tokens unaffected), and /metrics, whose scrapes cost O(1) in the data held
(api/health.py: the entries are counted at most once per interval)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import CliRunner
from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox import Outbox
from prompt_outbox.api import RateLimit, create_app
from prompt_outbox.api.auth import Principal
from prompt_outbox.api.errors import ApiError
from prompt_outbox.api.health import EntryCounts
from prompt_outbox.api.limits import Rates
from prompt_outbox.cli import main
from prompt_outbox.storage.client import Client
from tests.support.api import ALICE, TOKENS, URL, samples, serve

pytestmark = pytest.mark.cluster_too

OPS = {"Authorization": "Bearer ops-token"}


def _body(n: int) -> str:
    return f'{{"clientMessageID":"m{n}","text":"prompt {n}"}}'


async def test_a_token_past_its_rate_gets_429_and_nothing_is_written(outbox: Outbox) -> None:
    async for http in serve(outbox, accept_rate=RateLimit(per_second=0.01, burst=3)):
        for n in range(3):
            assert (await http.post(URL, content=_body(n), headers=ALICE)).status_code == 202
        refused = await http.post(URL, content=_body(3), headers=ALICE)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"] == "rate_limited"
        assert int(refused.headers["Retry-After"]) >= 1
        assert len(await outbox.list("acme", "chat-1")) == 3  # the refused one is not there
        # Another token has a bucket of its own (ops is admin: any workspace).
        other = await http.post(URL, content=_body(4), headers=OPS)
        assert other.status_code == 202, other.text
        # Refused before the body is read: even a body that is no JSON gets the 429.
        junk = await http.post(URL, content=b"not json", headers=ALICE)
        assert junk.status_code == 429


async def test_edits_spend_the_same_bucket(outbox: Outbox) -> None:
    # An edit logs the whole entry again: unmetered, one token's edits filled Valkey.
    async for http in serve(outbox, accept_rate=RateLimit(per_second=0.01, burst=2)):
        accepted = await http.post(URL, content=_body(0), headers=ALICE)
        assert accepted.status_code == 202
        url = f"{URL}/{accepted.json()['id']}"
        assert (await http.patch(url, json={"text": "edited"}, headers=ALICE)).status_code == 200
        refused = await http.patch(url, json={"text": "again"}, headers=ALICE)
        assert (refused.status_code, refused.json()["error"]) == (429, "rate_limited")
        [entry] = await outbox.list("acme", "chat-1")
        assert entry.text == "edited"


def test_the_default_limit_is_on(outbox: Outbox) -> None:
    # create_app with no accept_rate is limited (the safe default), and so is serve.
    app = create_app(outbox, TOKENS)
    assert app.state.accept_limits.rates.limit == RateLimit()
    assert app.state.turn_end_rates.limit == RateLimit()  # the end route's own bucket
    assert RateLimit().per_second > 0
    shown = CliRunner().invoke(main, ["serve", "--help"]).output
    assert f"default: {RateLimit().per_second};" in " ".join(shown.split())


def test_the_bucket_refills_at_the_rate() -> None:
    now = [100.0]
    rates = Rates(RateLimit(per_second=2, burst=2), "prompts", clock=lambda: now[0])
    alice = Principal("alice", frozenset({"acme"}))
    rates.take(alice)
    rates.take(alice)
    with pytest.raises(ApiError) as refused:
        rates.take(alice)
    assert (refused.value.status, refused.value.headers) == (429, {"Retry-After": "1"})
    now[0] += 0.5  # one accept's worth at 2 a second
    rates.take(alice)
    with pytest.raises(ApiError):
        rates.take(alice)
    now[0] += 60  # a long quiet spell refills to the burst, not past it
    rates.take(alice)
    rates.take(alice)
    with pytest.raises(ApiError):
        rates.take(alice)


def test_zero_means_no_limit() -> None:
    rates = Rates(RateLimit(per_second=0, burst=1), "prompts")
    alice = Principal("alice", frozenset({"acme"}))
    for _ in range(10_000):
        rates.take(alice)


@pytest.mark.parametrize(
    ("rate", "burst"), [(-1.0, 10), (float("nan"), 10), (float("inf"), 10), (1.0, 0)]
)
def test_a_bad_limit_is_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="RateLimit"):
        RateLimit(rate, burst)


def test_serve_refuses_a_negative_rate() -> None:
    done = CliRunner().invoke(main, ["serve", "--no-auth", "--accept-rate", "-1"])
    assert done.exit_code == 2 and "--accept-rate" in done.output


# -- /metrics: O(1) in the data held (api/health.py EntryCounts) ------------------------------


async def _commands(client: Client) -> int:
    stats: dict[str, Any] = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if "config" not in k and "info" not in k)


async def test_scrapes_cost_no_valkey_command_between_two_counts(
    outbox: Outbox, client: Client
) -> None:
    if isinstance(client, ValkeyCluster):
        pytest.skip("counted on one server's INFO commandstats")
    for i in range(0, 300, 100):
        await asyncio.gather(
            *(outbox.accept(f"w{n}", "s", "u", "c", "x") for n in range(i, i + 100))
        )
    async for http in serve(outbox, count_interval=3600):
        first = await http.get("/metrics")  # the first scrape waits for the first count
        assert samples(first.text)[("prompt_outbox_entries", (("status", "pending"),))] == 300
        await client.config_resetstat()
        for _ in range(20):
            again = await http.get("/metrics")
            assert again.status_code == 200
        # Every scrape read the last count: not one command, however much data is held.
        assert await _commands(client) == 0
        got = samples(again.text)
        assert got[("prompt_outbox_entries", (("status", "pending"),))] == 300
        assert got[("prompt_outbox_entries_counted", ())] > 0


async def test_counts_are_taken_once_per_interval_and_one_at_a_time() -> None:
    now = [0.0]
    calls: list[int] = []
    gate = asyncio.Event()

    async def count() -> dict[str, int]:
        calls.append(1)
        await gate.wait()
        return {"pending": len(calls)}

    counts = EntryCounts(count, interval=10, clock=lambda: now[0])
    gate.set()
    assert await counts.get() == {"pending": 1}  # the first waits for its count
    now[0] = 5
    assert await counts.get() == {"pending": 1} and len(calls) == 1  # within the interval
    now[0] = 11
    gate.clear()
    scrapes = await asyncio.gather(*(counts.get() for _ in range(50)))
    assert scrapes == [{"pending": 1}] * 50  # stale, at once, while ONE recount runs
    assert len(calls) == 2
    gate.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert await counts.get() == {"pending": 2}
    assert EntryCounts(count, interval=0).interval == 0
    assert await EntryCounts(count, interval=0).get() is None  # 0: never counted


async def test_a_failed_recount_keeps_the_last_count() -> None:
    now = [0.0]
    answers: list[dict[str, int] | Exception] = [{"error": 1}, ConnectionError("gone")]

    async def count() -> dict[str, int]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    counts = EntryCounts(count, interval=1, clock=lambda: now[0])
    assert await counts.get() == {"error": 1}
    now[0] = 2
    assert await counts.get() == {"error": 1}
    await asyncio.sleep(0)
    assert await counts.get() == {"error": 1}  # the failure left it as it was
