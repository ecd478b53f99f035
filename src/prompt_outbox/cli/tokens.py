"""``prompt-outbox tokens add``: a new bearer token in a token file (its format: docs/api.md,
``TokenTable``)."""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pwd
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click

from ..api.auth import TokenTable

TOKEN_BYTES = 32
"""Random bytes in a new token (URL-safe base64: 43 characters)."""


def add_token(path: Path, workspaces: tuple[str, ...], user: str, admin: bool = False) -> str:
    """Append a new random token for ``user`` on ``workspaces`` (or every one, ``admin``) to
    the token file at ``path`` (made if missing); returns the token. The file is read and the
    result checked by ``TokenTable``'s own parser (ValueError: what is wrong, the file left
    as it was), then replaced atomically, mode 0600. Two at once on one file take turns
    (``_exclusive``), so neither's token is lost."""
    with _exclusive(path):
        return _add(path, workspaces, user, admin)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``.<name>.lock`` beside ``path`` (made 0600, left in place):
    the token file itself is replaced by a rename, so a lock on it would be on the old file."""
    lock = path.resolve().parent / f".{path.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when closed
        yield
    finally:
        os.close(fd)


def _add(path: Path, workspaces: tuple[str, ...], user: str, admin: bool) -> str:
    if path.exists():
        TokenTable.from_file(path)  # refuse a file serve would refuse
        doc = json.loads(path.read_text("utf-8"))
    else:
        doc = {"tokens": []}
    token = secrets.token_urlsafe(TOKEN_BYTES)
    row: dict[str, object] = {"token": token, "user": user, "workspaces": list(workspaces)}
    if admin:
        row["admin"] = True
    doc["tokens"].append(row)
    text = json.dumps(doc, indent=2) + "\n"
    TokenTable.from_json(text)  # the new row is one serve takes (IDs, user)
    _replace(path, text)
    return token


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a 0600 file in its directory, renamed over it: a
    reader sees the old file or the new one, never half of one."""
    folder = path.resolve().parent
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:  # mkstemp makes it 0600
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def others_who_may_read(path: Path) -> str:
    """Who besides this user may read or change the token file at ``path``: '' when nobody,
    else who (for serve's start-up warning). Group permissions count only when the file's
    group has someone else in it: a group of this user alone (a Debian user's own group, or a
    Kubernetes pod's ``fsGroup``, which the kubelet adds read permission for) is no exposure."""
    st = path.stat()
    if st.st_mode & 0o007:
        return "every user"
    if st.st_mode & 0o070 and not _alone_in(st.st_gid):
        return f"the members of group {_group_name(st.st_gid)}"
    return ""


def _alone_in(gid: int) -> bool:
    """Is this process's user the only one in group ``gid`` (by ``/etc/group`` and the users
    whose own group it is), and this process in it?"""
    if gid != os.getegid() and gid not in os.getgroups():
        return False
    try:
        listed = set(grp.getgrgid(gid).gr_mem)
    except KeyError:  # a bare number (a pod's fsGroup need not be named)
        listed = set()
    members = listed | {u.pw_name for u in pwd.getpwall() if u.pw_gid == gid}
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        me = ""
    return members <= {me}


def _group_name(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} ({gid})"
    except KeyError:
        return str(gid)


@click.group()
def tokens() -> None:
    """Manage a token file (serve --tokens)."""


@tokens.command("add")
@click.option(
    "--file",
    "path",
    required=True,
    envvar="PROMPT_OUTBOX_TOKENS_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="the token file (made if missing)",
)
@click.option(
    "--workspace",
    "workspaces",
    multiple=True,
    help="a workspace ID the token may use; repeat it for several",
)
@click.option("--admin", is_flag=True, help="the token may use every workspace and admin routes")
@click.option("--user", help="the userID stamped on its accepts  [default: the first workspace]")
def add(path: Path, workspaces: tuple[str, ...], admin: bool, user: str | None) -> None:
    """Add a new random token to the file and print it, alone on stdout.

    A running serve reads the file at its start: restart it to take the token."""
    if not workspaces and not admin:
        raise click.UsageError("give --workspace ID (repeatable) or --admin")
    user = user or (workspaces[0] if workspaces else "admin")
    try:
        token = add_token(path, workspaces, user, admin)
    except (ValueError, OSError) as exc:
        raise click.ClickException(f"{path}: {exc}") from None
    click.echo(token)
    click.echo(f"added a token for user {user!r} to {path}", err=True)
