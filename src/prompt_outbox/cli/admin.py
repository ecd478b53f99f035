"""Operator commands on the outbox itself: list, retry, dismiss, park, unpark, cleanup, stats.

Exit codes: 0 done, 1 not found, 3 busy (a delivery holds the session: try again), 2 usage.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from enum import IntEnum
from typing import Any, TypeVar

import click

from ..core.entry import Entry, Status, encode_list
from ..core.timeutil import format_time
from ..outbox import Outbox
from .storage import open_outbox, storage_options

T = TypeVar("T")
EXIT_NOT_FOUND, EXIT_BUSY = 1, 3


def _with_outbox(opts: dict[str, Any], action: Callable[[Outbox], Awaitable[T]]) -> T:
    async def main() -> T:
        async with open_outbox(**opts) as outbox:
            try:
                return await action(outbox)
            except ValueError as exc:  # a bad ID or reason: say so, write nothing
                raise click.BadParameter(str(exc)) from None

    return asyncio.run(main())


def _row(e: Entry) -> list[str]:
    text = e.text.replace("\n", " ")
    return [
        e.id,
        str(e.status),
        str(e.attempts),
        format_time(e.accepted_at)[:19],
        (text[:37] + "...") if len(text) > 40 else text,
        e.last_error[:60],
    ]


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table (the demo's summary uses it too)."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


@click.command("list")
@storage_options
@click.argument("workspace")
@click.argument("session")
@click.option("--json", "as_json", is_flag=True, help="the List JSON, as the API answers")
def list_prompts(workspace: str, session: str, as_json: bool, **opts: Any) -> None:
    """Show a session's queue in FIFO order."""
    entries = _with_outbox(opts, lambda o: o.list(workspace, session))
    if as_json:
        click.echo(encode_list(entries))
        return
    if not entries:
        click.echo("(empty)")
        return
    headers = ["ID", "STATUS", "TRIES", "ACCEPTED", "TEXT", "LAST ERROR"]
    click.echo(table(headers, [_row(e) for e in entries]))


def _entry_command(
    name: str, doc: str, act: Callable[[Outbox, str, str, str], Awaitable[IntEnum]]
) -> click.Command:
    """A command on one entry; prints the result in words and exits with its code."""

    @click.command(name, help=doc)
    @storage_options
    @click.argument("workspace")
    @click.argument("session")
    @click.argument("entry_id")
    def command(workspace: str, session: str, entry_id: str, **opts: Any) -> None:
        result = _with_outbox(opts, lambda o: act(o, workspace, session, entry_id))
        code = {"NOT_FOUND": EXIT_NOT_FOUND, "BUSY": EXIT_BUSY}.get(result.name, 0)
        click.echo(result.name.lower().replace("_", " "), err=code != 0)
        sys.exit(code)

    return command


retry = _entry_command("retry", "Re-arm an error entry (back to pending).", Outbox.retry)
dismiss = _entry_command("dismiss", "Remove an entry from a session's queue.", Outbox.dismiss)


@click.command()
@storage_options
@click.argument("workspace")
@click.option("--reason", required=True, help="why; shown on every parked entry")
def park(workspace: str, reason: str, **opts: Any) -> None:
    """Park every pending / verifying entry of a workspace."""
    click.echo(f"parked {_with_outbox(opts, lambda o: o.park_workspace(workspace, reason))}")


@click.command()
@storage_options
@click.argument("workspace")
def unpark(workspace: str, **opts: Any) -> None:
    """Re-arm a workspace's parked entries."""
    click.echo(f"unparked {_with_outbox(opts, lambda o: o.unpark_workspace(workspace))}")


@click.command()
@storage_options
@click.argument("workspace")
@click.option("--yes", is_flag=True, help="do not ask")
def cleanup(workspace: str, yes: bool, **opts: Any) -> None:
    """Delete every outbox key of a workspace (its queued prompts too)."""
    if not yes:
        click.confirm(f"Delete every queued prompt of workspace {workspace!r}?", abort=True)
    click.echo(f"deleted {_with_outbox(opts, lambda o: o.cleanup_workspace(workspace))} keys")


@click.command()
@storage_options
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='{"workspaces": {ID: {status: count}}, "total": {status: count}}, every status in total',
)
def stats(as_json: bool, **opts: Any) -> None:
    """Entries by status, per workspace and in total."""
    per_ws = _with_outbox(opts, lambda o: o.count_by_workspace())
    statuses = [str(s) for s in Status]
    totals = [sum(c.get(s, 0) for c in per_ws.values()) for s in statuses]
    if as_json:
        total = dict(zip(statuses, totals, strict=True))
        click.echo(json.dumps({"workspaces": per_ws, "total": total}, sort_keys=True))
        return
    rows = [[ws, *(str(c.get(s, 0)) for s in statuses)] for ws, c in sorted(per_ws.items())]
    rows.append(["(total)", *map(str, totals)])
    click.echo(table(["WORKSPACE", *(s.upper() for s in statuses)], rows))


__all__ = ["cleanup", "dismiss", "list_prompts", "park", "retry", "stats", "table", "unpark"]
