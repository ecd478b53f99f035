"""The one "required tool" rule (tests/support/tools.py): a skip here, a failure on CI; and
``make test`` without root: one line saying how to install a missing tool, not apt-get failing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.tools import tool, unavailable

MISSING = "prompt-outbox-no-such-tool"


def test_missing_is_a_skip_off_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no chromium here"):
        unavailable("no chromium here")
    with pytest.raises(pytest.skip.Exception, match=f"{MISSING} is not installed"):
        tool(MISSING)


def test_missing_is_a_failure_on_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"here \(on CI every test must run"):
        unavailable("no chromium here")
    with pytest.raises(pytest.fail.Exception, match=f"{MISSING} is not installed"):
        tool(MISSING)


def test_a_present_tool_is_its_path() -> None:
    assert tool("sh") == shutil.which("sh")


MAKEFILE = Path(__file__).resolve().parent.parent / "Makefile"
NOBODY = 65534


def test_make_without_root_says_how_to_install_a_missing_tool_and_goes_on() -> None:
    # The Makefile's chromium target, pointed at a path that is not there, run by a user who is
    # not root (as root, setpriv drops to nobody): one line naming the apt-get command, exit 0.
    # Before, it ran apt-get update as that user, which failed and stopped make test.
    missing = "/nonexistent/prompt-outbox-chromium"
    argv = [tool("make"), "-s", "-f", str(MAKEFILE), f"CHROMIUM={missing}", missing]
    if os.geteuid() == 0:
        argv = [tool("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    done = subprocess.run(argv, cwd="/", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "missing for the browser tests: sudo apt-get install chromium"
        " (skipped until then; a failure on CI)"
    ]
