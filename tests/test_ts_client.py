"""The TypeScript client (clients/typescript): its committed types are what the code generates
now, it builds, and its node tests pass against a real ``prompt-outbox serve``.

The OpenAPI check needs nothing but the venv. The rest needs node and npm: without them it is
skipped, with the reason; on CI (``CI`` set) that fails instead, as tests/test_bench_http.py
does. The first run installs the client's dev dependencies (``npm ci``, devtools/npm.py)."""

from __future__ import annotations

import difflib
import json
import subprocess
from pathlib import Path

import pytest
from devtools import client_types, npm, ts_client

from prompt_outbox import webhook
from tests.support.tools import unavailable

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
        unavailable(str(exc))


def test_the_committed_openapi_json_is_what_the_code_generates() -> None:
    want = client_types.current_openapi()
    got = client_types.OPENAPI.read_text()
    assert got == want, f"clients/typescript/openapi.json {STALE}\n{_diff(want, got, 'openapi')}"


def test_the_committed_schema_is_what_openapi_typescript_generates(node: Path) -> None:
    want = client_types.schema_for(client_types.OPENAPI)
    got = client_types.SCHEMA.read_text()
    assert got == want, f"clients/typescript/src/schema.ts {STALE}\n{_diff(want, got, 'schema')}"


@pytest.fixture(scope="module")
def built(node: Path) -> Path:
    ts_client.ensure_built()
    return node


def test_the_build_gives_esm_modules_types_and_a_browser_bundle(built: Path) -> None:
    dist = ts_client.DIST
    for name in ("index.js", "index.d.ts", "client.js", "schema.d.ts", "browser.js"):
        assert (dist / name).is_file(), name
    bundle = ts_client.BUNDLE.read_text()
    assert "export {" in bundle and "OutboxClient" in bundle  # ESM, with the client
    assert "eventsource-parser" not in bundle.replace("// node_modules/eventsource-parser", "")
    assert not any(line.startswith("import ") for line in bundle.splitlines())  # all bundled


@pytest.mark.timeout(240)
def test_the_node_tests_pass_against_a_real_serve(built: Path) -> None:
    run = ts_client.run_tests(built)
    tail = run.output[-15000:]
    assert run.returncode == 0, f"node --test failed:\n{tail}"
    assert run.count("fail") == 0 and run.count("pass") >= 20, f"too few tests ran:\n{tail}"


def run_module(node: Path, script: str) -> str:
    """What an ES module ``script`` run by ``node`` in the client's folder prints."""
    done = subprocess.run(
        [str(node), "--input-type=module", "-e", script],
        cwd=client_types.CLIENT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_signature_made_by_the_ts_helper_verifies_with_the_python_one(built: Path) -> None:
    """The other half of clients/typescript/test/webhook.test.mjs (where the Python deliverer's
    real deliveries verify with ``verifyWebhook``): ``signWebhook`` signs, Python verifies."""
    body = '{"id":"e-ts","text":"h\u00e9llo from node"}'
    fields = {"timestamp": 1_700_000_000, "workspace": "acme", "session": "s-1", "entryId": "e-ts"}
    script = (
        "import { signWebhook } from './dist/index.js';"
        f"const fields = {json.dumps(fields)};"
        f"fields.body = {json.dumps(body)};"
        "console.log(await signWebhook('ts-secret', fields));"
    )
    signature = run_module(built, script)
    headers = {
        webhook.SIGNATURE_HEADER: signature,
        webhook.TIMESTAMP_HEADER: "1700000000",
        webhook.WORKSPACE_HEADER: "acme",
        webhook.SESSION_HEADER: "s-1",
        webhook.ENTRY_ID_HEADER: "e-ts",
    }
    got = webhook.verify_signature(b"ts-secret", headers, body.encode(), now=1_700_000_000)
    assert got == webhook.SignedDelivery("acme", "s-1", "e-ts", 1_700_000_000)
    for changed in ({webhook.WORKSPACE_HEADER: "other"}, {webhook.SESSION_HEADER: "s-2"}):
        with pytest.raises(webhook.WebhookSignatureError):
            webhook.verify_signature(
                b"ts-secret", headers | changed, body.encode(), now=1_700_000_000
            )


def test_a_turn_end_signed_by_the_ts_helper_verifies_with_the_python_check(built: Path) -> None:
    """``signTurnEnd`` and ``turnEndPath`` (a receiver in Node ending its turn) against
    ``verify_turn_end`` and ``turn_end_path``: the same string, the same path."""
    turn = "t/\u00e9 1?"
    script = (
        "import { signTurnEnd, turnEndPath } from './dist/index.js';"
        f"const fields = {{workspace: 'acme', session: 's-1', turnId: {json.dumps(turn)}, "
        "timestamp: 1700000000};"
        "console.log(JSON.stringify({headers: await signTurnEnd('ts-secret', fields), "
        "path: turnEndPath('acme', 's-1', fields.turnId)}));"
    )
    out = json.loads(run_module(built, script))
    now = 1_700_000_000
    assert webhook.verify_turn_end(b"ts-secret", out["headers"], "acme", "s-1", turn, now=now)
    assert out["path"] == webhook.turn_end_path("acme", "s-1", turn)
    for ws, ses, other in (("other", "s-1", turn), ("acme", "s-2", turn), ("acme", "s-1", "t")):
        with pytest.raises(webhook.WebhookSignatureError):
            webhook.verify_turn_end(b"ts-secret", out["headers"], ws, ses, other, now=now)
