"""Chaos suite plumbing: the summary table at the end of the run."""

from __future__ import annotations

import pytest

from tests.chaos import report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for title, table in (
        ("chaos summary", report.render()),
        ("crash points", report.render_crash_points()),
        ("model and fuzzing", report.render_lines()),
    ):
        if table:
            terminalreporter.section(title)
            terminalreporter.write_line(table)
