"""What a test needs from the host (Chromium, redis-server, systemd-analyze, openssl, node and
npm, playwright): ``make test`` installs it. Without it a test is skipped here, with the reason,
and fails on CI (``CI`` set), where every test must run. One helper decides that, for all."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    """Something the test needs is missing: a failure on CI, a skip with ``reason`` elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (on CI every test must run: make test installs it)")
    pytest.skip(reason)


def tool(name: str) -> str:
    """The path of host tool ``name`` on PATH, or :func:`unavailable`."""
    found = shutil.which(name)
    if found is None:
        unavailable(f"{name} is not installed (make test installs it)")
    return found
