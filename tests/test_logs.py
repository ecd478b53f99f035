"""Logs (cli/logs.py): a real ``serve`` in JSON names each delivery's workspace, session and
entry, logs a failure for good as a WARNING, gives every request an ID (on the answer and on
its records), and prints uvicorn's own lines as JSON; --log-level hides what is under it."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner

from prompt_outbox.cli import main
from prompt_outbox.cli.logs import ContextFilter, JsonFormatter, QueryRedaction, TextFormatter
from prompt_outbox.core.logctx import log_context, log_fields
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.shardsub import ShardSubscriber
from prompt_outbox.storage.topology import topology_of
from tests.support.agent import SECRET, Agent
from tests.support.logs import logged_service
from tests.support.waiting import eventually, holds

WS = "acme"


def records(log: Path) -> list[dict[str, Any]]:
    """Every line of ``log``, each parsed as JSON: a line that is not one JSON object (the
    --no-auth warning was a plain line) fails the test."""
    parsed = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(isinstance(r, dict) for r in parsed)
    return parsed


def wait_for(log: Path, found: Any, timeout: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = [r for r in records(log) if found(r)]
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"no such record in {log.read_text()}")


def test_json_logs_name_each_delivery_and_failed_for_good_is_a_warning(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    args = ["--data-dir", str(tmp_path / "data"), "--log-format", "json", "--access-log"]
    args += ["--tunables", '{"max_attempts": 1}']
    env = {"PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()}
    with Agent() as agent, logged_service([*args, "--webhook-url", agent.url], log, env) as port:
        agent.actions = [400]  # definitive, and one attempt allowed: error at once
        base = f"http://127.0.0.1:{port}/v1/workspaces/{WS}/sessions"
        failed = httpx.post(f"{base}/s-fail/prompts", json={"clientMessageID": "m1", "text": "x"})
        assert failed.status_code == 202
        [gave_up] = wait_for(log, lambda r: r["message"] == "delivery failed for good")
        sent = httpx.post(
            f"{base}/s-ok/prompts",
            json={"clientMessageID": "m2", "text": "y"},
            headers={"X-Request-ID": "client-chosen-42"},
        )
        assert sent.headers["x-request-id"] == "client-chosen-42"
        [delivered] = wait_for(log, lambda r: r["message"] == "delivered")
        agent.actions = [(202, b"{not json")]  # the deliverer's own warning, naming the entry
        post = httpx.post(f"{base}/s-turn/prompts", json={"clientMessageID": "m3", "text": "z"})
        [unread] = wait_for(log, lambda r: r["message"].startswith("webhook answered 202"))
        hostile = "a" * 129
        for bad in (hostile, "two words", "tab\there"):
            answer = httpx.get(f"{base}/s-ok/prompts", headers={"X-Request-ID": bad})
            assert answer.status_code == 200 and answer.headers["x-request-id"] != bad
            assert len(answer.headers["x-request-id"]) == 32  # one we made
        made = httpx.get(f"{base}/s-ok/prompts").headers["x-request-id"]
        wait_for(log, lambda r: r.get("request_id") == made)
        # A stream ticket opens the workspace's streams for a minute: no access line keeps it.
        root = f"http://127.0.0.1:{port}/v1/workspaces/{WS}"
        ticket = httpx.post(f"{root}/events/ticket").json()["ticket"]
        opened = f"{base}/s-ok/events?lastEventId=0-0&ticket={ticket}"
        with httpx.stream("GET", opened, timeout=10) as stream:
            assert stream.status_code == 200
            ticketed = stream.headers["x-request-id"]
        [access] = wait_for(
            log, lambda r: r["logger"] == "uvicorn.access" and r.get("request_id") == ticketed
        )
    assert gave_up["level"] == "WARNING"
    assert (gave_up["workspace"], gave_up["session"]) == (WS, "s-fail")
    assert gave_up["entry"] == failed.json()["id"] and gave_up["attempt"] == 1
    # One word for what happened (error: for good), the failure's class in a field of its own.
    assert (gave_up["outcome"], gave_up["failure"]) == ("error", "definitive")
    assert "400" in gave_up["error"]
    assert delivered["level"] == "INFO"
    assert (delivered["workspace"], delivered["session"]) == (WS, "s-ok")
    assert delivered["entry"] == sent.json()["id"] and delivered["attempt"] == 1
    # The session's delivery step bound the workspace and session for the deliverer's record.
    assert (unread["workspace"], unread["session"]) == (WS, "s-turn")
    assert unread["entry"] == post.json()["id"]
    everything = records(log)  # every line parsed as JSON, uvicorn's included
    assert {"time", "level", "logger", "message"} <= set(everything[0])
    started = [r for r in everything if r["message"].startswith("Uvicorn running on")]
    assert started and started[0]["logger"] == "uvicorn.error"
    # The access log line of the client's request carries its ID; a hostile one is nowhere.
    ids = [r.get("request_id") for r in everything if r["logger"] == "uvicorn.access"]
    assert "client-chosen-42" in ids and made in ids
    assert hostile not in log.read_text()
    assert ticket not in log.read_text() and "ticket=***" in access["message"]
    assert "lastEventId=***" in access["message"]  # no query value is judged safe
    # From the first line on: the --no-auth warning is a record like any other.
    assert everything[0]["level"] == "WARNING" and "DISABLED" in everything[0]["message"]


def test_every_line_is_json_with_the_token_file_warning_too(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"token": "t0k3n", "user": "u", "admin": True}]}))
    tokens.chmod(0o644)  # others may read it: serve says so
    log = tmp_path / "serve.log"
    args = ["--data-dir", str(tmp_path / "data"), "--log-format", "json"]
    with logged_service(args, log, auth=("--tokens", str(tokens))) as port:
        assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
    everything = records(log)
    warned = [r for r in everything if "token file" in r["message"]]
    assert [r["level"] for r in warned] == ["WARNING"], everything
    assert str(tokens) in warned[0]["message"]


def test_a_command_that_fails_says_so_in_json_too(tmp_path: Path) -> None:
    # Valkey unusable: the group's one line, a JSON record under --log-format json.
    run = CliRunner().invoke(
        main, ["stats", "--log-format", "json", "--valkey-url", "valkey://127.0.0.1:1"]
    )
    assert run.exit_code == 1, run.output
    lines = [json.loads(line) for line in run.stderr.splitlines()]
    assert lines and lines[-1]["level"] == "ERROR" and lines[-1]["exit_code"] == 1
    assert "Valkey unusable" in lines[-1]["message"]
    # A usage error the command found (--no-auth off loopback): exit 2, one JSON record.
    run = CliRunner().invoke(
        main, ["serve", "--log-format", "json", "--no-auth", "--host", "0.0.0.0"]
    )
    assert run.exit_code == 2, run.output
    [line] = [json.loads(line) for line in run.stderr.splitlines()]
    assert line["level"] == "ERROR" and "loopback" in line["message"]


def test_log_level_warning_hides_info_and_the_variable_sets_the_format(tmp_path: Path) -> None:
    data = str(tmp_path / "data")

    def stats(*more: str, env: dict[str, str] | None = None) -> str:
        run = CliRunner().invoke(main, ["stats", "--data-dir", data, *more], env=env)
        assert run.exit_code == 0, run.output
        return run.stderr

    said = stats(env={"PROMPT_OUTBOX_LOG_FORMAT": "json"})
    started = [json.loads(line) for line in said.splitlines()]
    assert any(r["level"] == "INFO" and "embedded Valkey" in r["message"] for r in started)
    assert "embedded Valkey" not in stats("--log-format", "json", "--log-level", "warning")
    assert "embedded Valkey" not in stats(env={"PROMPT_OUTBOX_LOG_LEVEL": "warning"})


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("prompt_outbox.x", logging.WARNING, "", 0, "sent %s", ("it",), None)
    record.__dict__.update(extra)
    return record


def test_the_text_format_prints_the_context_as_key_value() -> None:
    record = _record(workspace="acme", error='agent said "no" = refused')
    with log_context(session="chat-1", workspace="bound"):
        ContextFilter().filter(record)
    line = TextFormatter().format(record)
    assert line.endswith(
        ' WARNING prompt_outbox.x sent it workspace=acme error="agent said \\"no\\" = refused" '
        "session=chat-1"
    )  # the record's own workspace wins over the bound one
    doc = json.loads(JsonFormatter().format(record))
    assert (doc["message"], doc["workspace"], doc["session"]) == ("sent it", "acme", "chat-1")


def test_the_access_line_keeps_no_query_value() -> None:
    line = '%s - "%s %s HTTP/%s" %d'
    target = "/v1/workspaces/acme/events?ticket=eyJ3.sig&access_token=s3cret&bare-secret&"
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        "",
        0,
        line,
        ("127.0.0.1:5", "GET", target, "1.1", 200),
        None,
    )
    assert QueryRedaction().filter(record)
    said = TextFormatter().format(record)
    assert "/v1/workspaces/acme/events?ticket=***&access_token=***&***& HTTP/1.1" in said
    assert not any(secret in said for secret in ("eyJ3", "s3cret", "bare-secret"))


async def test_the_shared_subscriptions_log_under_no_requests_id(client: Client) -> None:
    """The event feed's subscription tasks are started by the first request that wants a
    channel, and live on: their records must not carry that request's ID for ever."""
    seen: list[dict[str, object]] = []
    sub = ShardSubscriber(
        topology_of(client), lambda _channel, _message: seen.append(dict(log_fields()))
    )
    try:
        with log_context(request_id="the-first-stream"):
            sub.add("chan:{ws}:s")
        await eventually(lambda: holds(bool(seen)))  # its subscription confirmed, on its task
    finally:
        await sub.aclose()
    assert "request_id" not in seen[0]


UNAUTHORIZED_PAGE = b"""<!DOCTYPE html>
<html><head><title>401 Authorization Required</title>
<style>body { font-family: sans-serif }</style><script>var x = "<b>";</script></head>
<body>
<center><h1>401 Authorization Required</h1></center>
<hr><center>nginx &amp; friends\x1b[31m</center>
</body></html>
"""


def test_an_agent_answering_an_html_page_leaves_plain_words(tmp_path: Path) -> None:
    # A receiver behind a proxy that answers 401 with its HTML page: lastError, the list
    # table and the log held the page's markup, and the log line said both "definitive" and
    # "to be tried again".
    log, data = tmp_path / "serve.log", str(tmp_path / "data")
    args = ["--data-dir", data, "--log-format", "json"]
    args += ["--tunables", '{"max_attempts": 2, "retry_backoff": 0.2}']
    env = {"PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()}
    with Agent() as agent, logged_service([*args, "--webhook-url", agent.url], log, env) as port:
        agent.actions = [(401, UNAUTHORIZED_PAGE), (401, UNAUTHORIZED_PAGE)]
        url = f"http://127.0.0.1:{port}/v1/workspaces/{WS}/sessions/s-html/prompts"
        assert httpx.post(url, json={"clientMessageID": "m1", "text": "x"}).status_code == 202
        [again] = wait_for(log, lambda r: r["message"].startswith("delivery failed, to be"))
        [gave_up] = wait_for(log, lambda r: r["message"] == "delivery failed for good")
        [entry] = httpx.get(url).json()["entries"]
        listed = CliRunner().invoke(main, ["list", WS, "s-html", "--data-dir", data])
        assert listed.exit_code == 0, listed.output
    expected = "401 Authorization Required 401 Authorization Required nginx & friends [31m"
    assert entry["lastError"] == "attempts exhausted: webhook answered 401: " + expected
    for said in (entry["lastError"], listed.stdout, again["error"], gave_up["error"]):
        assert not any(c in said for c in "<>\x1b"), said
    assert (again["outcome"], again["failure"]) == ("retry", "definitive")
    assert (gave_up["outcome"], gave_up["failure"]) == ("error", "definitive")
    assert again["error"] == "webhook answered 401: " + expected
