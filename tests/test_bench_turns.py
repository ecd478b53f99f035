"""The short form of the held-turns benchmark (bench/turns.py): a few hundred turns held by one
worker process, a one-second check interval. No timing is asserted (docs/performance.md reads
the figures as ratios); what is asserted is what a held turn must not cost: Valkey work while
the turns are held stays at the idle worker's (no renewal, no check through Valkey while the
owner lives), where a check per turn per interval would be tens of commands per turn."""

from __future__ import annotations

from bench import turns

TURNS, CHECK = 300, 1.0


async def test_held_turns_cost_valkey_no_work_per_turn() -> None:
    figures = await turns.run(TURNS, window=2.0, samples=10, check_interval=CHECK)
    assert figures["turns"] == TURNS
    # Less than one command per ten turns per check interval above the idle worker's rate.
    assert figures["held_cps"] < figures["idle_cps"] + 0.1 * TURNS / CHECK, figures
    assert figures["idle_p50"] > 0 and figures["held_p50"] > 0
    text = turns.markdown(figures, 2.0)
    assert "| worker RSS |" in text and "per turn" in text
