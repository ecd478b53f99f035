"""What every benchmark does with its figures: print its table, append it to ``--out``, and
append its verdicts on the performance targets to ``--results`` (JSON lines), from which
``bench.summary`` writes the targets table into docs/performance.md; and how it stops the
servers it started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx


def publish(markdown: str, out: Path | None) -> None:
    """Print the table; append it to ``out`` (``make bench``: bench-report.md) if given."""
    print(markdown)
    if out:
        with out.open("a") as f:
            f.write("\n" + markdown)


def verdict(
    results: Path | None,
    *,
    target: str,
    bar: str,
    ours: str,
    peers: str = "",
    met: bool | None,
    note: str = "",
) -> None:
    """Append one target row to ``results`` (JSON lines) if given.

    ``target`` names the row (the same name in every run, so a later row replaces an earlier
    one), ``bar`` says what it must be, ``ours`` our figure, ``peers`` the peers' or baseline's
    figures beside it, ``met`` True / False (None: a report-only row, such as memory).
    """
    if results is None:
        return
    row = {"target": target, "bar": bar, "ours": ours, "peers": peers, "met": met, "note": note}
    with results.open("a") as f:
        f.write(json.dumps(row) + "\n")


def wait_ready(port: int, within: float = 30.0) -> None:
    """Wait until a server started on 127.0.0.1:``port`` answers ``/readyz`` with 200."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError("serve did not become ready")
        time.sleep(0.05)


def stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM a server started in a session of its own (``start_new_session``), and SIGKILL
    its group if it has not exited within ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
