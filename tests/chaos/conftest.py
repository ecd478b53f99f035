"""Chaos suite plumbing: the summary tables at the end of the run, on the terminal and, with
``CHAOS_REPORT=<file>`` in the environment (``make chaos`` sets it), in that file too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos import report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    sections = [
        (title, table)
        for title, table in (
            ("chaos summary", report.render()),
            ("crash points", report.render_crash_points()),
            ("model and fuzzing", report.render_lines()),
        )
        if table
    ]
    for title, table in sections:
        terminalreporter.section(title)
        terminalreporter.write_line(table)
    if sections and (target := os.environ.get("CHAOS_REPORT")):
        Path(target).write_text("".join(f"## {t}\n\n{table}\n\n" for t, table in sections))
