"""Chaos suite plumbing: the summary table at the end of the run."""

from __future__ import annotations

import pytest

from tests.chaos import report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    table = report.render()
    if table:
        terminalreporter.section("chaos summary")
        terminalreporter.write_line(table)
