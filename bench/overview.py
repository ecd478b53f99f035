"""Serve's memory for the overview and the entry counts (they once read every entry): a real
``prompt-outbox serve`` answering the queue page's two overview routes and a ``/metrics``
count while one workspace holds ``--megabytes`` of entries.

    .venv/bin/python -m bench.overview [--megabytes 100] [--out FILE] [--results FILE]

One embedded Valkey and one real ``serve`` (auth on, ``--valkey-url``, no deliverer, so the
entries wait and serve's own process is the one measured) on 127.0.0.1. The workspace is
filled through the library first: prompts of 100 000 control characters, about 600 KB of
JSON each once escaped, 25 to a session. Then serve starts, warms up on a small workspace,
and its idle RSS is read. Then, one after the other: ``GET /v1/workspaces`` (the token's
workspaces: the full one among them), ``GET /v1/workspaces/{ws}/sessions`` and a ``/metrics``
scrape whose count covers the full workspace (the count runs at most once per
``--metrics-count-interval``: the bench waits out the interval, then scrapes until the gauge
shows the workspace). Each reports serve's peak RSS during it (VmHWM, reset before each,
where the kernel lets us, and sampled besides) against the idle RSS, and its answer time.

Before the tally (code of 314a86a, 100 MB held): ``GET /v1/workspaces`` and the ``/metrics``
count each 64 -> 254 MB peak (4.00x), the sessions page 174 MB (2.73x); the red team saw 78 ->
272 MB. Read the ratios, never the absolutes: these machines are shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.flood import PeakRss, status_kb
from bench.http import BIN, running
from bench.output import publish, verdict
from prompt_outbox import Outbox
from prompt_outbox.embedded import EmbeddedValkey, free_port
from prompt_outbox.storage.connect import connect

TARGET = "Overview memory against the bytes held"
BAR = 1.25  # serve's peak RSS / its idle RSS, for the worst of the three requests
TOKEN = "overview-token"
FULL, WARM = "acme", "warm"
TEXT = "\x01" * 100_000  # 100 kB of text, ~600 kB of JSON: the largest entry there is
ENTRY_BYTES = 600_000
PER_SESSION = 25  # the default cap
METRICS_INTERVAL = 1.0


@dataclass(frozen=True)
class Row:
    request: str
    status: int
    peak_kb: int
    seconds: float


@dataclass
class Report:
    megabytes: int
    entries: int = 0
    idle_kb: int = 0
    peak_reset: bool = True
    rows: list[Row] = field(default_factory=list)

    def ratio(self, row: Row) -> float:
        return row.peak_kb / self.idle_kb

    def worst(self) -> Row:
        return max(self.rows, key=lambda r: r.peak_kb)

    def markdown(self) -> str:
        how = "VmHWM reset before each" if self.peak_reset else "VmRSS sampled every 20 ms"
        lines = [
            f"One workspace holding {self.entries} entries of ~600 kB of JSON "
            f"(~{self.megabytes} MB); serve auth on, no deliverer, 127.0.0.1. "
            f"Idle: {self.idle_kb / 1024:.0f} MB RSS. Peak: {how}.",
            "",
            "| request | status | serve peak RSS | over idle | peak / idle | answer |",
            "|---|---|---|---|---|---|",
        ]
        for row in self.rows:
            lines.append(
                f"| {row.request} | {row.status} | {row.peak_kb / 1024:.0f} MB "
                f"| {(row.peak_kb - self.idle_kb) / 1024:+.1f} MB | {self.ratio(row):.2f}x "
                f"| {row.seconds * 1000:.0f} ms |"
            )
        return "\n".join(lines) + "\n"


async def fill(url: str, megabytes: int) -> int:
    """Fill the workspace with ~``megabytes`` of entries through the library; how many."""
    entries = max(1, megabytes * 1_000_000 // ENTRY_BYTES)
    client = connect(url)
    try:
        outbox = Outbox(client)
        for i in range(entries):
            await outbox.accept(FULL, f"s{i // PER_SESSION}", "bench", f"c{i}", TEXT)
        # A small one too, which the warm-up reads (the routes' first calls allocate).
        await outbox.accept(WARM, "s0", "bench", "c0", "warm-up")
    finally:
        await client.aclose()
    return entries


def counted_at(metrics: str) -> float:
    """When the entries gauge of a /metrics text was counted (0 before the first count)."""
    found = re.search(r"^prompt_outbox_entries_counted (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


async def measure(pid: int, port: int, report: Report) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    sessions = f"/v1/workspaces/{FULL}/sessions"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        for _ in range(10):  # warm-up, on the small workspace only
            await client.get(f"/v1/workspaces/{WARM}/sessions", headers=auth)
            await client.get("/metrics")
        await asyncio.sleep(0.5)
        report.idle_kb = status_kb(pid, "VmRSS")

        rss = PeakRss(pid)

        async def once(name: str, path: str, headers: dict[str, str]) -> httpx.Response:
            started, wall = time.perf_counter(), time.time()
            with rss.during() as peaks:
                answer = await client.get(path, headers=headers)
                # The scrape that finds the count stale starts a new one: scrape until the
                # gauge shows that one.
                while path == "/metrics" and counted_at(answer.text) < wall:
                    assert time.perf_counter() - started < 120, "the count never came"
                    await asyncio.sleep(0.1)
                    answer = await client.get(path, headers=headers)
            seconds = time.perf_counter() - started
            peak, report.peak_reset = peaks[0], rss.reset
            report.rows.append(Row(name, answer.status_code, peak, seconds))
            print(f"{name:32} {answer.status_code} peak {peak / 1024:.0f} MB", flush=True)
            return answer

        page = await once("GET /v1/workspaces", "/v1/workspaces", auth)
        assert FULL in page.text, page.text
        await once(f"GET {sessions}", sessions, auth)
        await asyncio.sleep(METRICS_INTERVAL * 1.5)  # the warm-up's count is stale now
        await once("/metrics (its count)", "/metrics", {})


def run(megabytes: int = 100) -> Report:
    report = Report(megabytes)
    with (
        tempfile.TemporaryDirectory(prefix="bench-overview-") as tmp,
        EmbeddedValkey(tmp) as server,
    ):
        report.entries = asyncio.run(fill(server.url, megabytes))
        tokens = Path(tmp, "tokens.json")
        table = {"tokens": [{"token": TOKEN, "user": "bench", "workspaces": [FULL, WARM]}]}
        tokens.write_text(json.dumps(table))
        port = free_port()
        args = [BIN, "serve", "--valkey-url", server.url, "--tokens", str(tokens)]
        args += ["--metrics-count-interval", str(METRICS_INTERVAL), "--port", str(port)]
        with running(args, port, "/readyz", Path(tmp, "serve.log")) as pid:
            asyncio.run(measure(pid, port, report))
    return report


def give_verdict(report: Report, results: Path | None) -> None:
    worst = report.worst()
    verdict(
        results,
        target=TARGET,
        bar=f"serve's peak RSS <= {BAR}x its idle RSS",
        ours=f"{report.ratio(worst):.2f}x (+{(worst.peak_kb - report.idle_kb) / 1024:.0f} MB, "
        f"{worst.request})",
        peers="before the tally (314a86a): 4.00x (GET /v1/workspaces and /metrics, 64 -> 254 MB)",
        met=report.ratio(worst) <= BAR,
        note=f"one workspace holding ~{report.megabytes} MB in {report.entries} entries",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--out", type=Path, help="append the table here (markdown)")
    parser.add_argument("--results", type=Path, help="append the verdict here (JSON lines)")
    args = parser.parse_args()
    started = time.monotonic()
    report = run(args.megabytes)
    publish(report.markdown(), args.out)
    give_verdict(report, args.results)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
