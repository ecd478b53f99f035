"""The TypeScript client (clients/typescript): its committed types are what the code generates
now, it builds, and its node tests pass against a real ``prompt-outbox serve``.

The OpenAPI check needs nothing but the venv. The rest needs node and npm: without them it is
skipped, with the reason; on CI (``CI`` set) that fails instead, as tests/test_bench_http.py
does. The first run installs the client's dev dependencies (``npm ci``, devtools/npm.py)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from devtools import client_types, npm

STALE = "is stale: run `make client-types` and commit both files"


def _diff(want: str, got: str, name: str) -> str:
    lines = difflib.unified_diff(
        got.splitlines(), want.splitlines(), f"{name} (committed)", f"{name} (generated)", n=1
    )
    return "\n".join(list(lines)[:40])


@pytest.fixture(scope="module")
def node() -> Path:
    try:
        return npm.ensure_installed(client_types.CLIENT)
    except npm.NpmUnavailable as exc:
        if os.environ.get("CI"):
            raise RuntimeError(f"{exc} (on CI the TypeScript client must be tested)") from exc
        pytest.skip(str(exc))


def test_the_committed_openapi_json_is_what_the_code_generates() -> None:
    want = client_types.current_openapi()
    got = client_types.OPENAPI.read_text()
    assert got == want, f"clients/typescript/openapi.json {STALE}\n{_diff(want, got, 'openapi')}"


def test_the_committed_schema_is_what_openapi_typescript_generates(node: Path) -> None:
    want = client_types.schema_for(client_types.OPENAPI)
    got = client_types.SCHEMA.read_text()
    assert got == want, f"clients/typescript/src/schema.ts {STALE}\n{_diff(want, got, 'schema')}"
