"""The README's examples are examples/quickstart.py and examples/quickstart.sh; both run
as written."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from prompt_outbox.embedded import free_port
from tests.support.processes import gone
from tests.support.tools import tool

ROOT = Path(__file__).resolve().parent.parent


def test_readme_example_is_the_quickstart_file() -> None:
    readme = (ROOT / "README.md").read_text()
    [block] = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert block == (ROOT / "examples" / "quickstart.py").read_text()


def test_quickstart_runs_and_delivers_durably(tmp_path: Path) -> None:
    """The library example accepts and delivers on the embedded Valkey; a second run on the
    same data dir sends nothing: had the dedupe marker been lost, msg-1 would be accepted and
    delivered again; had the delivery not been recorded, the entry would be sent again."""
    script = ROOT / "examples" / "quickstart.py"
    first = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout == "agent acme/chat-1 got: 'Hello, agent!'\n"
    second = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout == ""  # nothing delivered twice


def _block(lang: str, first_line: str) -> str:
    """The README's fenced ``lang`` block that begins with ``first_line``."""
    readme = (ROOT / "README.md").read_text()
    [block] = [
        b
        for b in re.findall(rf"```{lang}\n(.*?)```", readme, flags=re.S)
        if b.startswith(first_line)
    ]
    return block


def test_the_stand_in_agent_without_its_secret_says_what_to_set() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROMPT_OUTBOX_WEBHOOK_SECRET"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "webhook_agent.py"), "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("set PROMPT_OUTBOX_WEBHOOK_SECRET")


def test_the_stand_in_agent_on_a_busy_port_says_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "webhook_agent.py"), str(port)],
            env={**os.environ, "PROMPT_OUTBOX_WEBHOOK_SECRET": "s"},
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


def test_readme_service_quickstart_is_the_shell_file() -> None:
    script = (ROOT / "examples" / "quickstart.sh").read_text()
    assert _block("sh", "# A token file") == script


def test_service_quickstart_runs_accepts_delivers_and_streams(tmp_path: Path) -> None:
    """examples/quickstart.sh as a newcomer runs it (on free ports instead of 8080 and 9000):
    the token file is read, the stand-in agent gets the prompt, the accept answers 202, the
    event stream opens with the queue, and the queue page is served where the README says."""
    tool("curl")  # the quickstart's client
    api, agent = free_port(), free_port()
    script = (ROOT / "examples" / "quickstart.sh").read_text()
    assert script.count("8080") == 4 and script.count("9000") == 2
    script = script.replace("8080", str(api)).replace("9000", str(agent))
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "webhook_agent.py", tmp_path / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = tmp_path / "out.txt"
    with log.open("w") as sink:  # a file: the agent and serve, left running, keep it open
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the agent and serve (with its Valkey) in one group to stop
        )
    try:
        proc.wait(timeout=90)
        out = log.read_text()
        assert '"status":"pending"' in out.replace(" ", "")  # the accept's 202
        assert "agent acme/chat-1 got: 'Hello, agent!'" in out  # delivered, signature checked
        assert "event: queue.reset" in out  # curl -N: the stream opens with the queue
        assert "event: queue.update" in out  # ...and shows it change, as the README says
        page = httpx.get(f"http://127.0.0.1:{api}/", follow_redirects=True, timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        # The README names the page at the port the quickstart serves on.
        assert "http://127.0.0.1:8080/" in (ROOT / "README.md").read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        if not gone(proc.pid, group=True):  # no agent outlives the test
            os.killpg(proc.pid, signal.SIGKILL)
