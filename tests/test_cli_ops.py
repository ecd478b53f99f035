"""The CLI as an operator meets it: --version, one line for a Valkey it cannot use, every
option's variable in --help, stats' totals in JSON, ``tokens add``, a clean stop with open
event streams, and a second serve on a data dir in use refused."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import stat
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import click
import httpx
import pytest
import valkey
import valkey.asyncio as valkey_async
from click.testing import CliRunner

from prompt_outbox import Entry, Outbox
from prompt_outbox.api.auth import TokenTable
from prompt_outbox.cli import main
from prompt_outbox.cli.tokens import add_token
from prompt_outbox.embedded import EmbeddedValkey, free_port, running_url
from tests.support.agent import SECRET, Agent, Answer
from tests.support.failover import wait_for
from tests.support.logs import logged_service
from tests.support.processes import process_group
from tests.support.serve import BIN, wait_healthy


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), env=env)
    return r.exit_code, r.stdout, r.stderr


def test_version_is_the_package_version() -> None:
    code, out, _ = run("--version")
    assert code == 0 and out.split()[-1] == version("prompt-outbox")


COMMANDS = [
    ["stats"],
    ["list", "acme", "chat-1"],
    ["retry", "acme", "chat-1", "01ARZ3NDEKTSV4RRFFQ69G5FAV"],
    ["park", "acme", "--reason", "r"],
    ["cleanup", "acme", "--yes"],
    ["worker", "--webhook-url", "http://127.0.0.1:9/hook"],
    ["serve", "--no-auth", "--port", "0"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_valkey_that_refuses_is_one_line_naming_the_option(
    valkey_server: EmbeddedValkey, command: list[str]
) -> None:
    wrong_password = valkey_server.url.replace(valkey_server.password, "wrong")
    env = {"PROMPT_OUTBOX_WEBHOOK_SECRET": "s", "PROMPT_OUTBOX_VALKEY_URL": wrong_password}
    code, out, err = run(*command, env=env)
    assert code == 1 and out == ""
    [line] = [x for x in err.splitlines() if "authentication is DISABLED" not in x]
    assert "--valkey-url (PROMPT_OUTBOX_VALKEY_URL)" in line and "AuthenticationError" in line


TLS_HINT = "is TLS on at the server? (valkeys:// speaks TLS)"


@pytest.mark.parametrize(
    ("url", "hint"),
    [("valkey://127.0.0.1:{closed}/0", None), ("valkeys://127.0.0.1:{port}/0", TLS_HINT)],
    ids=["nothing-listens", "tls-to-a-plain-server"],
)
def test_an_unreachable_valkey_is_one_line_without_a_traceback(
    valkey_server: EmbeddedValkey, url: str, hint: str | None
) -> None:
    # The bundled server has no TLS: a valkeys:// URL waits out the connect timeout (5 s),
    # and the line says what to check. Nothing listening is no TLS question.
    given = url.format(closed=free_port(), port=valkey_server.port)
    r = subprocess.run(
        [BIN, "stats", "--valkey-url", given], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("Error: Valkey unusable (") and "PROMPT_OUTBOX_VALKEY_URL" in line
    if hint is None:
        assert "TLS" not in line, line
    else:
        assert line.endswith(hint), line


def _commands(group: click.Group) -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += [(f"{name} {sub}", c) for sub, c in _commands(command)]
        else:
            found.append((name, command))
    return found


def test_every_help_shows_each_options_variable() -> None:
    checked = 0
    for name, command in _commands(main):
        _, out, _ = run(*name.split(), "--help")
        shown = " ".join(out.split())
        for param in command.params:
            if isinstance(param, click.Option) and param.envvar:
                assert f"env var: {param.envvar}" in shown, (name, param.name)
                checked += 1
        assert "PROMPT_OUTBOX_LOG_FORMAT" in shown, name  # every command takes the log options
    assert checked > 60


def test_stats_json_has_the_totals(valkey_server: EmbeddedValkey) -> None:
    async def seed() -> None:
        client = valkey_async.Valkey.from_url(valkey_server.url)
        await client.flushall()
        outbox = Outbox(client)
        for ws, ses in (("a", "s1"), ("a", "s2"), ("b", "s1")):
            await outbox.accept(ws, ses, "u", f"m-{ws}-{ses}", "hi")
        await client.aclose()

    asyncio.run(seed())
    code, out, _ = run("stats", "--json", "--valkey-url", valkey_server.url)
    doc = json.loads(out)
    assert code == 0 and doc["workspaces"] == {"a": {"pending": 2}, "b": {"pending": 1}}
    assert doc["total"] == {
        "pending": 3,
        "delivering": 0,
        "verifying": 0,
        "error": 0,
        "parked": 0,
    }


def test_tokens_add_writes_a_0600_file_the_server_reads(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    code, first, err = run("tokens", "add", "--file", str(path), "--workspace", "acme")
    assert code == 0 and "acme" in err
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    code, second, _ = run("tokens", "add", "--file", str(path), "--admin", "--user", "ops")
    assert code == 0 and first != second and len(first.strip()) >= 43
    table = TokenTable.from_file(path)  # what serve reads
    alice, ops = table.lookup(first.strip()), table.lookup(second.strip())
    assert alice is not None and alice.workspaces == {"acme"} and not alice.admin
    assert alice.user_id == "acme"  # the first workspace, without --user
    assert ops is not None and ops.admin and ops.user_id == "ops"
    assert first.strip() in path.read_text() and first.count("\n") == 1  # the token alone


@pytest.mark.parametrize(
    ("content", "args"),
    [
        ("{not json", ["--workspace", "acme"]),
        ('{"tokens": [{"token": "x y", "user": "u"}]}', ["--workspace", "acme"]),
        ('{"tokens": []}', ["--workspace", "not a workspace id!"]),
    ],
    ids=["not-json", "a-bad-row", "a-bad-workspace"],
)
def test_tokens_add_refuses_and_leaves_the_file(
    tmp_path: Path, content: str, args: list[str]
) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(content)
    code, out, err = run("tokens", "add", "--file", str(path), *args)
    assert code == 1 and out == "" and err.startswith(f"Error: {path}: ")
    assert path.read_text() == content
    assert sorted(os.listdir(tmp_path)) == [".tokens.json.lock", "tokens.json"]  # no temp file


def test_two_tokens_add_at_once_take_turns(tmp_path: Path) -> None:
    # The file is read, changed and renamed over: two at once without a lock would each
    # write their own row over the other's. One holds the lock here; an add must wait for it.
    path = tmp_path / "tokens.json"
    added: list[str] = []
    lock = os.open(tmp_path / ".tokens.json.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    waiting = threading.Thread(target=lambda: added.append(add_token(path, ("acme",), "a")))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not path.exists()  # it waits for the lock
    os.close(lock)
    waiting.join(10)
    several = [
        threading.Thread(target=lambda n=n: added.append(add_token(path, ("acme",), f"u{n}")))
        for n in range(8)
    ]
    for thread in several:
        thread.start()
    for thread in several:
        thread.join(10)
    table = TokenTable.from_file(path)
    assert len(added) == 9 and all(table.lookup(token) is not None for token in added)


def test_sigterm_with_open_event_streams_exits_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    opened = threading.Semaphore(0)
    ended: list[str] = []

    def follow(port: int, ses: str) -> None:
        url = f"http://127.0.0.1:{port}/v1/workspaces/acme/sessions/{ses}/events"
        with httpx.stream("GET", url, timeout=60) as answer:
            assert answer.status_code == 200
            opened.release()
            for _ in answer.iter_lines():
                pass
        ended.append(ses)  # the server ended the body: no error on the client's side

    with logged_service(["--data-dir", str(tmp_path / "data")], log) as port:
        readers = [threading.Thread(target=follow, args=(port, f"s{i}")) for i in range(2)]
        for reader in readers:
            reader.start()
        for _ in readers:
            assert opened.acquire(timeout=30)
    # logged_service sent SIGTERM and saw the process exit 0.
    for reader in readers:
        reader.join(timeout=30)
    said = log.read_text()
    assert sorted(ended) == ["s0", "s1"] and "Traceback" not in said, said
    assert "Finished server process" in said  # uvicorn stopped, not killed


@contextmanager
def serve_delivering(
    tmp_path: Path, hook: str | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """serve on its embedded Valkey, leading a process group (as a shell job), with a worker
    delivering one prompt to ``hook`` (by default a receiver that is away: the prompt waits,
    tried again and again), its subscriptions open. Yields the process and the data dir; its
    log is serve.log. Webhooks are signed with SECRET."""
    port, data = free_port(), tmp_path / "data"
    hook = hook or f"http://127.0.0.1:{free_port()}/hook"
    argv = [BIN, "serve", "--no-auth", "--port", str(port), "--data-dir", str(data),
            "--webhook-url", hook]  # fmt: skip
    env = {**os.environ, "PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()}
    with (tmp_path / "serve.log").open("wb") as err, process_group(argv, env, stderr=err) as proc:
        wait_healthy(port)
        url = f"http://127.0.0.1:{port}/v1/workspaces/acme/sessions/s1/prompts"
        answer = httpx.post(url, json={"text": "hi"}, headers={"Idempotency-Key": "k1"})
        assert answer.status_code == 202, answer.text
        yield proc, data


def warnings_in(log: Path) -> list[str]:
    """The log's WARNING records, but --no-auth's own, which every serve here is started with."""
    lines = log.read_text().splitlines()
    return [x for x in lines if " WARNING prompt_outbox" in x and "(--no-auth)" not in x]


def test_a_stop_signal_to_the_process_group_lets_the_send_in_flight_be_written(
    tmp_path: Path,
) -> None:
    # Ctrl-C and a shell's kill %1 signal the whole group. The embedded valkey-server leads a
    # group of its own, so serve finishes the send in flight, writes its outcome, and only then
    # stops the server. (When they shared the group, the server was gone before the write:
    # it retried for 30 s, and the entry was left to be verified after its lease.)
    log = tmp_path / "serve.log"
    with Agent(SECRET) as agent:
        agent.actions = [Answer(hold=True)]
        with serve_delivering(tmp_path, agent.url) as (proc, data):
            wait_for(lambda: agent.ids() != [], timeout=30, what="the prompt never came")
            os.killpg(proc.pid, signal.SIGTERM)
            wait_for(lambda: "Shutting down" in log.read_text(), timeout=30, what="no stop")
            agent.released.set()  # the agent answers 200 to the send in flight
            assert proc.wait(timeout=30) == 0
    said = log.read_text()
    assert "Finished server process" in said and warnings_in(log) == [], said
    assert "never reached Valkey" not in said, said
    with EmbeddedValkey(data) as server:  # free at once: serve stopped its server
        assert asyncio.run(listed(server.url)) == []  # delivered: not staged, not queued


async def listed(url: str) -> list[Entry]:
    client = valkey_async.Valkey.from_url(url)
    try:
        return await Outbox(client).list("acme", "s1")
    finally:
        await client.aclose()


def test_a_valkey_lost_while_serve_runs_is_still_a_warning(tmp_path: Path) -> None:
    with serve_delivering(tmp_path) as (_, data):
        url = running_url(data)
        assert url is not None
        server = valkey.Valkey.from_url(url)
        pid = int(server.info("server")["process_id"])
        server.close()
        os.kill(pid, signal.SIGKILL)  # the server alone: serve goes on
        wait_for(
            lambda: any("subscriptions" in w for w in warnings_in(tmp_path / "serve.log")),
            timeout=30,
            what="no warning about the lost subscriptions",
        )


def test_a_second_serve_on_a_data_dir_in_use_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with logged_service(["--data-dir", str(data)], tmp_path / "first.log") as port:
        first_pid = int((data / "prompt-outbox.lock").read_text())
        r = subprocess.run(
            [BIN, "serve", "--no-auth", "--port", str(free_port()), "--data-dir", str(data)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and "Traceback" not in r.stderr
        line = r.stderr.splitlines()[-1]
        assert str(data) in line and f"(pid {first_pid})" in line and "in use" in line
        assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200  # untouched
