"""The TypeScript client's browser bundle (clients/typescript/dist/browser.js) in a real
Chromium, against a real ``prompt-outbox serve`` with auth on and a recording webhook agent.

The page is served on serve's own origin (``/app/...``, answered by Playwright's
``page.route``), so it calls the API same-origin with no CORS. It sends a prompt with a
``LocalStorageStore``; the POST reaches the server (``route.fetch()``: accepted), and the page
is reloaded before the answer gets to it. The new page finds the prompt in localStorage,
``resumePending()`` sends it again with its key (a 200 replay of the same entry), the agent
gets it exactly once and the store ends empty.

Chromium is Debian's (``make test`` installs it); Playwright never downloads a browser here.
Skipped, with the reason, without Chromium, Playwright, node or npm; on CI (``CI`` set) that
fails instead."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from devtools import npm, ts_client

from prompt_outbox.embedded import free_port
from tests.support.agent import SECRET, Agent
from tests.support.serve import service, wait_healthy
from tests.support.tools import unavailable

CHROMIUM = Path("/usr/bin/chromium")
TOKEN = "browser-token"
WS, SES = "acme", "chat-1"
PREFIX = "outbox-test:"
PAGE = f"""<!doctype html>
<meta charset="utf-8">
<title>prompt-outbox client</title>
<script type="module">
  import {{ OutboxClient, LocalStorageStore }} from "/app/browser.js";
  window.client = new OutboxClient({{
    baseUrl: location.origin,
    token: {json.dumps(TOKEN)},
    store: new LocalStorageStore({json.dumps(PREFIX)}),
    backoff: {{ initialMs: 50, maxMs: 500 }},
  }});
  window.pendingKeys = () =>
    Object.keys(localStorage).filter((k) => k.startsWith({json.dumps(PREFIX)}));
  window.ready = true;
</script>
"""


@pytest.fixture(scope="module")
def bundle() -> bytes:
    if not CHROMIUM.exists():
        unavailable(f"no Chromium at {CHROMIUM} (make test installs Debian's chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("playwright is not installed (pip install -e '.[test]')")
    try:
        ts_client.ensure_built()
    except npm.NpmUnavailable as exc:
        unavailable(str(exc))
    return ts_client.BUNDLE.read_bytes()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, Agent]]:
    """A serve with auth on, delivering to a recording agent; its origin and the agent."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"token": TOKEN, "user": "u", "workspaces": [WS]}]}))
    port = free_port()
    with Agent() as agent:
        args = ["--port", str(port), "--data-dir", str(tmp_path / "data"), "--tokens", str(tokens)]
        args += ["--webhook-url", agent.url, "--webhook-verify-url", agent.verify_url]
        with service(args, {"PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()}):
            wait_healthy(port)
            yield f"http://127.0.0.1:{port}", agent


def _queue(origin: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{origin}/v1/workspaces/{WS}/sessions/{SES}/prompts",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 200, r.text
    entries: list[dict[str, Any]] = r.json()["entries"]
    return entries


@pytest.mark.timeout(120)
def test_a_reload_before_the_answer_then_resume_pending_delivers_once(
    bundle: bytes, stack: tuple[str, Agent]
) -> None:
    from playwright.sync_api import Route, sync_playwright

    origin, agent = stack
    held: dict[str, Any] = {}  # the first POST, which reached the server, and its answer
    posts: list[str] = []  # the Idempotency-Key of every POST the page made
    reached = threading.Event()

    def app(route: Route) -> None:
        if route.request.url.endswith("/app/browser.js"):
            route.fulfill(status=200, content_type="text/javascript", body=bundle)
        else:
            route.fulfill(status=200, content_type="text/html", body=PAGE)

    def prompts(route: Route) -> None:
        request = route.request
        if request.method != "POST":
            route.fallback()
            return
        posts.append(request.headers.get("idempotency-key", ""))
        if not held:
            answer = route.fetch()  # it reaches serve and is accepted ...
            held.update(status=answer.status, body=answer.json(), key=posts[-1])
            reached.set()
            return  # ... and the answer never reaches the page: it is reloaded instead
        route.fallback()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route(f"{origin}/app/**", app)
            page.route(f"{origin}/v1/workspaces/{WS}/sessions/{SES}/prompts", prompts)
            page.goto(f"{origin}/app/index.html")
            page.wait_for_function("window.ready === true")
            page.evaluate(f"() => {{ client.send({WS!r}, {SES!r}, 'hello from the page'); }}")
            deadline = time.monotonic() + 15
            while not reached.is_set():  # let Playwright dispatch the route handler
                assert time.monotonic() < deadline, "the POST never came"
                page.wait_for_timeout(20)
            assert held["status"] == 202, held
            entry_id = held["body"]["id"]

            page.reload()
            page.wait_for_function("window.ready === true")
            stored = page.evaluate(
                "() => pendingKeys().map((k) => JSON.parse(localStorage.getItem(k)))"
            )
            assert [(s["key"], s["text"]) for s in stored] == [
                (held["key"], "hello from the page")
            ], "the prompt was saved before its POST and survived the reload"

            outcomes = page.evaluate(
                """async () => (await client.resumePending()).map((o) => ({
                    ok: o.ok, key: o.prompt.key,
                    status: o.ok ? o.result.status : o.error.status,
                    id: o.ok ? o.result.id : null, duplicate: o.ok ? o.result.duplicate : null,
                }))"""
            )
            assert outcomes == [
                {
                    "ok": True,
                    "key": held["key"],
                    "status": 200,
                    "id": entry_id,
                    "duplicate": True,
                }
            ]
            assert posts == [held["key"], held["key"]], "one key, two POSTs"
            assert page.evaluate("() => pendingKeys().length") == 0, "the store ends empty"
        finally:
            browser.close()

    deadline = time.monotonic() + 15
    while entry_id not in agent.ids() or _queue(origin):
        assert time.monotonic() < deadline, f"not delivered: {agent.ids()} {_queue(origin)}"
        time.sleep(0.05)
    time.sleep(0.3)  # a second delivery would come now
    assert agent.ids() == [entry_id], "delivered exactly once"
    [delivery] = agent.received
    assert delivery.text == "hello from the page"
