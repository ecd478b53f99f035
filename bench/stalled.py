"""Stalled clients: what clients that never read cost serve's memory.

    .venv/bin/python -m bench.stalled [--case edits|answers|all] [--streams 32] [--edits 150]
                                      [--text-kb 100] [--stalled 24] [--before REV]
                                      [--out FILE] [--results FILE]

Two cases, each on a fresh embedded Valkey with ``prompt-outbox serve`` started for each
setup, everything on 127.0.0.1; the figure to read is a ratio of two setups' growth within
one run (these machines are shared and noisy).

``edits``: the stream buffers bounded in bytes (the defaults) against
bounded only in events. It accepts one prompt, opens ``--streams`` event streams of its
session that read their response headers and then nothing more (a small receive buffer, as
a stalled phone), then edits the prompt ``--edits`` times with a text of ``--text-kb`` KB:
each edit logs an event carrying the whole entry, which every stream's follower reads. It
reports serve's resident memory (VmRSS, and its peak VmHWM, from /proc: Linux) before the
streams open and once the buffers settle, the bytes the feed says it buffers, and how many
streams were cut off.

- bounded: ``--stream-buffer-mib 4 --streams-buffer-mib 64`` (the defaults);
- events only: both set to 100000 MiB, so only ``FeedLimits.max_behind`` (1000 events)
  bounds a stream, as before the byte bounds.

``answers`` (clients that stop reading a large answer): an attacker's session, 25 prompts of 34 000
``\\x01`` (JSON escapes each to six characters: a 5.1 MB list or reset), then ``--stalled``
clients that send ``GET .../events`` (its opening reset) or ``GET .../prompts`` (the list)
and read only the answer's head. It reports serve's VmRSS idle (the session filled and
listed once) and with the stalled clients held, and the growth per stalled answer, for:

- before: the code of ``--before`` (default: the commit before ``api/answers.py`` was added),
  run from a ``git archive`` of it: each answer formatted whole and held, with its snapshot,
  as long as its client keeps the connection;
- after: this tree, its answer budgets raised out of the way and its send timeout far off, so
  that every stalled answer is served and held: what each costs while its client stalls (at
  the defaults, 16 MiB of them per token and 64 MiB in all, then 429 / 503, and each is cut
  at the 30 s send timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
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


# -- stalled answers --------------------------------------------------------------------------

ANSWERS_TARGET = "Memory: serve with stalled lists and event-stream resets"
CTRL = "\x01" * 34_000  # the red team's text: 204 KB JSON-escaped, under the body limit
ENTRIES = 25  # Tunables.cap: the whole session
KINDS = ("events", "prompts")  # the opening reset, the list
UNBOUNDED = ["--answers-buffer-mib", "100000", "--answers-buffer-mib-per-token", "100000"]
ROOT = Path(__file__).resolve().parent.parent


def before_rev() -> str:
    """The commit before the answer budgets: the parent of the one that added api/answers.py
    (HEAD when that is not committed yet)."""
    added = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "log",
            "--diff-filter=A",
            "--format=%H",
            "--",
            "src/prompt_outbox/api/answers.py",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return f"{added[-1]}^" if added else "HEAD"


@contextlib.contextmanager
def archived(rev: str) -> Iterator[Path]:
    """The package source of ``rev`` (``git archive``), in a directory that goes after."""
    with tempfile.TemporaryDirectory(prefix="bench-stalled-src-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp) / "src"


@contextlib.contextmanager
def serve_code(url: str, src: Path | None, extra: list[str]) -> Iterator[tuple[int, int]]:
    """A serve process (no auth) on ``url``'s Valkey, running the package at ``src`` (None:
    this tree's): (its pid, its port)."""
    port = free_port()
    args = ["serve", "--valkey-url", url, "--no-auth", "--port", str(port), "--accept-rate", "0"]
    args += ["--max-streams-per-token", "100000", *extra]
    env = dict(os.environ)
    command = [BIN, *args]
    if src is not None:
        env["PYTHONPATH"] = str(src)
        command = [sys.executable, "-c", "from prompt_outbox.cli import main; main()", *args]
    proc = subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(port)
        yield proc.pid, port
    finally:
        stop_group(proc, 30)


def stalled_answer(port: int, path: str) -> socket.socket:
    """A GET whose client reads the answer's head and then nothing (a 4 KiB receive buffer):
    the red team's reproduction."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    sock.settimeout(30)
    head = sock.recv(200)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"the answer was refused: {head[:80]!r}")
    return sock


def steady_rss(pid: int, within: float = 10.0) -> int:
    """VmRSS (KiB) once it stopped moving (two samples 0.5 s apart within 256 KiB)."""
    last, deadline = memory_kib(pid)[0], time.monotonic() + within
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = memory_kib(pid)[0]
        if abs(now - last) < 256:
            return now
        last = now
    return last


@dataclass(frozen=True)
class AnswerRow:
    code: str  # before / after
    kind: str  # events / prompts
    stalled: int
    idle: int  # KiB
    held: int  # KiB, with the stalled clients
    counted: float | None  # bytes the answer budgets count (after only)

    @property
    def per_answer(self) -> float:
        """MiB of growth per stalled answer."""
        return (self.held - self.idle) / 1024 / max(1, self.stalled)


def measure_answers(url: str, code: str, src: Path | None, kind: str, stalled: int) -> AnswerRow:
    extra = [] if src is not None else [*UNBOUNDED, "--send-timeout", "600"]
    with serve_code(url, src, extra) as (pid, port):
        session = f"/v1/workspaces/bench/sessions/{kind}"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            for n in range(ENTRIES):
                body = {"clientMessageID": f"big{n}", "text": CTRL}
                http.post(f"{session}/prompts", json=body).raise_for_status()
            http.get(f"{session}/prompts").raise_for_status()  # the paths warm, read whole
            idle = steady_rss(pid)
            socks = []
            try:
                for _ in range(stalled):
                    socks.append(stalled_answer(port, f"{session}/{kind}"))
                held = steady_rss(pid)
                text = http.get("/metrics").text
                counted = metric(text, "prompt_outbox_answer_buffer_bytes") if src is None else None
            finally:
                for sock in socks:
                    sock.close()
    return AnswerRow(code, kind, stalled, idle, held, counted)


@dataclass
class AnswersReport:
    stalled: int
    before: str
    rows: list[AnswerRow]

    def row(self, code: str, kind: str) -> AnswerRow:
        return next(r for r in self.rows if (r.code, r.kind) == (code, kind))

    def ratio(self, kind: str) -> float:
        """Growth after / before, for one kind of answer."""
        before = self.row("before", kind).held - self.row("before", kind).idle
        return (self.row("after", kind).held - self.row("after", kind).idle) / max(1, before)

    def markdown(self) -> str:
        head = (
            f"Stalled answers: {self.stalled} clients that never read a 5.1 MB list or reset "
            f"(serve's VmRSS, KiB; before: {self.before})\n\n"
            "| code | answer | idle | stalled | growth | per answer (MiB) | counted (MiB) |\n"
            "|---|---|---|---|---|---|---|\n"
        )
        body = "".join(
            f"| {r.code} | {r.kind} | {r.idle} | {r.held} | {r.held - r.idle} | "
            f"{r.per_answer:.2f} | "
            f"{'-' if r.counted is None else f'{r.counted / 1024 / 1024:.1f}'} |\n"
            for r in self.rows
        )
        codes = {r.code for r in self.rows}
        ratios = "".join(
            f"\ngrowth, after / before ({kind}): {self.ratio(kind):.3f}"
            for kind in KINDS
            if codes == {"before", "after"}
        )
        return head + body + ratios + "\n"


def run_answers(
    stalled: int, before: str | None = None, kinds: tuple[str, ...] = KINDS
) -> AnswersReport:
    """Each kind on this tree (after) and, unless ``before`` is None, on that revision."""
    rows = []
    codes: list[tuple[str, str | None]] = [("after", None)]
    if before is not None:
        codes.insert(0, ("before", before))
    for code, rev in codes:
        with contextlib.ExitStack() as stack:
            src = None if rev is None else stack.enter_context(archived(rev))
            for kind in kinds:
                with (
                    tempfile.TemporaryDirectory(prefix="bench-stalled-") as tmp,
                    EmbeddedValkey(tmp) as server,
                ):
                    rows.append(measure_answers(server.url, code, src, kind, stalled))
    return AnswersReport(stalled, before or "-", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=("edits", "answers", "all"), default="all")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--edits", type=int, default=150)
    parser.add_argument("--text-kb", type=int, default=100)
    parser.add_argument("--stalled", type=int, default=24, help="stalled answers of each kind")
    parser.add_argument(
        "--before", help="the revision to compare with (default: the one before the answer budgets)"
    )
    parser.add_argument("--out", type=Path, help="append the table here (markdown)")
    parser.add_argument("--results", type=Path, help="append the memory row (JSON lines)")
    args = parser.parse_args()
    if args.case in ("edits", "all"):
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
    if args.case in ("answers", "all"):
        answers = run_answers(args.stalled, args.before or before_rev())
        publish(answers.markdown(), args.out)
        after = {kind: answers.row("after", kind).per_answer for kind in KINDS}
        before = {kind: answers.row("before", kind).per_answer for kind in KINDS}
        verdict(
            args.results,
            target=ANSWERS_TARGET,
            bar="a stalled answer holds its charge, not the answer formatted whole (report only)",
            ours=", ".join(f"{k}: +{v:.2f} MiB each" for k, v in after.items()),
            peers="before: " + ", ".join(f"{k}: +{v:.2f} MiB each" for k, v in before.items()),
            met=None,
            note=f"bench.stalled --case answers: {answers.stalled} stalled clients of each kind "
            "on a 25 x 34 000 \\x01 session; growth after / before: "
            + ", ".join(f"{k} {answers.ratio(k):.3f}" for k in KINDS),
        )


if __name__ == "__main__":
    main()
