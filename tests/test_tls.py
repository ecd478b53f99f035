"""TLS and ACL users for an external server, against Debian's redis-server 7.0 with TLS on
loopback (the bundled valkey-server has no TLS): a CA and a server certificate made here with
openssl, the default user off and an ACL user with a password. serve and a worker accept and
deliver over ``valkeys://app:...@`` with ``--valkey-ca-file``; a wrong CA and a wrong password are
each one clear line. Redis 7.0 has no WAITAOF: the default durability steps down to ``none`` and
says so, a chosen ``fsync`` refuses to start."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import valkey

from prompt_outbox.embedded import free_port
from prompt_outbox.storage.connect import TLSFiles, connect
from prompt_outbox.storage.durability import durability_problems
from tests.support.agent import Agent
from tests.support.failover import process
from tests.support.serve import BIN, post_five, wait_delivered_in_order, wait_healthy
from tests.support.tools import tool  # skipped without it here, a failure on CI
from tests.support.waiting import eventually

PASSWORD = "s3cret-app"
# The least the outbox needs (docs/deploy.md, "TLS and ACL users"): its own keys and channels,
# no dangerous command but the two reads its durability check makes.
ACL = ["~outbox*", "&outbox*", "+@all", "-@dangerous", "+info", "+config|get"]
# The user a replica syncs as (the outbox's own may not).
REPLICATOR = ["--user", "replicator", "on", ">s3cret-repl", "+psync", "+replconf", "+ping"]


def openssl(*args: str) -> None:
    subprocess.run([tool("openssl"), *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    crt, key = folder / f"{name}.crt", folder / f"{name}.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN={name}", "-keyout", str(key), "-out", str(crt))  # fmt: skip
    return crt, key


@dataclass
class TLSServer:
    port: int
    ca: Path
    wrong_ca: Path
    folder: Path  # its certificate (server.crt, server.key), its log

    def url(self, password: str = PASSWORD) -> str:
        return f"valkeys://app:{password}@127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    server = tool("redis-server")
    folder = tmp_path_factory.mktemp("tls")
    ca, ca_key = make_ca(folder, "ca")
    wrong_ca, _ = make_ca(folder, "other-ca")
    crt, key, csr = folder / "server.crt", folder / "server.key", folder / "server.csr"
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", str(key), "-out", str(csr))  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "2", "-extfile", str(folder / "san.ext"),
            "-out", str(crt))  # fmt: skip
    port = free_port()
    args = [server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(crt), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
            "--dir", str(folder), "--save", "", "--appendonly", "yes",
            "--appendfsync", "always", "--maxmemory-policy", "noeviction",
            "--user", "default", "off",
            "--user", "app", "on", f">{PASSWORD}", *ACL, *REPLICATOR]  # fmt: skip
    with (folder / "redis.log").open("ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        node = valkey.Valkey(
            host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca),
            username="app", password=PASSWORD, socket_timeout=5,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                node.ping()
                break
            except (valkey.ValkeyError, OSError):
                assert proc.poll() is None, (folder / "redis.log").read_text()
                assert time.monotonic() < deadline, "redis-server with TLS did not answer"
                time.sleep(0.05)
        node.close()
        yield TLSServer(port, ca, wrong_ca, folder)
    finally:
        proc.kill()
        proc.wait()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60)


def one_clear_line(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    assert len(errors) == 1, done.stderr
    for word in words:
        assert word in errors[0], done.stderr
    assert PASSWORD not in done.stderr and "wrong" not in done.stderr.replace("wrong-", "")
    return errors[0]


def test_serve_and_a_worker_deliver_over_tls_as_an_acl_user(
    tls_server: TLSServer, tmp_path: Path
) -> None:
    port = free_port()
    valkey_args = ["--valkey-url", tls_server.url(), "--valkey-ca-file", str(tls_server.ca)]
    url = f"http://127.0.0.1:{port}/v1/workspaces/acme/sessions/tls-1/prompts"
    with Agent() as agent:
        serve = ["serve", *valkey_args, "--no-auth", "--port", str(port)]
        with process(serve, tmp_path / "serve.log"):
            wait_healthy(port)
            ids = post_five(url)
            with process(
                ["worker", *valkey_args, "--webhook-url", agent.url], tmp_path / "worker.log"
            ):
                wait_delivered_in_order(agent, ids)
    log = (tmp_path / "serve.log").read_text()
    # Redis 7.0 has no WAITAOF: the default (fsync) steps down to none, and says why.
    assert "accept_durability=none (the default, stepped down from fsync)" in log, log
    assert "no WAITAOF" in log, log
    assert PASSWORD not in log


def test_a_chosen_durability_that_needs_waitaof_refuses_to_start(tls_server: TLSServer) -> None:
    done = run(
        "serve", "--valkey-url", tls_server.url(), "--valkey-ca-file", str(tls_server.ca),
        "--accept-durability", "fsync", "--no-auth", "--port", str(free_port()),
    )  # fmt: skip
    one_clear_line(done, "accept_durability 'fsync' cannot be honoured", "no WAITAOF")


def test_a_wrong_ca_is_one_clear_line(tls_server: TLSServer) -> None:
    done = run(
        "stats", "--valkey-url", tls_server.url(), "--valkey-ca-file", str(tls_server.wrong_ca)
    )
    one_clear_line(done, "certificate verify failed")


def test_a_wrong_password_is_one_clear_line(tls_server: TLSServer) -> None:
    done = run(
        "stats", "--valkey-url", tls_server.url("wrong-pw"),
        "--valkey-ca-file", str(tls_server.ca),
    )  # fmt: skip
    one_clear_line(done, "invalid username-password pair")


def test_tls_files_with_a_url_without_tls_are_refused(tls_server: TLSServer) -> None:
    done = run(
        "stats", "--valkey-url", f"valkey://127.0.0.1:{tls_server.port}",
        "--valkey-ca-file", str(tls_server.ca),
    )  # fmt: skip
    assert done.returncode == 2
    assert "the Valkey URL has no TLS" in done.stderr and "Traceback" not in done.stderr


def test_a_plain_url_to_a_tls_server_says_to_use_valkeys(tls_server: TLSServer) -> None:
    # The server resets a client that does not speak TLS: the line says what to check.
    done = run("stats", "--valkey-url", f"valkey://app:{PASSWORD}@127.0.0.1:{tls_server.port}")
    line = one_clear_line(done, "Valkey unusable")
    assert line.endswith("does the server speak TLS? (then use valkeys://)"), line


def test_a_tls_sentinel_url_finds_the_primary_over_tls(tls_server: TLSServer) -> None:
    """``valkeys+sentinel://``: TLS to the sentinel (redis-server 7.0 in sentinel mode, TLS
    only) and to the primary it names, with the CA given once; the sentinel logs in to the
    primary as the same ACL user."""
    folder, port = tls_server.folder, free_port()
    conf = folder / f"sentinel-{port}.conf"
    conf.write_text(
        f"port 0\ntls-port {port}\nbind 127.0.0.1\ndir {folder}\n"
        f"tls-cert-file {folder / 'server.crt'}\ntls-key-file {folder / 'server.key'}\n"
        f"tls-ca-cert-file {tls_server.ca}\ntls-auth-clients no\ntls-replication yes\n"
        f"sentinel monitor outbox 127.0.0.1 {tls_server.port} 1\n"
        f"sentinel auth-user outbox app\nsentinel auth-pass outbox {PASSWORD}\n"
    )
    with (folder / "sentinel.log").open("ab") as log:
        proc = subprocess.Popen(
            [tool("redis-server"), str(conf), "--sentinel"], stdout=log, stderr=log
        )
    try:
        url = f"valkeys+sentinel://app:{PASSWORD}@127.0.0.1:{port}/outbox"
        deadline = time.monotonic() + 20
        while True:
            done = run(
                "stats", "--json", "--valkey-url", url, "--valkey-ca-file", str(tls_server.ca)
            )
            if done.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # the sentinel's first look at the primary
        assert done.returncode == 0, done.stderr
        assert isinstance(json.loads(done.stdout), dict)
        # The same without the CA: the sentinel's certificate is refused, in one line.
        one_clear_line(run("stats", "--valkey-url", url), "certificate verify failed")
    finally:
        proc.kill()
        proc.wait()


def start_tls_replica(primary: TLSServer, port: int, folder: Path) -> subprocess.Popen[bytes]:
    """A replica of ``primary`` with TLS on ``port``, syncing over TLS as the replicator."""
    certs = primary.folder
    args = [tool("redis-server"), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(certs / "server.crt"),
            "--tls-key-file", str(certs / "server.key"),
            "--tls-ca-cert-file", str(primary.ca), "--tls-auth-clients", "no",
            "--tls-replication", "yes", "--replicaof", "127.0.0.1", str(primary.port),
            "--masteruser", "replicator", "--masterauth", "s3cret-repl",
            "--dir", str(folder), "--save", "", "--appendonly", "yes",
            "--appendfsync", "always", "--maxmemory-policy", "noeviction",
            "--user", "default", "off", "--user", "app", "on", f">{PASSWORD}", *ACL]  # fmt: skip
    with (folder / "replica.log").open("ab") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


async def test_the_replica_durability_check_asks_a_tls_replica_over_tls(
    tls_server: TLSServer, tmp_path: Path
) -> None:
    """At ``replica``, the start-up check asks each replica its ``appendfsync``: over TLS,
    with the client's CA, when the client speaks TLS (it asked in plain text, and a TLS
    replica made that an 'unknown' problem that --strict-durability refused)."""
    port = free_port()
    proc = start_tls_replica(tls_server, port, tmp_path)
    client = connect(tls_server.url(), TLSFiles(ca_file=str(tls_server.ca)))
    try:

        async def replica_online() -> bool:
            info = await client.info("replication")
            return any(
                isinstance(v, dict) and v.get("port") == port and v.get("state") == "online"
                for v in info.values()
            )

        await eventually(replica_online, within=20, interval=0.05)
        assert await durability_problems(client, "replica") == []
    finally:
        await client.aclose()
        proc.kill()
        proc.wait()
