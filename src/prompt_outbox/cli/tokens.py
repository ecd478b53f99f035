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
from collections.abc import Callable, Iterator
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


def exposure(path: Path) -> str:
    """Who besides this user may read or change the token file at ``path``, and the fix; ''
    when nobody (serve warns at start). Group permissions count unless the file's group is
    surely this user's alone: its own group (named after it, nobody else listed), or a group
    with no name that this process is in (a Kubernetes pod's ``fsGroup``, which the kubelet
    gives read permission). Where an ACL names others, the group bits are its mask."""
    st = path.stat()
    if st.st_uid not in (os.geteuid(), 0):
        owner = _named(st.st_uid, lambda n: pwd.getpwuid(n).pw_name)
        return f"user {owner} owns it and may change it: chown it to the user serve runs as"
    if st.st_mode & 0o007:
        return "every user may read or change it: chmod 600 it"
    if st.st_mode & 0o070:
        if _has_acl(path):
            return "its ACL lets other users or groups read it: setfacl -b it, then chmod 600"
        if not _alone_in(st.st_gid):
            group = _named(st.st_gid, lambda n: grp.getgrgid(n).gr_name)
            return f"the members of group {group} may read or change it: chmod 600 it"
    return ""


def _alone_in(gid: int) -> bool:
    """Is group ``gid`` surely this process's user's alone? Only two cases are trusted: a
    directory service may list neither every user (``getpwall``) nor every member."""
    try:
        me = pwd.getpwuid(os.geteuid())
    except KeyError:  # a user with no name (a container run as a bare uid)
        me = None
    try:
        group = grp.getgrgid(gid)
    except KeyError:  # a bare number: in it, and nothing can say who else is
        return gid == os.getegid() or gid in os.getgroups()
    if me is None or gid != me.pw_gid or group.gr_name != me.pw_name:
        return False
    others = {u.pw_name for u in pwd.getpwall() if u.pw_gid == gid} | set(group.gr_mem)
    return others <= {me.pw_name}


def _has_acl(path: Path) -> bool:
    try:
        return "system.posix_acl_access" in os.listxattr(path)
    except OSError:  # a file system without extended attributes has no ACLs either
        return False


def _named(number: int, name_of: Callable[[int], str]) -> str:
    """``name (number)``, or the bare number where it has no name."""
    try:
        return f"{name_of(number)} ({number})"
    except KeyError:
        return str(number)


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
