"""Memory under a flood of oversized requests: ``prompt-outbox serve``
against bodies and request heads far over its limits, with and without a token.

    .venv/bin/python -m bench.flood [--requests 64] [--connections 16] [--megabytes 100]
                                    [--out FILE] [--results FILE]

One embedded Valkey and one real ``serve`` (auth on, ``--valkey-url``, so that serve's own
process is the one measured) on 127.0.0.1. After a warm-up (a few accepts and reads) its idle
RSS is read; then, one kind after the other, ``--requests`` oversized requests go out from
``--connections`` connections at once, each sending its bytes in 64 KiB writes until the
server answers or closes (or ``--megabytes`` are sent):

- a body declared by ``Content-Length`` (``--megabytes``), without a token to ``park`` and
  with one to the accept (before the body and head limits, docs/security.md's finding 2:
  100 MB to park, 401 after reading it all, RSS 64 -> 371 MB; 300 MB to the accept, 413 after
  reading it all, 679 MB);
- a chunked body of that size, the same two ways;
- one header line that never ends, and header lines that never end (on ``/healthz``, the
  finding's 100 MB header took 23 s of the event loop).

Each kind reports how the requests ended (status, or closed by the server), serve's peak RSS
during it (VmHWM, reset before each kind where the kernel lets us, and sampled besides)
against the idle RSS of the same run, as a delta and a ratio, and the worst answer time of a
``/healthz`` probed every 50 ms meanwhile against the idle probe's (the event loop, which the
delivery workers share). Read the ratios, never the absolutes: these machines are shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.http import BIN, running
from bench.output import publish, verdict
from prompt_outbox.embedded import EmbeddedValkey, free_port

TARGET = "Memory under a flood of oversized requests"
BAR = 1.5  # serve's peak RSS / its idle RSS, in the worst kind
TOKEN = "flood-token"
WORKSPACE = "acme"
ACCEPT = f"/v1/workspaces/{WORKSPACE}/sessions/flood/prompts"
PARK = f"/v1/workspaces/{WORKSPACE}/park"
PIECE = 64 * 1024
PROBE_EVERY = 0.05


@dataclass(frozen=True)
class Kind:
    """One kind of oversized request: its head, and how its endless part is written."""

    name: str
    head: bytes
    piece: bytes  # written again and again until the server answers


def _head(method: str, path: str, lines: list[str]) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *lines]).encode()


def kinds(megabytes: int) -> list[Kind]:
    size = megabytes * 1024 * 1024
    token = f"Authorization: Bearer {TOKEN}"
    json_body = "Content-Type: application/json"
    declared = [json_body, f"Content-Length: {size}"]
    chunked = [json_body, "Transfer-Encoding: chunked"]
    body, chunk = b" " * PIECE, b"%x\r\n" % PIECE + b" " * PIECE + b"\r\n"
    end = b"\r\n\r\n"
    return [
        Kind("body by Content-Length, no token", _head("POST", PARK, declared) + end, body),
        Kind(
            "body by Content-Length, token",
            _head("POST", ACCEPT, [token, *declared]) + end,
            body,
        ),
        Kind("chunked body, no token", _head("POST", PARK, chunked) + end, chunk),
        Kind("chunked body, token", _head("POST", ACCEPT, [token, *chunked]) + end, chunk),
        Kind("one endless header line", _head("GET", "/healthz", ["X-Big: "]), b"a" * PIECE),
        Kind(
            "endless header lines",
            _head("GET", "/healthz", []) + b"\r\n",
            b"".join(b"X-H%d: %s\r\n" % (n, b"a" * 1000) for n in range(PIECE // 1010)),
        ),
    ]


# -- the flood -------------------------------------------------------------------------------


async def one_request(port: int, kind: Kind, limit: int) -> str:
    """Send ``kind``'s head, then its piece until the server answers or closes, or ``limit``
    bytes went out; how it ended: the status code, ``closed`` (no answer before the close)
    or ``unanswered`` (the limit reached with no answer: the server read it all)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = asyncio.ensure_future(reader.readline())
    try:
        writer.write(kind.head)
        sent = len(kind.head)
        while sent < limit and not answer.done():
            writer.write(kind.piece)
            sent += len(kind.piece)
            try:
                await asyncio.wait_for(writer.drain(), 30)
            except (ConnectionError, OSError, TimeoutError):
                break  # closed on us, or no longer read
        try:
            line = await asyncio.wait_for(answer, 30)
        except (ConnectionError, OSError):
            return "closed"
        except TimeoutError:
            return "unanswered"
        return line.split()[1].decode() if line.startswith(b"HTTP/") else "closed"
    finally:
        answer.cancel()
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def flood(port: int, kind: Kind, requests: int, connections: int, limit: int) -> Counter[str]:
    """``requests`` of ``kind``, ``connections`` at a time; their endings, counted."""
    todo = iter(range(requests))
    ends: Counter[str] = Counter()

    async def lane() -> None:
        for _ in todo:
            ends[await one_request(port, kind, limit)] += 1

    await asyncio.gather(*(lane() for _ in range(connections)))
    return ends


# -- serve's memory and its event loop -------------------------------------------------------


def status_kb(pid: int, field_name: str) -> int:
    """A ``/proc/<pid>/status`` field in kB (VmRSS: now; VmHWM: the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


def reset_peak(pid: int) -> bool:
    """Reset the process's VmHWM to its RSS now (Linux: clear_refs 5); False if refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def sampled(pid: int, every: float = 0.02) -> Iterator[list[int]]:
    """VmRSS sampled in a thread while the block runs (for kernels without clear_refs)."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every):
            with contextlib.suppress(OSError, KeyError):
                samples.append(status_kb(pid, "VmRSS"))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


class PeakRss:
    """A process's peak RSS (kB) over one block at a time: VmHWM reset before each block where
    the kernel lets us (``reset`` stays True while it has), and VmRSS sampled besides."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.reset = True

    @contextlib.contextmanager
    def during(self) -> Iterator[list[int]]:
        """The block's peak lands in the yielded list when it ends."""
        self.reset = reset_peak(self.pid) and self.reset
        out: list[int] = []
        with sampled(self.pid) as samples:
            yield out
        peak = max([status_kb(self.pid, "VmRSS"), *samples])
        if self.reset:
            peak = max(peak, status_kb(self.pid, "VmHWM"))
        out.append(peak)


async def probe(port: int, until: asyncio.Event) -> list[float]:
    """``GET /healthz`` every PROBE_EVERY s until ``until``; each answer's time (ms)."""
    times: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        while not until.is_set():
            started = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                await client.get("/healthz")
                times.append((time.perf_counter() - started) * 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), PROBE_EVERY)
    return times


# -- one run, and the report -----------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    kind: str
    ends: dict[str, int]
    peak_kb: int
    probe_worst_ms: float


@dataclass
class Report:
    requests: int
    connections: int
    megabytes: int
    idle_kb: int = 0
    idle_probe_ms: float = 0.0
    peak_reset: bool = True
    rows: list[Row] = field(default_factory=list)

    def ratio(self, row: Row) -> float:
        return row.peak_kb / self.idle_kb

    def worst(self) -> Row:
        return max(self.rows, key=lambda r: r.peak_kb)

    def markdown(self) -> str:
        how = "VmHWM reset before each kind" if self.peak_reset else "VmRSS sampled every 20 ms"
        lines = [
            f"{self.requests} requests of each kind from {self.connections} connections at once, "
            f"each sending up to {self.megabytes} MB in 64 KiB writes until serve answers or "
            f"closes; serve auth on, 127.0.0.1. Idle: {self.idle_kb / 1024:.0f} MB RSS, "
            f"/healthz {self.idle_probe_ms:.1f} ms. Peak: {how}.",
            "",
            "| flood | ended as | serve peak RSS | over idle | peak / idle | /healthz worst |",
            "|---|---|---|---|---|---|",
        ]
        for row in self.rows:
            ends = ", ".join(f"{n} {end}" for end, n in sorted(row.ends.items()))
            lines.append(
                f"| {row.kind} | {ends} | {row.peak_kb / 1024:.0f} MB "
                f"| {(row.peak_kb - self.idle_kb) / 1024:+.1f} MB | {self.ratio(row):.2f}x "
                f"| {row.probe_worst_ms:.0f} ms |"
            )
        return "\n".join(lines) + "\n"


async def measure(pid: int, port: int, report: Report, chosen: list[Kind]) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for n in range(20):  # warm-up: the routes' first calls allocate what they keep
            body = {"clientMessageID": f"warm-{n}", "text": "warm-up"}
            await client.post(
                f"/v1/workspaces/{WORKSPACE}/sessions/w{n}/prompts", json=body, headers=auth
            )
            await client.get(ACCEPT, headers=auth)
    await asyncio.sleep(0.5)
    idle_done = asyncio.Event()
    idle_probe = asyncio.ensure_future(probe(port, idle_done))
    await asyncio.sleep(1.0)
    idle_done.set()
    report.idle_probe_ms = statistics.median(await idle_probe)
    report.idle_kb = status_kb(pid, "VmRSS")
    limit = report.megabytes * 1024 * 1024
    rss = PeakRss(pid)
    for kind in chosen:
        done = asyncio.Event()
        probing = asyncio.ensure_future(probe(port, done))
        with rss.during() as peaks:
            ends = await flood(port, kind, report.requests, report.connections, limit)
        done.set()
        times = await probing
        peak, report.peak_reset = peaks[0], rss.reset
        report.rows.append(Row(kind.name, dict(ends), peak, max(times, default=0.0)))
        print(f"{kind.name:34} {dict(ends)} peak {peak / 1024:.0f} MB", flush=True)


def run(
    requests: int = 64,
    connections: int = 16,
    megabytes: int = 100,
    only: Callable[[Kind], bool] = lambda _: True,
) -> Report:
    report = Report(requests, connections, megabytes)
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp, EmbeddedValkey(tmp) as server:
        tokens = Path(tmp, "tokens.json")
        tokens.write_text(
            json.dumps({"tokens": [{"token": TOKEN, "user": "flood", "workspaces": [WORKSPACE]}]})
        )
        port = free_port()
        args = [BIN, "serve", "--valkey-url", server.url, "--tokens", str(tokens)]
        with running([*args, "--port", str(port)], port, "/readyz", Path(tmp, "serve.log")) as pid:
            chosen = [k for k in kinds(megabytes) if only(k)]
            asyncio.run(measure(pid, port, report, chosen))
    return report


def give_verdict(report: Report, results: Path | None) -> None:
    worst = report.worst()
    verdict(
        results,
        target=TARGET,
        bar=f"serve's peak RSS <= {BAR}x its idle RSS",
        ours=f"{report.ratio(worst):.2f}x (+{(worst.peak_kb - report.idle_kb) / 1024:.0f} MB, "
        f"{worst.kind})",
        peers="before the body and head limits: 100 MB body 64 -> 371 MB; 300 MB accept 679 MB",
        met=report.ratio(worst) <= BAR,
        note=f"{report.requests} requests of {report.megabytes} MB per kind, "
        f"{report.connections} at once",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--out", type=Path, help="append the table here (markdown)")
    parser.add_argument("--results", type=Path, help="append the verdict here (JSON lines)")
    args = parser.parse_args()
    started = time.monotonic()
    report = run(args.requests, args.connections, args.megabytes)
    publish(report.markdown(), args.out)
    give_verdict(report, args.results)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
