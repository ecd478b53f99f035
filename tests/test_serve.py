"""`prompt-outbox serve` as a real process: accept, SIGKILL the whole service, start it again on
the same data dir, and every accepted prompt is still there and gets delivered."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from pathlib import Path

import httpx

from prompt_outbox.embedded import EmbeddedValkey, free_port
from tests.cluster import LocalCluster
from tests.support.agent import SECRET, Agent
from tests.support.serve import BIN, post_five, service, wait_delivered_in_order, wait_healthy


def test_sigkill_the_service_and_restart_loses_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    base = ["--no-auth", "--port", str(port), "--data-dir", str(data)]
    url = f"http://127.0.0.1:{port}/v1/workspaces/acme/sessions/chat-1/prompts"
    with service(base) as proc:  # no deliverer: accepted prompts wait in the outbox
        wait_healthy(port)
        ids = post_five(url)
        os.killpg(proc.pid, signal.SIGKILL)  # the whole service, Valkey included
        proc.wait()
    with Agent() as agent:
        args = [*base, "--webhook-url", agent.url, "--webhook-verify-url", agent.verify_url]
        with service(args, {"PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()}) as proc:
            wait_healthy(port)
            wait_delivered_in_order(agent, ids)
            assert httpx.get(url).json() == {"entries": []}
            # An open event stream (a phone listening) must not hold the shutdown up.
            with httpx.stream("GET", url.removesuffix("/prompts") + "/events") as events:
                assert next(events.iter_lines()).startswith("retry:")
                proc.send_signal(signal.SIGTERM)  # graceful: joins workers, stops Valkey
                assert proc.wait(timeout=30) == 0
    with EmbeddedValkey(data):  # the data dir was released
        pass


def test_no_auth_is_refused_off_loopback(tmp_path: Path) -> None:
    r = subprocess.run(
        [BIN, "serve", "--no-auth", "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 2 and "loopback" in r.stderr


def test_tokens_are_required_unless_auth_is_disabled(tmp_path: Path) -> None:
    r = subprocess.run(
        [BIN, "serve", "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2 and "--tokens" in r.stderr


def test_serve_and_a_worker_on_a_cluster_url_deliver_in_order(
    valkey_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Every command takes a cluster URL: serve (API only) accepts into a 3-master cluster, a
    separate worker process delivers, and the operator CLI reads the same cluster."""
    port = free_port()
    cluster = ["--valkey-url", valkey_cluster.url]
    ws = f"acme-{secrets.token_hex(4)}"  # the cluster is shared: other tests' entries stay
    url = f"http://127.0.0.1:{port}/v1/workspaces/{ws}/sessions/chat-1/prompts"
    with Agent() as agent, service([*cluster, "--no-auth", "--port", str(port)]):
        wait_healthy(port)
        ids = post_five(url)
        stats = subprocess.run(
            [BIN, "stats", "--json", *cluster], capture_output=True, text=True, timeout=30
        )
        assert json.loads(stats.stdout)["workspaces"][ws] == {"pending": 5}, stats.stderr
        worker = subprocess.Popen(
            [BIN, "worker", *cluster, "--webhook-url", agent.url],
            env={**os.environ, "PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()},
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_delivered_in_order(agent, ids)
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=30) == 0
