"""HTTP accept: ``prompt-outbox serve`` against a bare FastAPI route doing one RPUSH.

    .venv/bin/python -m bench.http [--seconds 5] [--connections 32] [--repeat 3]
                                   [--stacks h11,httptools] [--out FILE] [--results FILE]

One embedded Valkey (``appendfsync always``) on 127.0.0.1, and for each server stack, one
after the other on that Valkey:

- the baseline: a FastAPI app (one process) whose one POST route reads the body and RPUSHes
  it (valkey-py asyncio), answering 202 as ours does;
- ours: the real ``prompt-outbox serve`` (a subprocess, auth on with a token file, no
  deliverer) at its accept route, default accept level (``fsync``: a WAITAOF rides each
  accept; on ``appendfsync always`` it returns at once).

The load is autocannon (``bench/load``, installed with ``npm ci`` on the first run): POSTs
from ``--connections`` connections for ``--seconds`` after a 1 s warm-up, each with a
clientMessageID of its own and a new session every 10 requests, the same bodies for both.
Each run reports accepts/s, p50 / p99, and the CPU time the server process and Valkey spent
per accept; every 2xx is checked against what was stored (the baseline's list, ours'
``prompt_outbox_accepted_total``). Rounds repeat ``--repeat`` times, baseline and ours
alternating, and each stack's round with the median ratio is kept. The figure that matters
is the ratio ours / baseline on the same stack, in the same run (these machines are shared
and noisy: never read the absolutes). For the stack ``serve`` runs by default it also measures ours
with the access log on (written to a file, as a service's stdout usually is).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import uvloop
import valkey
from devtools import npm
from fastapi import FastAPI, Request

from bench.output import publish, stop_group, verdict
from prompt_outbox import Outbox, Tunables
from prompt_outbox.embedded import EmbeddedValkey, free_port
from prompt_outbox.storage.connect import connect

ROOT = Path(__file__).resolve().parents[1]
LOAD = ROOT / "bench" / "load"
BIN = str(Path(sys.executable).parent / "prompt-outbox")
TARGET = "HTTP accept"
BASELINE_KEY = "bench:baseline"
BAR = 0.8  # ours / baseline: the HTTP accept target
WORKSPACE = "bench"
TOKEN = "bench-token"
PER_SESSION = 10  # a session holds at most 25 entries (the cap) and nothing delivers here
WARMUP_S = 1.0
ACCESS_LOG = "ours, access log on"
# A phone's prompt: a few sentences and a model selector, as the opencode deliverer gets them.
TEXT = (
    "Please look at the failing test in tests/test_api.py, find why the duplicate answer "
    "comes back as 202 instead of 200, and fix it without changing the public API."
)
MODEL = {"providerID": "anthropic", "modelID": "claude-sonnet-4"}


@dataclass(frozen=True)
class Stack:
    """How one server process is run: uvicorn's HTTP parser and the event loop."""

    key: str  # for --stacks
    name: str
    loop: str  # asyncio | uvloop
    http: str  # h11 | httptools

    def serve_args(self) -> list[str]:
        return ["--loop", self.loop, "--http", self.http]


STACKS = (
    Stack("h11", "uvicorn, h11, asyncio loop", "asyncio", "h11"),
    Stack("httptools", "uvicorn, httptools, uvloop", "uvloop", "httptools"),
)
DEFAULT = STACKS[-1]  # what ``serve`` runs with no flags (--loop auto --http auto)


# node / npm are missing or autocannon would not install (the message says why).
LoadUnavailable = npm.NpmUnavailable


# -- the load generator --------------------------------------------------------------------


def ensure_load() -> Path:
    """The node binary, with autocannon installed from the committed lock (``npm ci``, once
    per lock: devtools/npm.py). Raises LoadUnavailable when node or npm is absent or the
    install fails."""
    return npm.ensure_installed(LOAD)


@dataclass(frozen=True)
class Load:
    """One autocannon run: what came back, and how fast."""

    seconds: float
    ok: int
    non2xx: int
    errors: int
    timeouts: int
    codes: dict[str, int]
    p50: float  # ms
    p99: float  # ms

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


def load(node: Path, port: int, seconds: float, connections: int, tag: str) -> Load:
    """POST accepts at ``port`` for ``seconds``; clientMessageIDs are ``<tag>-<n>``."""
    config = {
        "url": f"http://127.0.0.1:{port}",
        "connections": connections,
        "seconds": seconds,
        "workspace": WORKSPACE,
        "perSession": PER_SESSION,
        "tag": tag,
        "text": TEXT,
        "model": MODEL,
        "headers": {"content-type": "application/json", "authorization": f"Bearer {TOKEN}"},
    }
    done = subprocess.run(
        [str(node), str(LOAD / "run.js"), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"autocannon failed: {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return Load(
        seconds=float(out["seconds"]),
        ok=int(out["ok"]),
        non2xx=int(out["non2xx"]),
        errors=int(out["errors"]),
        timeouts=int(out["timeouts"]),
        codes={str(k): int(v) for k, v in out["codes"].items()},
        p50=float(out["p50"]),
        p99=float(out["p99"]),
    )


# -- the servers ---------------------------------------------------------------------------


def baseline_app(url: str) -> FastAPI:
    """The bare FastAPI app: one POST route doing one RPUSH, and a health route."""
    app = FastAPI()
    client = connect(url)

    @app.post("/v1/workspaces/{ws}/sessions/{ses}/prompts", status_code=202)
    async def accept(ws: str, ses: str, request: Request) -> dict[str, str]:
        await client.rpush(BASELINE_KEY, await request.body())
        return {"id": "0", "status": "pending"}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _serve_baseline(port: int, url: str, stack: str) -> None:
    """The baseline server's process (``--serve-baseline``)."""
    import uvicorn

    chosen = next(s for s in STACKS if s.key == stack)
    uvicorn.run(
        baseline_app(url),
        host="127.0.0.1",
        port=port,
        loop=chosen.loop,
        http=chosen.http,
        access_log=False,
        log_level="warning",
    )


@contextlib.contextmanager
def running(args: list[str], port: int, ready: str, log: Path) -> Iterator[int]:
    """A server process for the block (its pid), once ``ready`` answers 200; SIGTERM after."""
    with log.open("ab") as sink:
        proc = subprocess.Popen(args, stdout=sink, stderr=sink, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"{args[:3]} exited: see {log}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"{args[:3]} did not answer {ready}"
            time.sleep(0.05)
        yield proc.pid
    finally:
        stop_group(proc, 15)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def valkey_cpu(client: valkey.Valkey) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def fresh(client: valkey.Valkey) -> None:
    """Empty the server and rewrite its AOF, so that each run starts from the same state and
    no automatic rewrite falls inside a run."""
    client.flushall()
    client.bgrewriteaof()
    deadline = time.monotonic() + 60
    while True:
        info = client.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return
        assert time.monotonic() < deadline, "the AOF rewrite did not finish"
        time.sleep(0.05)


# -- one run, and the report ---------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One server under load: the load's figures and the CPU spent per accept."""

    load: Load
    server_cpu_us: float  # the server process's CPU per accept
    valkey_cpu_us: float
    answered: int  # 2xx answers, the warm-up's included
    stored: int  # accepts the server says it stored (the same count, or something is wrong)


@dataclass
class Report:
    seconds: float
    connections: int
    repeat: int
    warmup: float
    runs: dict[tuple[str, str], Run] = field(default_factory=dict)  # (stack, side) -> run
    encode_us: dict[str, float] = field(default_factory=dict)
    in_process_us: dict[str, float] = field(default_factory=dict)  # IN_PROCESS -> CPU per call
    rounds: dict[str, list[dict[str, Run]]] = field(default_factory=dict)  # stack -> side -> run
    log_line_us: float = 0.0  # one access-log line, in process

    def ratio(self, stack: Stack) -> float:
        base = self.runs[(stack.name, "baseline")].load.rate
        return self.runs[(stack.name, "ours")].load.rate / base if base else 0.0

    def access_log_cost(self) -> tuple[float, float] | None:
        """(throughput lost, server CPU per accept added) with the access log on, as
        fractions, the median over the rounds (each against ours in the same round); None if
        the access-log run did not happen."""
        pairs = [
            (r[ACCESS_LOG], r["ours"])
            for r in self.rounds.get(DEFAULT.name, [])
            if ACCESS_LOG in r and r["ours"].load.rate
        ]
        if not pairs:
            return None
        lost = statistics.median(1 - on.load.rate / off.load.rate for on, off in pairs)
        cpu = statistics.median(on.server_cpu_us / off.server_cpu_us - 1 for on, off in pairs)
        return lost, cpu

    def markdown(self) -> str:
        lines = [
            f"{self.connections} connections, {self.seconds:g} s a run after a {self.warmup:g} s "
            f"warm-up; of {self.repeat} rounds, the one with the median ratio. Server, Valkey "
            "(appendfsync always) and autocannon on one machine, 127.0.0.1. CPU: per accept, "
            "the server process's and Valkey's. Ours: `prompt-outbox serve`, auth on, accept "
            "level fsync (WAITAOF).",
            "",
            "| stack | server | accepts/s | p50 | p99 | server CPU | Valkey CPU | refused "
            "| ours / baseline |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for (stack, side), run in self.runs.items():
            found = next((s for s in STACKS if s.name == stack), None)
            ratio = f"**{self.ratio(found):.2f}x**" if side == "ours" and found else ""
            load = run.load
            lines.append(
                f"| {stack} | {side} | {load.rate:,.0f} | {load.p50:.0f} ms | {load.p99:.0f} ms "
                f"| {run.server_cpu_us:.0f} us | {run.valkey_cpu_us:.0f} us "
                f"| {load.non2xx + load.errors + load.timeouts} | {ratio} |"
            )
        cost = self.access_log_cost()
        if cost is not None:
            lines += [
                "",
                f"Access log on ({DEFAULT.name}): {cost[0]:.0%} of accepts/s lost, "
                f"{cost[1]:+.0%} server CPU per accept.",
            ]
        if len(self.in_process_us) == len(IN_PROCESS) and all(
            (DEFAULT.name, side) in self.runs for side in ("baseline", "ours")
        ):
            rpush, accept = (self.in_process_us[name] for name in IN_PROCESS)
            base = self.runs[(DEFAULT.name, "baseline")].server_cpu_us
            ours = self.runs[(DEFAULT.name, "ours")].server_cpu_us
            lines += [
                "",
                f"Without HTTP ({self.connections} tasks in one uvloop process): RPUSH "
                f"{rpush:.0f} us CPU a call, Outbox.accept {accept:.0f} us. So on "
                f"{DEFAULT.name} the HTTP layer takes {base - rpush:.0f} us of the baseline's "
                f"{base:.0f} us, and {ours - accept:.0f} us of ours' {ours:.0f} us.",
            ]
        if self.log_line_us:
            ours = self.runs.get((DEFAULT.name, "ours"))
            share = f" ({self.log_line_us / ours.server_cpu_us:.0%} of ours' CPU per accept)"
            lines += [
                "",
                f"One access-log line, uvicorn's formatter into a file, in process: "
                f"{self.log_line_us:.0f} us CPU" + (share if ours else "") + ".",
            ]
        if self.encode_us:
            each = ", ".join(f"{name} {us:.1f} us" for name, us in self.encode_us.items())
            lines += ["", f"Encoding the accept's answer, per call: {each}."]
        return "\n".join(lines) + "\n"


def stored(side: str, port: int, client: valkey.Valkey) -> int:
    """How many accepts the server stored: the baseline's list length, or ours' counter."""
    if side == "baseline":
        return int(client.llen(BASELINE_KEY))
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("prompt_outbox_accepted_total "))
    return int(float(line.split()[1]))


def measure(
    node: Path,
    side: str,
    pid: int,
    port: int,
    client: valkey.Valkey,
    seconds: float,
    connections: int,
    warmup: float = WARMUP_S,
) -> Run:
    tag = f"t{time.monotonic_ns()}"
    warm = load(node, port, warmup, connections, tag + "w")
    cpu, vcpu = cpu_seconds(pid), valkey_cpu(client)
    measured = load(node, port, seconds, connections, tag)
    server_cpu, valkey_used = cpu_seconds(pid) - cpu, valkey_cpu(client) - vcpu
    n = max(measured.ok, 1)
    return Run(
        measured,
        server_cpu / n * 1e6,
        valkey_used / n * 1e6,
        answered=warm.ok + measured.ok,
        stored=stored(side, port, client),
    )


def _sides(stack: Stack, access_log: bool) -> list[str]:
    sides = ["baseline", "ours"]
    if access_log and stack == DEFAULT:
        sides.append(ACCESS_LOG)
    return sides


def run(
    seconds: float = 5.0,
    connections: int = 32,
    stacks: tuple[Stack, ...] = STACKS,
    *,
    repeat: int = 3,
    access_log: bool = True,
    warmup: float = WARMUP_S,
) -> Report:
    node = ensure_load()
    report = Report(seconds, connections, repeat, warmup)
    every: dict[tuple[str, str], list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp, EmbeddedValkey(tmp) as server:
        tokens = Path(tmp, "tokens.json")
        tokens.write_text(
            json.dumps({"tokens": [{"token": TOKEN, "user": "bench", "workspaces": [WORKSPACE]}]})
        )
        log = Path(tmp, "servers.log")  # stdout and stderr: the access log lands here
        client = valkey.Valkey.from_url(server.url)

        def command(stack: Stack, side: str, port: int) -> tuple[list[str], str]:
            if side == "baseline":
                me = [sys.executable, "-m", "bench.http", "--serve-baseline"]
                return [*me, str(port), server.url, stack.key], "/healthz"
            common = ["--valkey-url", server.url, "--tokens", str(tokens), "--port", str(port)]
            # One token sends the whole load: a rate it never reaches keeps the limiter's cost
            # in the figure without its 429s.
            common += ["--accept-rate", "1e9"]
            # Nothing delivers here: a run fills the one workspace past its quota on purpose.
            common += ["--tunables", json.dumps({"workspace_cap": 10**9})]
            extra = ["--access-log"] if side == ACCESS_LOG else []
            return [BIN, "serve", *common, *stack.serve_args(), *extra], "/readyz"

        for _ in range(repeat):  # rounds: each stack's baseline and ours side by side in time
            for stack in stacks:
                for side in _sides(stack, access_log):
                    port = free_port()
                    args, ready = command(stack, side, port)
                    fresh(client)
                    with running(args, port, ready, log) as pid:
                        done = measure(node, side, pid, port, client, seconds, connections, warmup)
                    every.setdefault((stack.name, side), []).append(done)
                    print(
                        f"{stack.name:28} {side:20} {done.load.rate:8,.0f}/s "
                        f"p50 {done.load.p50:.0f} ms p99 {done.load.p99:.0f} ms "
                        f"cpu {done.server_cpu_us:.0f} us, Valkey {done.valkey_cpu_us:.0f} us "
                        f"{done.load.codes}",
                        flush=True,
                    )
        for name in IN_PROCESS:
            fresh(client)
            report.in_process_us[name] = in_process_cpu(name, server.url, seconds, connections)
        client.close()
    for stack in stacks:
        # Keep each stack's round with the median ratio, all its runs side by side: medians
        # taken per side apart could pair a lucky baseline with an unlucky ours.
        rounds = [
            {side: every[(stack.name, side)][i] for side in _sides(stack, access_log)}
            for i in range(repeat)
        ]
        rounds.sort(key=lambda r: r["ours"].load.rate / max(r["baseline"].load.rate, 1e-9))
        for side, done in rounds[(repeat - 1) // 2].items():
            report.runs[(stack.name, side)] = done
        report.rounds[stack.name] = rounds
    report.encode_us = encode_cost()
    report.log_line_us = access_log_line()
    return report


IN_PROCESS = ("RPUSH", "Outbox.accept")


def in_process_cpu(name: str, url: str, seconds: float, tasks: int) -> float:
    """CPU per call (us) of the baseline's RPUSH or of our accept (serve's defaults), from
    ``tasks`` tasks of one uvloop process, without HTTP: what each server spends beside its
    HTTP layer."""

    async def calls() -> float:
        client = connect(url, socket_timeout=30)
        outbox = Outbox(client, Tunables(workspace_cap=10**9))
        await outbox.check_durability()
        done = 0
        deadline = time.monotonic() + seconds

        async def one(task: int) -> None:
            nonlocal done
            n = task
            while time.monotonic() < deadline:
                if name == "RPUSH":
                    await client.rpush(BASELINE_KEY, TEXT)
                else:
                    await outbox.accept(WORKSPACE, f"s{n // PER_SESSION}", "bench", f"m{n}", TEXT)
                done += 1
                n += tasks

        started = time.process_time()
        await asyncio.gather(*(one(t) for t in range(tasks)))
        used = time.process_time() - started
        await outbox.aclose()
        await client.aclose()
        return used / max(done, 1) * 1e6

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(calls())


def access_log_line() -> float:
    """CPU (us) of one access-log line as uvicorn writes it (its formatter, a stream handler)
    into a file: the cost the access log adds to each request, without the HTTP runs' noise."""
    from uvicorn.logging import AccessFormatter

    logger = logging.getLogger("bench.http.access")
    logger.propagate = False
    with tempfile.TemporaryFile("w") as sink:
        handler = logging.StreamHandler(sink)
        fmt = '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'
        handler.setFormatter(AccessFormatter(fmt, use_colors=False))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        path = f"/v1/workspaces/{WORKSPACE}/sessions/s1/prompts"
        args = ("127.0.0.1:50000", "POST", path, "1.1", 202)
        started = time.process_time()
        for _ in range(20_000):
            logger.info('%s - "%s %s HTTP/%s" %d', *args)
        used = time.process_time() - started
        logger.removeHandler(handler)
    return used / 20_000 * 1e6


def encode_cost() -> dict[str, float]:
    """What encoding the accept's answer costs, per call (us): what orjson could save."""
    answer = {"id": "01a2411bbc5cd7ee000444b584d5", "status": "pending", "duplicate": False}
    costs = {"json.dumps": min(timeit.repeat(lambda: json.dumps(answer), number=20_000, repeat=3))}
    try:
        import orjson
    except ImportError:  # not a dependency: the figure is only shown where it is installed
        pass
    else:
        calls = timeit.repeat(lambda: orjson.dumps(answer), number=20_000, repeat=3)
        costs["orjson.dumps"] = min(calls)
    return {name: total / 20_000 * 1e6 for name, total in costs.items()}


def give_verdict(report: Report, results: Path | None) -> None:
    base = report.runs[(DEFAULT.name, "baseline")].load
    ours = report.runs[(DEFAULT.name, "ours")].load
    ratio = report.ratio(DEFAULT)
    note = f"{DEFAULT.name}; accept level fsync (WAITAOF) against a plain RPUSH"
    if report.log_line_us:
        note += f"; an access-log line costs {report.log_line_us:.0f} us of CPU (off by default)"
    verdict(
        results,
        target=TARGET,
        bar=f">= {BAR}x bare FastAPI+RPUSH",
        ours=f"{ours.rate:,.0f} accepts/s ({ratio:.2f}x)",
        peers=f"bare FastAPI+RPUSH {base.rate:,.0f}/s",
        met=ratio >= BAR,
        note=note,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the median ratio's is kept")
    parser.add_argument("--stacks", help="comma-separated stack keys (default: all)")
    parser.add_argument("--out", type=Path, help="append the table here (markdown)")
    parser.add_argument("--results", type=Path, help="append the verdict here (JSON lines)")
    parser.add_argument("--serve-baseline", nargs=3, metavar=("PORT", "URL", "STACK"))
    args = parser.parse_args()
    if args.serve_baseline:
        port, url, stack = args.serve_baseline
        _serve_baseline(int(port), url, stack)
        return
    stacks = STACKS
    if args.stacks:
        names = args.stacks.split(",")
        stacks = tuple(s for s in STACKS if s.key in names)
    started = time.monotonic()
    report = run(args.seconds, args.connections, stacks, repeat=args.repeat)
    publish(report.markdown(), args.out)
    if DEFAULT in stacks:
        give_verdict(report, args.results)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
