"""What every benchmark does with its table: print it, and append it to ``--out``."""

from __future__ import annotations

from pathlib import Path


def publish(markdown: str, out: Path | None) -> None:
    """Print the table; append it to ``out`` (``make bench``: bench-report.md) if given."""
    print(markdown)
    if out:
        with out.open("a") as f:
            f.write("\n" + markdown)
