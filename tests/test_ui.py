"""The queue page (clients/ui, served by ``serve`` at ``/ui/``).

- The committed bundle in ``src/prompt_outbox/ui/static/`` is what its sources build to
  (rebuilt into a temporary directory, compared byte for byte).
- ``/ui/`` is served with its Content-Security-Policy, ``/`` and ``/ui`` redirect to it, and
  none of it is in the OpenAPI document.
- End to end in Debian's Chromium (Playwright for Python, no browser download) against a real
  ``prompt-outbox serve`` with auth on (a user token and an admin token) and a webhook agent
  the test drives: texts starting ``hold`` wait for the test to release them (the entry stays
  ``delivering``, the session's lock held); while ``failing`` is set, texts starting ``fail``
  are refused with 400 (definitive: with ``max_attempts`` 1, ``error`` at once); sessions in
  ``stuck`` are answered 429 (transient: ``pending`` with a 30 s backoff, the lock free, so
  the entry can be edited or parked); texts starting ``turn`` are answered 202 with
  ``{"turn": agent.turn_id}``: the agent works on it, the session is held in turn until the
  test ends the turn through the end route. Every wait is on the page's state (Playwright's
  ``expect``), never a fixed sleep.

Skipped, with the reason, without Chromium, Playwright, node or npm; on CI (``CI`` set) that
fails instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import httpx
import pytest
from devtools import npm, ui

from prompt_outbox.embedded import free_port
from prompt_outbox.webhook import turn_end_path
from tests.support.agent import SECRET, Agent, Answer, Post
from tests.support.serve import service, wait_healthy
from tests.support.tools import unavailable

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = Path("/usr/bin/chromium")
DOCS = Path(__file__).resolve().parents[1] / "docs"
USER, ADMIN = "alice-ui-token", "ops-ui-token"
TUNABLES = {"max_attempts": 1, "retry_backoff": 30, "max_backoff": 60}
XSS = ["<script>window.__xss=1</script>", '<img src=x onerror="window.__xss=1">']
# The browser's line for the turn route's 404 (the console line names the URL it loaded).
NO_TURN = re.compile(
    r"Failed to load resource: .* status of 404 \(Not Found\) @ .*/sessions/[^/]+/turn"
)
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'"
)


# ---------------------------------------------------------------- the bundle and its serving


def test_the_committed_bundle_is_what_the_sources_build(tmp_path: Path) -> None:
    try:
        ui.build(tmp_path)
    except npm.NpmUnavailable as exc:
        unavailable(str(exc))
    for name in ui.FILES:
        built, committed = (tmp_path / name).read_bytes(), (ui.STATIC / name).read_bytes()
        assert built == committed, (
            f"src/prompt_outbox/ui/static/{name} is stale (its sources, or the TypeScript "
            "client's, changed): run `make ui` and commit it"
        )


def test_ui_is_served_with_its_csp_and_slash_redirects(stack: tuple[str, DrivenAgent]) -> None:
    origin, _ = stack
    with httpx.Client(base_url=origin) as http:
        page = http.get("/ui/")  # no token: the page asks for one
        assert page.status_code == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"] == CSP
        assert page.headers["x-content-type-options"] == "nosniff"
        assert '<script type="module" src="app.js">' in page.text
        for name, kind in (("app.js", "javascript"), ("app.css", "text/css")):
            asset = http.get(f"/ui/{name}")
            assert asset.status_code == 200 and kind in asset.headers["content-type"], name
            assert asset.headers["content-security-policy"] == CSP
            assert asset.content == (ui.STATIC / name).read_bytes()
        for path in ("/", "/ui"):
            moved = http.get(path)
            assert moved.status_code == 307 and moved.headers["location"] == "ui/", path
        assert http.get("/", follow_redirects=True).url.path == "/ui/"
        assert http.get("/ui/nothing.js").status_code == 404
        paths = http.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p == "/" or p.startswith("/ui")], "the page is no API"


def test_the_bundle_never_writes_html() -> None:
    # The XSS rule (clients/ui/README.md): text from the API reaches the DOM only as text.
    # The bundle is all the code the page runs (the client and eventsource-parser included),
    # with esbuild's comments gone; none of the HTML sinks may appear in it.
    code = (ui.STATIC / "app.js").read_text()
    sinks = ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function("]
    assert [s for s in sinks if s in code] == []
    assert "<script>" not in (ui.STATIC / "index.html").read_text()  # no inline script


def test_the_wheel_ships_the_page() -> None:
    # hatch packs every file under src/prompt_outbox that git does not ignore.
    ignored = [p for p in ui.FILES if _git_ignores(ui.STATIC / p)]
    assert not ignored, f"git ignores {ignored}: the wheel would leave them out"


def _git_ignores(path: Path) -> bool:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=root, check=False)
    return done.returncode == 0


# ---------------------------------------------------------------- the agent the test drives


class DrivenAgent(Agent):
    """The webhook agent the page test drives: ``hold*`` texts are held until ``released``;
    ``fail*`` texts get 400 while ``failing``; sessions in ``stuck`` get 429; ``turn*`` texts
    are recorded and answered 202 with the turn ``turn_id`` (its verify URL says ``running``
    for it until ``turns`` drops it); everything else is recorded and answered 200."""

    def __init__(self) -> None:
        super().__init__(plain_verify=True)
        self.failing = True
        self.turn_id = "turn-1"
        self.stuck: set[str] = set()

    def answer(self, post: Post) -> Answer:
        if post.session in self.stuck:
            return Answer(429, record=False)
        if post.text.startswith("fail") and self.failing:
            return Answer(400, record=False)
        if post.text.startswith("turn"):
            self.turns[self.turn_id] = "running"
            return Answer(202, json.dumps({"turn": self.turn_id}).encode())
        return Answer(hold=post.text.startswith("hold"))


# ---------------------------------------------------------------- the page in Chromium


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, DrivenAgent]]:
    """A serve with auth on (a user token for acme and beta, an admin token) and short
    tunables, delivering to the driven agent; its origin and the agent."""
    tmp = tmp_path_factory.mktemp("ui")
    tokens = tmp / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": USER, "user": "alice", "workspaces": ["acme", "beta"]},
                    {"token": ADMIN, "user": "ops", "admin": True},
                ]
            }
        )
    )
    port = free_port()
    with DrivenAgent() as agent:
        args = ["--port", str(port), "--data-dir", str(tmp / "data"), "--tokens", str(tokens)]
        args += ["--webhook-url", agent.url, "--webhook-verify-url", agent.verify_url]
        args += ["--tunables", json.dumps(TUNABLES)]
        with service(args, {"PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()}):
            wait_healthy(port)
            yield f"http://127.0.0.1:{port}", agent


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        unavailable(f"no Chromium at {CHROMIUM} (make test installs Debian's chromium)")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -e '.[test]')")
    expect.set_options(timeout=10_000)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Seen:
    """What a page did besides drawing: console errors, uncaught errors, dialogs, requests."""

    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def unexpected(self, *allowed_statuses: int) -> list[str]:
        """Console errors other than the browser's line for an answer with an allowed status,
        or for the turn route's 404 (``no_turn``: how it says the session is in no turn, and
        the session view asks it after a reset with no pending entry)."""
        allowed = tuple(f"status of {s} " for s in allowed_statuses)
        return [
            m for m in self.console if not any(a in m for a in allowed) and not NO_TURN.fullmatch(m)
        ] + self.errors


@contextlib.contextmanager
def opened(browser: Browser, *, phone: bool = False) -> Iterator[tuple[Page, Seen]]:
    """A fresh tab (its own sessionStorage), desktop 1280x800 or phone 390x844."""
    if phone:
        context = browser.new_context(
            viewport={"width": 390, "height": 844},
            device_scale_factor=2,
            is_mobile=True,
            has_touch=True,
        )
    else:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    seen = Seen()
    page.on(
        "console",
        lambda m: (
            seen.console.append(f"{m.text} @ {m.location['url']}") if m.type == "error" else None
        ),
    )
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.on("dialog", lambda d: (seen.dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: seen.requests.append(r.url))
    try:
        yield page, seen
    finally:
        context.close()


def accept(origin: str, token: str, ws: str, ses: str, text: str) -> str:
    r = httpx.post(
        f"{origin}/v1/workspaces/{ws}/sessions/{ses}/prompts",
        json={"clientMessageID": os.urandom(8).hex(), "text": text},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 202, r.text
    entry_id: str = r.json()["id"]
    return entry_id


def listing(origin: str, ws: str, ses: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{origin}/v1/workspaces/{ws}/sessions/{ses}/prompts",
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert r.status_code == 200, r.text
    entries: list[dict[str, Any]] = r.json()["entries"]
    return entries


def sign_in(page: Page, token: str) -> None:
    page.locator("#token").fill(token)
    page.locator("#sign-in button[type=submit]").click()


def card(page: Page, entry_id: str) -> Any:
    return page.locator(f'#entries li.entry[data-id="{entry_id}"]')


def go(page: Page, hash_: str) -> None:
    page.evaluate("(h) => { location.hash = h; }", hash_)


def confirm(page: Page) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#ask")).to_be_visible()
    page.locator("#ask-ok").click()


def test_the_queue_follows_deliveries_and_its_actions_work(
    stack: tuple[str, DrivenAgent], browser: Browser
) -> None:
    from playwright.sync_api import expect

    origin, agent = stack
    agent.failing = True
    agent.released.clear()
    with opened(browser) as (page, seen):
        notice = page.locator("#notice")
        page.goto(f"{origin}/")  # redirected to the page, which asks for a token
        expect(page).to_have_url(f"{origin}/ui/")
        expect(page.locator("#sign-in")).to_be_visible()
        sign_in(page, "not-a-token")
        expect(page.locator("#sign-in .error-box")).to_have_text("That token was refused.")
        sign_in(page, USER)
        expect(page.locator("#user")).to_have_text("alice")
        expect(page.locator("#admin-badge")).to_have_count(0)
        token_key = "prompt-outbox-ui:token"
        assert page.evaluate("(k) => sessionStorage.getItem(k)", token_key) == USER
        assert page.evaluate("() => localStorage.length") == 0, "never in localStorage"
        assert USER not in page.url

        # The pills follow the agent: one entry held in delivery, one blocked behind it.
        held = accept(origin, USER, "acme", "chat-1", "hold: summarize the CI run")
        failing = accept(origin, USER, "acme", "chat-1", "fail: deploy to staging")
        row = page.locator('#workspaces li[data-ws="acme"]')
        expect(row.locator(".pill-delivering")).to_have_text("1 delivering")
        expect(row.locator(".pill-pending")).to_have_text("1 pending")
        row.locator("a.name").click()
        expect(page).to_have_url(f"{origin}/ui/#/ws/acme")
        expect(page.locator("#ws-bulk")).to_be_visible()
        expect(page.locator("#ws-admin")).to_have_count(0)  # a user token: no admin controls
        session_row = page.locator('#sessions li[data-session="chat-1"]')
        expect(session_row).to_contain_text("delivering for")
        expect(session_row).to_contain_text("blocked behind an in-flight delivery for")
        session_row.locator("a.name").click()
        expect(page).to_have_url(f"{origin}/ui/#/ws/acme/s/chat-1")
        expect(page.locator(".live")).to_have_text("live")
        expect(card(page, held).locator(".pill")).to_have_text("delivering")
        expect(card(page, failing).locator(".pill")).to_have_text("pending")
        expect(card(page, failing)).to_contain_text("blocked behind an in-flight delivery for")
        page.reload()  # the hash keeps the view, sessionStorage the token
        expect(card(page, held).locator(".pill")).to_have_text("delivering")
        expect(page.locator("#sign-in")).to_have_count(0)

        # A delivery holds the session: dismissing is refused as busy, not as gone.
        card(page, failing).locator("button.dismiss").click()
        confirm(page)
        expect(notice).to_contain_text("busy, try again")
        expect(notice).not_to_contain_text("gone")
        expect(card(page, failing)).to_have_count(1)

        agent.released.set()  # the held one is delivered; the next one is refused: error
        expect(card(page, held)).to_have_count(0)
        expect(card(page, failing).locator(".pill")).to_have_text("error")
        expect(card(page, failing).locator(".last-error")).to_contain_text("400")
        assert page.locator("#entries li.entry").count() == 1
        # Retry, and it is delivered.
        agent.failing = False
        card(page, failing).locator("button.retry").click()
        expect(card(page, failing)).to_have_count(0)
        assert agent.ids()[-2:] == [held, failing]

        # Edit a pending entry (429: waiting out a backoff, the lock free), then dismiss it.
        agent.stuck.add("chat-2")
        later = accept(origin, USER, "acme", "chat-2", "later: rotate the keys")
        go(page, "#/ws/acme/s/chat-2")
        expect(card(page, later)).to_contain_text("transient failures 1")
        expect(card(page, later)).to_contain_text("next attempt in")
        expect(card(page, later).locator(".pill")).to_have_text("pending")
        card(page, later).locator("button.edit").click()
        card(page, later).locator("textarea").fill("later: rotate the keys, then say so")
        card(page, later).locator("button.save").click()
        expect(notice).to_have_text("edited: the new text goes out")
        expect(card(page, later).locator(".full-text")).to_have_text(
            "later: rotate the keys, then say so"
        )  # from the stream's `edited` update
        assert listing(origin, "acme", "chat-2")[0]["text"] == "later: rotate the keys, then say so"
        card(page, later).locator("button.dismiss").click()
        expect(page.locator("#ask-message")).to_contain_text("removed for good")
        page.locator("#ask-cancel").click()  # cancelled: nothing happens
        expect(page.locator("#ask")).to_be_hidden()
        expect(card(page, later)).to_have_count(1)
        card(page, later).locator("button.dismiss").click()
        confirm(page)
        expect(notice).to_have_text("dismissed")
        expect(card(page, later)).to_have_count(0)
        expect(page.locator("#entries .empty")).to_have_text("The queue is empty.")
        assert listing(origin, "acme", "chat-2") == []

        # Bulk retry of a session's error entries.
        agent.failing = True
        two = [accept(origin, USER, "acme", "chat-3", f"fail: step {i}") for i in (1, 2)]
        go(page, "#/ws/acme/s/chat-3")
        for entry_id in two:
            expect(card(page, entry_id).locator(".pill")).to_have_text("error")
        agent.failing = False
        page.get_by_role("button", name="Retry errors", exact=True).click()
        expect(notice).to_have_text("retried 2 error entries")
        for entry_id in two:
            expect(card(page, entry_id)).to_have_count(0)
        assert agent.ids()[-2:] == two

        # Bulk dismiss of a workspace's error entries (confirmed first).
        agent.failing = True
        others = {s: accept(origin, USER, "acme", s, "fail: nightly") for s in ("chat-4", "chat-5")}
        go(page, "#/ws/acme")
        for ses in others:
            expect(page.locator(f'#sessions li[data-session="{ses}"] .pill-error')).to_have_text(
                "1 error"
            )
        page.get_by_role("button", name="Dismiss all errors").click()
        expect(page.locator("#ask-message")).to_contain_text("every error entry of workspace acme")
        confirm(page)
        expect(notice).to_have_text("dismissed 2 error entries")
        for ses in others:
            expect(page.locator(f'#sessions li[data-session="{ses}"]')).to_have_count(0)
        assert seen.unexpected(401, 409) == [], "only the refused token's 401s and the busy 409"
        assert seen.dialogs == []


def first_event(origin: str, ws: str, ses: str) -> tuple[str, str]:
    """The first message of the session's real event stream (its queue.reset), as sent, and
    its event ID."""
    url = f"{origin}/v1/workspaces/{ws}/sessions/{ses}/events"
    lines: list[str] = []
    with httpx.stream("GET", url, headers={"Authorization": f"Bearer {USER}"}, timeout=10) as r:
        for line in r.iter_lines():
            lines.append(line)
            if line == "" and any(x.startswith("data:") for x in lines):
                break
    [event_id] = [x.removeprefix("id:").strip() for x in lines if x.startswith("id:")]
    return "\n".join(lines) + "\n", event_id


def test_a_broken_stream_resumes_by_its_id(
    stack: tuple[str, DrivenAgent], browser: Browser
) -> None:
    from playwright.sync_api import Route, expect

    origin, agent = stack
    agent.stuck.add("chat-8")  # 429: entries stay pending, on the page
    first = accept(origin, USER, "acme", "chat-8", "before the break")
    reset, reset_id = first_event(origin, "acme", "chat-8")  # a real reset and its real ID
    second = accept(origin, USER, "acme", "chat-8", "during the break")
    streams: list[dict[str, str]] = []

    def events(route: Route) -> None:
        streams.append(route.request.headers)
        if len(streams) == 1:  # the page's first stream: that reset, then the stream ends
            route.fulfill(status=200, content_type="text/event-stream", body=reset)
        else:
            route.continue_()

    with opened(browser) as (page, seen):
        page.route("**/sessions/chat-8/events*", events)
        page.goto(f"{origin}/ui/#/ws/acme/s/chat-8")
        sign_in(page, USER)
        entries = page.locator("#entries")
        expect(card(page, second)).to_be_visible()  # what it missed, after the reconnect
        expect(page.locator(".live")).to_have_text("live")
        expect(entries).to_have_attribute("data-resets", "1")  # resumed: no second reset
        assert "last-event-id" not in streams[0]
        assert streams[1]["last-event-id"] == reset_id, "the reconnect names its resume point"
        ids = [e.get_attribute("data-id") for e in entries.locator("li.entry").all()]
        assert ids == [first, second]
        assert seen.unexpected(401) == []


def test_an_admin_parks_unparks_and_sweeps_a_workspace(
    stack: tuple[str, DrivenAgent], browser: Browser
) -> None:
    from playwright.sync_api import expect

    origin, agent = stack
    agent.stuck.add("night")  # answered 429: pending in backoff, so it can be parked
    entry_id = accept(origin, ADMIN, "beta", "night", "later: the nightly report")
    with opened(browser) as (page, seen):
        notice = page.locator("#notice")
        page.goto(f"{origin}/ui/#/ws/beta/s/night")
        sign_in(page, ADMIN)
        expect(page.locator("#admin-badge")).to_have_text("admin")
        expect(card(page, entry_id)).to_contain_text("transient failures 1")
        go(page, "#/ws/beta")
        expect(page.locator("#ws-admin")).to_be_visible()
        page.get_by_role("button", name="Park…").click()
        expect(page.locator("#ask-input")).to_be_visible()
        page.locator("#ask-input").fill("maintenance window")
        confirm(page)
        expect(notice).to_have_text("parked 1 entries")
        go(page, "#/ws/beta/s/night")
        expect(card(page, entry_id).locator(".pill")).to_have_text("parked")
        expect(card(page, entry_id).locator(".last-error")).to_have_text(
            "parked: maintenance window"
        )
        expect(card(page, entry_id).locator("button.edit")).to_be_hidden()
        go(page, "#/ws/beta")
        page.get_by_role("button", name="Unpark").click()
        expect(notice).to_have_text("unparked 1 entries")
        go(page, "#/ws/beta/s/night")
        expect(card(page, entry_id).locator(".pill")).to_have_text("pending")
        go(page, "#/ws/beta")
        page.get_by_role("button", name="Sweep…").click()
        confirm(page)
        expect(notice).to_contain_text("swept:")
        # The one console line: the first /v1/me with no token (how the page tells --no-auth).
        assert seen.unexpected(401) == [] and seen.dialogs == []


def test_a_session_in_turn_is_a_state_of_its_own(
    stack: tuple[str, DrivenAgent], browser: Browser
) -> None:
    """Long turns: the agent works on a delivered prompt (202 {"turn"}), the session is held in
    turn. The page says so over the queue, with the turn's ID (hostile: shown as text), from
    the stream's ``turn`` update; a reload while nothing waits brings it back, ID and age, from
    the turn route (the reset holds no entry); the entry behind it waits for the turn, not for
    a send; a reload brings the state back from the entries' ``inTurnFor``; the workspace's row
    says the agent is working, not "blocked behind a delivery"; a dismiss meanwhile is busy;
    the end route ends the turn: the page says how long it took and why, and the next entry
    goes."""
    from playwright.sync_api import Route, expect

    origin, agent = stack
    ws, ses = "acme", "turns-1"
    turn_id = agent.turn_id = '<img src=x onerror="window.__xss=2">'
    with opened(browser) as (page, seen):
        page.goto(f"{origin}/ui/#/ws/{ws}/s/{ses}")
        sign_in(page, USER)
        expect(page.locator(".live")).to_have_text("live")
        line = page.locator("#turn")
        expect(line).to_be_hidden()  # no turn yet
        first = accept(origin, USER, ws, ses, "turn: refactor the parser")
        expect(line).to_have_attribute("data-state", "turn")  # from the `turn` update
        expect(line).to_contain_text("agent working:")
        expect(line).to_contain_text(f"turn {turn_id}")
        expect(card(page, first)).to_have_count(0)  # delivered: out of the queue

        # A reload while the turn holds and nothing waits: the reset is empty, so the page
        # asks the turn route. Its real answer, 130 s older on the way (an age the test can
        # tell from the page's own count), says the ID and how long.
        def older(route: Route) -> None:
            real = route.fetch()
            route.fulfill(
                response=real, json={**real.json(), "seconds": real.json()["seconds"] + 130}
            )

        page.route(f"**/sessions/{ses}/turn", older)
        page.reload()
        expect(line).to_have_attribute("data-state", "turn")
        # 130 s and the turn's real age (a loaded machine may take a while to reload).
        expect(line).to_contain_text(re.compile(r"agent working: 2 min [1-5]\d s"))
        expect(line).to_contain_text(f"(turn {turn_id})")
        page.unroute(f"**/sessions/{ses}/turn")
        after = accept(origin, USER, ws, ses, "then: run the tests")
        waiting = card(page, after)
        expect(waiting.locator(".pill")).to_have_text("pending")
        expect(waiting).to_contain_text("waiting for the agent's turn to end")
        expect(waiting).not_to_contain_text("blocked behind an in-flight delivery")
        expect(waiting).to_have_attribute("data-waiting", "turn")

        go(page, f"#/ws/{ws}")  # the workspace's row: the overview's inTurnFor
        row = page.locator(f'#sessions li[data-session="{ses}"]')
        expect(row).to_contain_text("agent working for")
        expect(row).to_contain_text("next entry waits for the turn")
        expect(row).not_to_contain_text("blocked behind")
        go(page, f"#/ws/{ws}/s/{ses}")
        page.reload()  # no `turn` update now: the reset's inTurnFor says it
        expect(line).to_have_attribute("data-state", "turn")
        expect(line).to_contain_text("agent working:")
        expect(line).to_contain_text("its ID comes with its end")
        expect(waiting).to_contain_text("waiting for the agent's turn to end")

        # The turn holds the session: dismissing the entry behind it is busy, not gone.
        waiting.locator("button.dismiss").click()
        confirm(page)
        expect(page.locator("#notice")).to_contain_text("busy, try again")
        expect(page.locator("#notice")).to_contain_text("the agent's turn")
        expect(waiting).to_have_count(1)
        assert agent.ids()[-1] == first, "nothing sent during the turn"

        agent.turns.pop(turn_id)
        r = httpx.post(
            origin + turn_end_path(ws, ses, turn_id), headers={"Authorization": f"Bearer {USER}"}
        )
        assert r.status_code == 200 and r.json()["ended"] is True, r.text
        expect(line).to_have_attribute("data-state", "ended")  # from the `turn_ended` update
        expect(line).to_contain_text(f"last turn {turn_id} ended after ")
        expect(line).to_contain_text("(the agent said it ended)")
        expect(waiting).to_have_count(0)  # the next entry went once the turn ended
        assert agent.ids()[-2:] == [first, after]
        assert page.evaluate("() => window.__xss") is None
        assert page.locator("img").count() == 0
        assert not [u for u in seen.requests if urlparse(u).path.endswith("/x")]
        # One ask per reset with no pending entry (the first load's, the reload's), no other.
        asked = [u for u in seen.requests if urlparse(u).path.endswith(f"/sessions/{ses}/turn")]
        assert len(asked) == 2, asked
        assert seen.unexpected(401, 409) == [] and seen.dialogs == []
    # The turn of `after` ("then: ..." is answered 200: no turn) left nothing held.
    assert listing(origin, ws, ses) == []


def test_a_reset_in_turn_shows_how_long_and_why_it_is_still_held(
    stack: tuple[str, DrivenAgent], browser: Browser
) -> None:
    """After a (re)load the page learns a turn from the reset alone: the pending entries'
    ``inTurnFor`` (how long) and ``turnWhy`` (why it is still held: the agent could not say).
    A turn that the agent cannot answer about takes a check interval to say so; here a real
    reset of a real pending entry is given those two fields on its way to the page."""
    from playwright.sync_api import Route, expect

    origin, agent = stack
    agent.stuck.add("turns-2")  # 429: the entry stays pending, on the page
    entry_id = accept(origin, USER, "acme", "turns-2", "waits behind a turn")
    reset, _ = first_event(origin, "acme", "turns-2")
    why = "<b>the agent did not say whether the turn ended</b>"
    fields = f',"inTurnFor":{130 * 10**9},"turnWhy":{json.dumps(why)}}}'
    marker = f'"id":"{entry_id}"'
    assert reset.count(marker) == 1 and reset.count("}]}") == 1
    reset = reset.replace("}]}", fields + "]}")  # the entry's last brace, then the list's

    def events(route: Route) -> None:
        if "last-event-id" in route.request.headers:
            route.continue_()
        else:
            route.fulfill(status=200, content_type="text/event-stream", body=reset)

    with opened(browser) as (page, seen):
        page.route("**/sessions/turns-2/events*", events)
        page.goto(f"{origin}/ui/#/ws/acme/s/turns-2")
        sign_in(page, USER)
        line = page.locator("#turn")
        expect(line).to_have_attribute("data-state", "turn")
        expect(line).to_contain_text("agent working: 2 min")
        expect(line).to_contain_text(f"Still held: {why}")  # as text
        expect(card(page, entry_id)).to_contain_text("waiting for the agent's turn to end")
        assert page.locator("#turn b").count() == 0
        assert seen.unexpected(401) == []


def test_no_auth_needs_no_token(browser: Browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    port = free_port()
    args = ["--port", str(port), "--data-dir", str(tmp_path / "data"), "--no-auth"]
    with service(args), opened(browser) as (page, seen):
        wait_healthy(port)
        origin = f"http://127.0.0.1:{port}"
        r = httpx.post(
            f"{origin}/v1/workspaces/dev/sessions/s/prompts",
            json={"clientMessageID": "m1", "text": "waits: no deliverer"},
        )
        assert r.status_code == 202, r.text
        page.goto(f"{origin}/ui/")
        expect(page.locator('#workspaces li[data-ws="dev"] .pill-pending')).to_have_text(
            "1 pending"
        )
        expect(page.locator("#admin-badge")).to_be_visible()
        expect(page.locator("#sign-in")).to_have_count(0)
        expect(page.locator(".sign-out")).to_have_count(0)  # no token to forget
        assert seen.unexpected() == []


def test_hostile_texts_are_shown_as_text_and_nothing_runs(
    stack: tuple[str, DrivenAgent], browser: Browser, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    origin, agent = stack
    agent.failing = True
    agent.released.clear()
    ws, ses = "acme", "chat-7"
    failed = accept(origin, USER, ws, ses, "fail: run the migration on production")
    held = accept(origin, USER, ws, ses, "hold: summarize yesterday's failed deploys")
    hostile = [accept(origin, USER, ws, ses, text) for text in XSS]
    plain = accept(origin, USER, ws, ses, "Then open a PR with the fix\nand ask for a review")
    shots: dict[str, Path] = {}
    try:
        for phone in (False, True):
            with opened(browser, phone=phone) as (page, seen):
                page.goto(f"{origin}/ui/#/ws/{ws}/s/{ses}")
                sign_in(page, USER)
                expect(card(page, failed).locator(".pill")).to_have_text("error")
                expect(card(page, held).locator(".pill")).to_have_text("delivering")
                expect(card(page, plain).locator(".pill")).to_have_text("pending")
                for entry_id, text in zip(hostile, XSS, strict=True):
                    hostile_card = card(page, entry_id)
                    expect(hostile_card.locator(".pill")).to_have_text("pending")
                    hostile_card.locator("summary").click()  # expanded: the full text
                    expect(hostile_card.locator(".full-text")).to_be_visible()
                    expect(hostile_card.locator(".full-text")).to_have_text(text)
                    expect(hostile_card.locator("summary")).to_have_text(text)
                card(page, plain).locator("summary").click()
                assert page.evaluate("() => window.__xss") is None
                assert page.locator("#entries img, #entries script").count() == 0
                assert page.locator("img").count() == 0
                assert page.locator("script").count() == 1  # app.js
                assert not [u for u in seen.requests if urlparse(u).path.endswith("/x")]
                assert seen.dialogs == [] and seen.unexpected(401) == []
                name = "ui-phone.png" if phone else "ui-desktop.png"
                shots[name] = tmp_path / name
                page.evaluate("() => window.scrollTo(0, 0)")
                page.screenshot(path=str(shots[name]))
                assert page.evaluate("() => window.__xss") is None
    finally:
        agent.released.set()
    if os.environ.get("UI_SCREENSHOTS_TO_DOCS"):  # make ui-screenshots: the README's images
        for name, path in shots.items():
            (DOCS / name).write_bytes(path.read_bytes())


def test_the_workspace_charts_its_last_hour_and_a_session_its_history(
    stack: tuple[str, DrivenAgent], browser: Browser, tmp_path: Path
) -> None:
    """The dashboard: the workspace view charts its last hour from GET .../series (accepted,
    delivered, failed per minute; the oldest pending entry's age), and a session view lists
    its delivered prompts with when and how long their turn took (GET .../history). Its own
    workspace: the totals are exactly what this test sent."""
    from playwright.sync_api import expect

    origin, agent = stack
    agent.failing = True
    agent.released.clear()
    ws = "charts"
    turn_id = agent.turn_id = "turn-charts"
    plain = [accept(origin, ADMIN, ws, "plain", f"summarize file {i}") for i in range(3)]
    failed = accept(origin, ADMIN, ws, "plain", "fail: drop the table")
    turned = accept(origin, ADMIN, ws, "work", "turn: refactor the parser")
    waiting = accept(origin, ADMIN, ws, "work", "then: run the tests")  # behind the turn
    with opened(browser) as (page, seen):
        page.goto(f"{origin}/ui/#/ws/{ws}")
        sign_in(page, ADMIN)
        charts = page.locator("#charts")
        # Every prompt but the one behind the turn has gone (or failed): wait on the page.
        expect(charts.locator('[data-chart="delivered"]')).to_have_attribute("data-total", "4")
        expect(charts.locator('[data-chart="accepted"]')).to_have_attribute("data-total", "6")
        expect(charts.locator('[data-chart="failed"]')).to_have_attribute("data-total", "1")
        expect(charts.locator('[data-chart="accepted"] figcaption')).to_contain_text(
            "Accepted 6 in the hour"
        )
        expect(charts.locator('[data-chart="accepted"] rect')).to_have_count(60)
        oldest = charts.locator('[data-chart="oldest"]')
        expect(oldest.locator("figcaption")).to_contain_text(" now")  # one waits behind the turn
        expect(oldest.locator("figcaption")).not_to_contain_text("none pending")
        assert [e["id"] for e in listing(origin, ws, "work")] == [waiting]
        shot = tmp_path / "ui-dashboard.png"
        page.screenshot(path=str(shot))

        agent.turns.pop(turn_id)
        r = httpx.post(
            origin + turn_end_path(ws, "work", turn_id),
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert r.status_code == 200 and r.json()["ended"] is True, r.text
        go(page, f"#/ws/{ws}/s/work")
        history = page.locator("#history")
        expect(history.locator(f'li[data-entry="{waiting}"]')).to_contain_text("no turn")
        done = history.locator(f'li[data-entry="{turned}"]')
        expect(done).to_contain_text(f"turn {turn_id} took ")
        expect(done).to_contain_text("sent ")
        assert float(done.get_attribute("data-turn-seconds") or "-1") >= 0
        expect(history.locator("li")).to_have_count(2)  # newest first
        assert history.locator("li").first.get_attribute("data-entry") == waiting

        go(page, f"#/ws/{ws}/s/plain")
        expect(history.locator("li")).to_have_count(3)  # the failed one was never delivered
        assert (
            history.locator("li").evaluate_all("(l) => l.map((e) => e.dataset.entry)")
            == (plain[::-1])
        )
        assert failed not in history.inner_text()

        go(page, f"#/ws/{ws}")  # a new view asks again: everything done, nothing pending
        expect(charts.locator('[data-chart="delivered"]')).to_have_attribute("data-total", "5")
        expect(oldest).to_have_attribute("data-now", "0")
        expect(oldest.locator("figcaption")).to_contain_text("none pending now")
        assert seen.unexpected(401) == [] and seen.dialogs == []
    if os.environ.get("UI_SCREENSHOTS_TO_DOCS"):  # make ui-screenshots
        (DOCS / "ui-dashboard.png").write_bytes(shot.read_bytes())
