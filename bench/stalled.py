"""Stalled event streams: what clients that never read cost serve's memory, with the stream
buffers bounded in bytes (the defaults) against bounded only in events (issue 22, finding 5).

    .venv/bin/python -m bench.stalled [--streams 32] [--edits 150] [--text-kb 100]
                                      [--out FILE] [--results FILE]

For each setup it starts ``prompt-outbox serve`` on a fresh embedded Valkey, accepts one
prompt, opens ``--streams`` event streams of its session that read their response headers
and then nothing more (a small receive buffer, as a stalled phone), then edits the prompt
``--edits`` times with a text of ``--text-kb`` KB: each edit logs an event carrying the whole
entry, which every stream's follower reads. It reports serve's resident memory (VmRSS, and
its peak VmHWM, from /proc: Linux) before the streams open and once the buffers settle, the
bytes the feed says it buffers, and how many streams were cut off. The figure to read is the
ratio of the two setups' growth within one run (these machines are shared and noisy).

- bounded: ``--stream-buffer-mib 4 --streams-buffer-mib 64`` (the defaults);
- events only: both set to 100000 MiB, so only ``FeedLimits.max_behind`` (1000 events)
  bounds a stream, as before the byte bounds.

Everything runs on 127.0.0.1 against servers it starts itself and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.output import publish, stop_group, verdict, wait_ready
from prompt_outbox.embedded import EmbeddedValkey, free_port

BIN = str(Path(sys.executable).parent / "prompt-outbox")
SESSION = "/v1/workspaces/bench/sessions/stalled"
TARGET = "Memory: serve with stalled event streams and large edits"


@dataclass(frozen=True)
class Setup:
    name: str
    stream_mib: int
    streams_mib: int


SETUPS = (Setup("bounded (defaults)", 4, 64), Setup("events only", 100_000, 100_000))


@dataclass(frozen=True)
class Row:
    setup: Setup
    rss_before: int  # KiB
    rss_after: int
    peak: int
    buffered: float  # bytes, the feed's gauge
    cut: dict[str, float]  # streams cut off, by the bound they passed

    @property
    def cuts(self) -> str:
        return ", ".join(f"{n:.0f} ({bound})" for bound, n in self.cut.items() if n) or "0"

    @property
    def growth(self) -> int:
        return self.rss_after - self.rss_before


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def metric(text: str, name: str, labels: str = "") -> float:
    """The sum of a metric's samples (with ``labels``, e.g. ``bound="bytes"``, those only) in
    a Prometheus text exposition (0 when absent)."""
    pattern = rf"^{name}(?:{{[^}}]*{re.escape(labels)}[^}}]*}})? (\S+)$"
    return sum(float(v) for v in re.findall(pattern, text, re.M))


@contextlib.contextmanager
def serve(url: str, setup: Setup) -> Iterator[tuple[int, int]]:
    """A serve process on ``url``'s Valkey: (its pid, its port)."""
    port = free_port()
    args = [BIN, "serve", "--valkey-url", url, "--no-auth", "--port", str(port)]
    args += ["--stream-buffer-mib", str(setup.stream_mib)]
    args += ["--streams-buffer-mib", str(setup.streams_mib)]
    args += ["--max-streams-per-token", "100000", "--accept-rate", "0"]
    proc = subprocess.Popen(
        args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_ready(port)
        yield proc.pid, port
    finally:
        stop_group(proc, 30)


async def stalled_stream(port: int) -> asyncio.StreamWriter:
    """An event stream that reads its response's head and then nothing: a small receive
    buffer, and asyncio stops reading the socket once its own 64 KiB buffer is full."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"GET {SESSION}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"the stream was refused: {head[:80]!r}")
    return writer


async def settled(http: httpx.AsyncClient) -> str:
    """The /metrics text once the feed's buffered bytes stopped moving (the followers read
    what they may)."""
    last = -1.0
    for _ in range(100):
        text = (await http.get("/metrics")).text
        now = metric(text, "prompt_outbox_stream_buffer_bytes")
        if now == last:
            return text
        last = now
        await asyncio.sleep(0.3)
    return text


async def measure(url: str, setup: Setup, streams: int, edits: int, text_kb: int) -> Row:
    with serve(url, setup) as (pid, port):
        base = f"http://127.0.0.1:{port}"
        headers = {"Content-Type": "application/json"}
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=headers) as http:
            accepted = await http.post(
                f"{SESSION}/prompts", json={"clientMessageID": "first", "text": "first"}
            )
            accepted.raise_for_status()
            entry_id = accepted.json()["id"]
            await settled(http)
            rss_before, _ = memory_kib(pid)
            writers = [await stalled_stream(port) for _ in range(streams)]
            try:
                for n in range(edits):
                    text = f"{n:05d}" + "x" * (text_kb * 1000)
                    edit = await http.patch(f"{SESSION}/prompts/{entry_id}", json={"text": text})
                    edit.raise_for_status()
                exposition = await settled(http)
                rss_after, peak = memory_kib(pid)
            finally:
                for w in writers:
                    w.close()
            return Row(
                setup,
                rss_before,
                rss_after,
                peak,
                metric(exposition, "prompt_outbox_stream_buffer_bytes"),
                {
                    bound: metric(
                        exposition, "prompt_outbox_streams_fell_behind_total", f'bound="{bound}"'
                    )
                    for bound in ("bytes", "process", "events")
                },
            )


@dataclass
class Report:
    streams: int
    edits: int
    text_kb: int
    rows: list[Row]

    def markdown(self) -> str:
        head = (
            f"Stalled event streams: {self.streams} streams that never read, {self.edits} "
            f"edits of {self.text_kb} KB (serve's memory, KiB)\n\n"
            "| setup | RSS before | RSS after | growth | peak | feed buffers | streams cut |\n"
            "|---|---|---|---|---|---|---|\n"
        )
        body = "".join(
            f"| {r.setup.name} | {r.rss_before} | {r.rss_after} | {r.growth} | {r.peak} | "
            f"{r.buffered / 1024:.0f} | {r.cuts} |\n"
            for r in self.rows
        )
        return head + body + f"\ngrowth, bounded / events only: {self.ratio():.2f}\n"

    def ratio(self) -> float:
        bounded, events_only = self.rows
        return bounded.growth / max(1, events_only.growth)


async def run(streams: int, edits: int, text_kb: int, setups: tuple[Setup, ...] = SETUPS) -> Report:
    rows = []
    for setup in setups:
        with (
            tempfile.TemporaryDirectory(prefix="bench-stalled-") as tmp,
            EmbeddedValkey(tmp) as server,
        ):
            rows.append(await measure(server.url, setup, streams, edits, text_kb))
    return Report(streams, edits, text_kb, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--edits", type=int, default=150)
    parser.add_argument("--text-kb", type=int, default=100)
    parser.add_argument("--out", type=Path, help="append the table here (markdown)")
    parser.add_argument("--results", type=Path, help="append the memory row (JSON lines)")
    args = parser.parse_args()
    report = asyncio.run(run(args.streams, args.edits, args.text_kb))
    publish(report.markdown(), args.out)
    bounded, events_only = report.rows
    verdict(
        args.results,
        target=TARGET,
        bar="growth bounded by the stream buffer bounds (report only)",
        ours=f"+{bounded.growth / 1024:.0f} MiB (streams cut off: {bounded.cuts})",
        peers=f"events only: +{events_only.growth / 1024:.0f} MiB",
        met=None,
        note=f"bench.stalled: {report.streams} streams that never read, {report.edits} edits "
        f"of {report.text_kb} KB; growth ratio {report.ratio():.2f}",
    )


if __name__ == "__main__":
    main()
