"""The operator commands, ``worker`` beside ``serve`` on one embedded Valkey, and ``demo``:
real processes (or click's runner in-process) against real Valkey servers."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import valkey.asyncio as valkey_async
from click.testing import CliRunner

from prompt_outbox import Outbox
from prompt_outbox.cli import main
from prompt_outbox.core.keys import session_keys
from prompt_outbox.embedded import EmbeddedValkey, free_port, running_url
from tests.agents import ScriptedAgent
from tests.support.agent import SECRET, Agent
from tests.support.serve import BIN, service, wait_healthy
from tests.support.tunables import FAST

WS, SES = "acme", "chat-1"


def cli(*args: str, url: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, [*args, "--valkey-url", url], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


async def _seed(url: str) -> tuple[str, str]:
    """One error entry and one pending entry; returns their IDs."""
    client = valkey_async.Valkey.from_url(url)
    await client.flushall()
    outbox = Outbox(client, FAST)
    failed = await outbox.accept(WS, SES, "u", "c1", "this one fails")
    waiting = await outbox.accept(WS, SES, "u", "c2", "this one waits")
    agent = ScriptedAgent([RuntimeError("refused")] * FAST.max_attempts)
    while (await outbox.list(WS, SES))[0].status.value != "error":
        await outbox.deliver_once(WS, SES, agent)
        await asyncio.sleep(FAST.max_backoff)
    await client.aclose()
    return failed.id, waiting.id


def test_list_retry_dismiss_park_unpark_stats_cleanup(valkey_server: EmbeddedValkey) -> None:
    url = valkey_server.url
    failed, waiting = asyncio.run(_seed(url))
    code, out, _ = cli("list", WS, SES, url=url)
    assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "STATUS", "TRIES"]
    assert [line.split()[:2] for line in out.splitlines()[2:]] == [
        [failed, "error"],
        [waiting, "pending"],
    ]
    code, out, _ = cli("list", WS, SES, "--json", url=url)
    assert [e["id"] for e in json.loads(out)["entries"]] == [failed, waiting]

    assert cli("retry", WS, SES, waiting, url=url)[:3:2] == (1, "not found\n")  # not an error
    assert cli("retry", WS, SES, failed, url=url)[:2] == (0, "updated\n")
    assert cli("park", WS, "--reason", "agent upgrade", url=url)[:2] == (0, "parked 2\n")
    code, out, _ = cli("stats", "--json", url=url)
    assert code == 0 and json.loads(out)["workspaces"] == {WS: {"parked": 2}}
    code, out, _ = cli("stats", url=url)
    assert "PARKED" in out and out.splitlines()[-1].split()[0] == "(total)"
    assert cli("unpark", WS, url=url)[:2] == (0, "unparked 2\n")
    assert cli("dismiss", WS, SES, failed, url=url)[:2] == (0, "removed\n")
    assert cli("dismiss", WS, SES, failed, url=url)[0] == 1
    code, out, _ = cli("cleanup", WS, "--yes", url=url)
    assert code == 0 and out.startswith("deleted ")
    assert cli("list", WS, SES, url=url)[1] == "(empty)\n"


def test_busy_is_its_own_exit_code_and_bad_ids_are_usage_errors(
    valkey_server: EmbeddedValkey,
) -> None:
    url = valkey_server.url
    failed, _ = asyncio.run(_seed(url))

    async def hold_lock() -> None:
        client = valkey_async.Valkey.from_url(url)
        await client.set(session_keys(WS, SES).lock, "someone-else:0", px=30_000)
        await client.aclose()

    asyncio.run(hold_lock())
    code, _, err = cli("retry", WS, SES, failed, url=url)
    assert (code, err) == (3, "busy\n")
    code, _, err = cli("list", WS, "bad:session", url=url)
    assert code == 2 and "session ID" in err


def test_worker_joins_the_embedded_valkey_that_serve_runs(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}/v1/workspaces/{WS}/sessions/{SES}/prompts"
    with service(["--no-auth", "--port", str(port), "--data-dir", str(data)]):
        wait_healthy(port)  # serve has no deliverer: prompts wait
        assert running_url(data) is not None
        ids = [
            httpx.post(url, json={"clientMessageID": f"m{i}", "text": f"p{i}"}).json()["id"]
            for i in range(3)
        ]
        # The admin commands attach to the same server rather than fight for the data dir.
        listed = subprocess.run(
            [BIN, "list", WS, SES, "--json", "--data-dir", str(data)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert [e["id"] for e in json.loads(listed.stdout)["entries"]] == ids
        with Agent() as agent:
            worker = subprocess.Popen(
                [BIN, "worker", "--data-dir", str(data), "--webhook-url", agent.url],
                env={**os.environ, "PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()},
                stderr=subprocess.DEVNULL,
            )
            try:
                deadline = time.monotonic() + 30
                while agent.ids() != ids:
                    assert time.monotonic() < deadline, f"delivered {agent.ids()} of {ids}"
                    time.sleep(0.05)
                worker.send_signal(signal.SIGTERM)
                assert worker.wait(timeout=30) == 0
            finally:
                if worker.poll() is None:
                    worker.kill()
        assert httpx.get(url).json() == {"entries": []}
    assert running_url(data) is None


def test_an_admin_command_with_nothing_running_starts_and_stops_its_own(tmp_path: Path) -> None:
    r = subprocess.run(
        [BIN, "list", WS, SES, "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (r.returncode, r.stdout) == (0, "(empty)\n")
    with EmbeddedValkey(tmp_path):  # it released the data dir
        pass


def test_a_worker_needs_a_deliverer(tmp_path: Path) -> None:
    r = subprocess.run(
        [BIN, "worker", "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "deliverer" in r.stderr


def test_demo_loses_nothing(tmp_path: Path) -> None:
    r = subprocess.run(
        [BIN, "demo", "--prompts", "40", "--sessions", "4", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    cells = [re.split(r"\s{2,}", line.strip()) for line in r.stdout.splitlines()]
    rows = {c[0]: c[1] for c in cells if len(c) == 2}
    assert rows["accepted"] == "40" and rows["delivered"] == "40"
    assert rows["lost"] == "0" and rows["run twice by the agent"] == "0"
    assert int(rows["faults injected by the agent"]) > 0


def test_deliverer_options_are_checked(tmp_path: Path) -> None:
    bad_map = tmp_path / "targets.json"
    bad_map.write_text('{"no-slash": {"url": "http://127.0.0.1:1"}}')
    not_json = tmp_path / "not-json.json"
    not_json.write_bytes(b"{\xff")
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000)  # past Python's recursion limit
    cases = [
        (
            ["--webhook-url", "http://127.0.0.1:1/h", "--opencode-url", "http://127.0.0.1:2"],
            "one deliverer",
        ),
        (["--webhook-url", "http://127.0.0.1:1/h"], "signing secret"),
        (["--opencode-targets", str(bad_map)], "bad entry"),
        (["--opencode-targets", str(not_json)], f"{not_json}: not JSON"),
        (["--opencode-targets", str(nested)], f"{nested}: not JSON"),
        (["--opencode-url", "http://127.0.0.1:2", "--opencode-connections", "0"], "x>=1"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "PROMPT_OUTBOX_WEBHOOK_SECRET"}
    for args, message in cases:
        r = subprocess.run(
            [BIN, "worker", "--data-dir", str(tmp_path), *args],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)


def test_an_opencode_mapping_that_lets_workspaces_meet_is_refused_unless_allowed(
    tmp_path: Path,
) -> None:
    """``--opencode-url`` without ``{workspace}`` (the old default, which sent acme/ses_x and
    acme2/ses_x to one opencode session) and a targets file giving two workspaces one
    target are refused at start, in one line saying how to fix it; the flag, or its
    variable, allows it (one tenant): the worker then goes on to Valkey (unreachable here)."""
    shared = tmp_path / "targets.json"
    target = {"url": "http://127.0.0.1:2", "session": "ses_x"}
    shared.write_text(json.dumps({"acme/s1": target, "acme2/s1": target}))
    unreachable = ["worker", "--valkey-url", "valkey://127.0.0.1:1"]
    allow = {"PROMPT_OUTBOX_OPENCODE_ALLOW_SHARED_SESSIONS": "1"}
    for args, env, code, message in [
        (["--opencode-url", "http://127.0.0.1:2"], {}, 2, "put {workspace} in the URL"),
        (["--opencode-targets", str(shared)], {}, 2, "acme/s1 and acme2/s1 both name"),
        (["--opencode-url", "http://127.0.0.1:2/{workspace}"], {}, 1, "Valkey unusable"),
        (
            ["--opencode-url", "http://127.0.0.1:2", "--opencode-allow-shared-sessions"],
            {},
            1,
            "Valkey unusable",
        ),
        (["--opencode-targets", str(shared)], allow, 1, "Valkey unusable"),
    ]:
        r = subprocess.run(
            [BIN, *unreachable, *args], capture_output=True, text=True, timeout=60,
            env={**os.environ, **env},
        )  # fmt: skip
        assert r.returncode == code and message in r.stderr, (args, r.stderr)
        if code == 2:
            assert "--opencode-allow-shared-sessions" in r.stderr
