"""The Outbox's metrics move with its work: verdicts, re-sends, parks, errors, deliveries."""

from __future__ import annotations

from prompt_outbox import Outbox, Verdict, ambiguous
from tests.agents import ScriptedAgent, ScriptedVerifier
from tests.support.api import samples
from tests.support.clock import ManualClock
from tests.support.tunables import FAST

WS, SES = "ws", "s1"


def value(outbox: Outbox, name: str, **labels: str) -> float:
    text = outbox.metrics.render({}).decode()
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


async def test_verdicts_resends_parks_and_errors_are_counted(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    outbox = manual_outbox
    outbox.set_verifier(ScriptedVerifier([Verdict.ABSENT, Verdict.DELIVERED]))
    agent = ScriptedAgent([ambiguous("cut"), ambiguous("cut again")])
    await outbox.accept(WS, SES, "u", "c1", "one")
    for _ in range(4):  # send (cut), verify (absent), send (cut), verify (delivered)
        clock.advance(FAST.max_verify_backoff + FAST.max_backoff)
        assert await outbox.deliver_once(WS, SES, agent)
    assert value(outbox, "prompt_outbox_verified_total", verdict="absent") == 1
    assert value(outbox, "prompt_outbox_verified_total", verdict="delivered") == 1
    assert value(outbox, "prompt_outbox_retried_total", reason="absent") == 1
    assert value(outbox, "prompt_outbox_delivered_total", via="verify") == 1
    assert value(outbox, "prompt_outbox_delivery_attempts_total", outcome="ambiguous") == 2

    await outbox.accept(WS, SES, "u", "c2", "two")
    assert await outbox.park_workspace(WS, "agent upgrade") == 1
    assert value(outbox, "prompt_outbox_parked_total") == 1
    await outbox.unpark_workspace(WS)
    outbox.set_verifier(None)  # an ambiguous send with no verifier goes to error
    assert await outbox.deliver_once(WS, SES, ScriptedAgent([ambiguous("cut")]))
    assert value(outbox, "prompt_outbox_failed_total") == 1
    assert await outbox.count_by_status() == {"error": 1}
