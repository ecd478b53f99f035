"""What every benchmark does with its figures: print its table, append it to ``--out``, and
append its verdicts on issue 12's targets to ``--results`` (JSON lines), from which
``bench.summary`` writes the targets table into docs/performance.md."""

from __future__ import annotations

import json
from pathlib import Path


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
