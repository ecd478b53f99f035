"""Host tools a test needs (chromium, redis-server, node, openssl, ...): ``make test`` installs
them; without one a test is skipped here and fails on CI."""

from __future__ import annotations

import os
import shutil

import pytest


def tool(name: str) -> str:
    """A host tool the test runs; skipped without it here, a failure on CI (``make test``
    installs it), as the browser test decides."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing on CI (make test installs it)")
        pytest.skip(f"{name} is not installed (make test installs it)")
    return found
