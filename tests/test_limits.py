"""The accept rate per token (api/limits.py): a token bucket per bearer token, answered 429
with Retry-After before the body is read, nothing written; other tokens unaffected."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from prompt_outbox import Outbox
from prompt_outbox.api import RateLimit, create_app
from prompt_outbox.api.auth import Principal
from prompt_outbox.api.errors import ApiError
from prompt_outbox.api.limits import AcceptRates
from prompt_outbox.cli import main
from tests.test_api import ALICE, TOKENS, URL, serve

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


def test_the_default_limit_is_on(outbox: Outbox) -> None:
    # create_app with no accept_rate is limited (the safe default), and so is serve.
    app = create_app(outbox, TOKENS)
    assert app.state.accept_rates.limit == RateLimit()
    assert RateLimit().per_second > 0
    shown = CliRunner().invoke(main, ["serve", "--help"]).output
    assert f"[default: {RateLimit().per_second};" in shown


def test_the_bucket_refills_at_the_rate() -> None:
    now = [100.0]
    rates = AcceptRates(RateLimit(per_second=2, burst=2), clock=lambda: now[0])
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
    rates = AcceptRates(RateLimit(per_second=0, burst=1))
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
