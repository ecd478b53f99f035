"""Where each of our sessions goes in opencode (docs/deliverers.md, "Mappings"): a target, an
opencode server's base URL and a session ID there, per (workspace, session), from templates,
a static map, or a resolver of the caller's own; and the checks made when a mapping is built.

A session ID must be one path segment; a URL must be ``http(s)://host[:port][/path]`` (no user,
query or fragment: the deliverer appends ``/session/...`` to it); and no two workspaces may
meet in one opencode session unless the operator allows it (``allow_shared_sessions``): a
tenant that learns another's opencode session ID could otherwise write into that agent
conversation through a session of its own. opencode mints its session IDs (``ses_...``), so
what keeps workspaces apart is ``{workspace}`` in the URL (a server, or a proxy path, per
workspace), or distinct targets in a static map.
"""

from __future__ import annotations

import json
import string
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

import httpx

from ..core.errors import InvalidId
from ..core.keys import check_id


@dataclass(frozen=True, slots=True)
class OpencodeTarget:
    """Where one of our sessions lives: an opencode server and its session ID there."""

    base_url: str
    session_id: str


TargetResolver = Callable[[str, str], Awaitable[OpencodeTarget] | OpencodeTarget]
"""``(workspace, session) -> OpencodeTarget`` (sync or async); raising means "no target"."""


class InvalidTarget(ValueError):
    """A target or a mapping that cannot be used: a session ID that cannot be one URL path
    segment, a URL that is no opencode server's base, a template field other than a plain
    ``{workspace}`` or ``{session}``."""


class SharedTarget(InvalidTarget):
    """A mapping that lets two workspaces reach one opencode session, built without
    ``allow_shared_sessions``."""


_ALLOW = "allow_shared_sessions=True; serve and worker: --opencode-allow-shared-sessions"


def session_path(session_id: str) -> str:
    """``session_id`` as one percent-encoded path segment, or InvalidTarget: it must not be
    empty, only dots (a client removes ``.`` and ``..`` segments), or hold ``/``, ``?`` or
    ``#`` (which percent-encoding would hide, but which no opencode session ID holds: such an
    ID is a misconfigured template or map)."""
    if not session_id.strip(".") or any(c in session_id for c in "/?#"):
        raise InvalidTarget(
            f"opencode session ID {session_id!r} is not one path segment (empty, only dots, "
            "or holding '/', '?' or '#')"
        )
    return quote(session_id, safe="")


@dataclass(frozen=True, slots=True)
class Server:
    """An opencode server as a base URL names it, however it is spelled: its origin (scheme,
    host, port) and the path its routes are under (no trailing slash). Two bases on one
    origin under two paths may be two opencode servers behind a proxy."""

    origin: tuple[str, str, int]
    path: str

    def __str__(self) -> str:
        scheme, host, port = self.origin
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}{self.path}"


def server_of(base_url: str) -> Server:
    """The server ``base_url`` names, or InvalidTarget if it is no ``http(s)://host[:port]
    [/path]``: a user in it would be logged, a query or fragment would cut the paths appended,
    a dot segment (``..``, ``%2e``) would remove a part of the path (a workspace's, say)."""
    try:
        url = httpx.URL(base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
    except (httpx.InvalidURL, ValueError) as exc:
        raise InvalidTarget(f"opencode URL {base_url!r}: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host or not 0 < port < 65536:
        raise InvalidTarget(f"opencode URL {base_url!r} is not http(s)://host[:port][/path]")
    if url.userinfo or "?" in base_url or "#" in base_url:
        raise InvalidTarget(
            f"opencode URL {base_url!r} holds a user, a query or a fragment (credentials go "
            "in OPENCODE_SERVER_PASSWORD, or auth=)"
        )
    path = url.raw_path.decode("ascii").rstrip("/")
    if any(p and not unquote(p).strip(".") for p in urlsplit(base_url).path.split("/")):
        raise InvalidTarget(f"opencode URL {base_url!r} has a dot segment ('.', '..') in its path")
    return Server((url.scheme, url.host, port), path)


# What a filled-in field may hold: an ID's characters ([A-Za-z0-9._-]) and what percent-encoding
# adds. Any other character of a template splits it where no field can reach.
_FIELD_CHARS = frozenset(string.ascii_letters + string.digits + "._-~%")
_FIELDS = ("workspace", "session")


def _pieces(template: str, what: str) -> list[str | tuple[str]]:
    """The template as its literal characters and its fields (a 1-tuple of the name);
    InvalidTarget for a field other than a plain ``{workspace}`` or ``{session}`` (a format
    spec, a conversion or an index could fold two workspaces into one)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:  # a lone brace
        raise InvalidTarget(f"{what} {template!r}: {exc}") from None
    pieces: list[str | tuple[str]] = []
    for literal, field, spec, conversion in parsed:
        pieces.extend(literal)
        if field is None:
            continue
        if field not in _FIELDS or spec or conversion:
            raise InvalidTarget(
                f"{what} {template!r}: only {{workspace}} and {{session}} may be filled in, plain"
            )
        pieces.append((field,))
    return pieces


def _names_the_workspace(*templates: list[str | tuple[str]]) -> bool:
    """Whether a filled-in target gives its workspace back, so that two workspaces never get
    one target. Split at the characters no field holds, the target is runs whose literal
    parts are fixed; a run holding one field not known yet gives it (its length, then its
    place), which may make the next run's field known, and so on."""
    runs: list[set[str]] = [set()]
    for pieces in templates:
        for piece in pieces:
            if isinstance(piece, tuple):
                runs[-1].add(piece[0])
            elif piece not in _FIELD_CHARS:
                runs.append(set())
        runs.append(set())  # the URL and the session ID are compared apart
    known: set[str] = set()
    while found := {f for run in runs if len(run - known) == 1 for f in run - known}:
        known |= found
    return "workspace" in known


def template_targets(
    base_url: str, session_template: str = "{session}", *, allow_shared_sessions: bool = False
) -> TargetResolver:
    """One URL template and one session-ID template, filled with ``{workspace}``/``{session}``
    (percent-encoded in the URL). ``template_targets("http://agents/{workspace}")`` maps our
    session to the opencode session of the same ID on the workspace's server.

    SharedTarget (an InvalidTarget) unless the templates keep workspaces apart (``{workspace}``
    in one, where the filled-in target gives it back) or ``allow_shared_sessions`` (one
    tenant, or tenants that may write into one another's agent sessions). InvalidTarget for a
    session template that cannot yield one path segment (``a/{session}``), a URL that is no
    server base, or a field other than a plain ``{workspace}`` or ``{session}``."""
    url_pieces = _pieces(base_url, "opencode URL template")
    session_pieces = _pieces(session_template, "opencode session template")
    server_of(base_url.format(workspace="w", session="s"))
    session_path(session_template.format(workspace="w", session="s"))
    if not allow_shared_sessions and not _names_the_workspace(url_pieces, session_pieces):
        raise SharedTarget(
            f"the opencode mapping URL {base_url!r}, session {session_template!r} lets two "
            "workspaces reach one opencode session (a tenant that learns another's session "
            "ID could write into it): put {workspace} in the URL (a server or proxy path per "
            "workspace) or the session template, or map each session in a targets file, or "
            f"allow it ({_ALLOW})"
        )

    def resolve(ws: str, ses: str) -> OpencodeTarget:
        try:  # IDs as the outbox takes them: what the check above reasons about
            check_id("workspace ID", ws)
            check_id("session ID", ses)
        except InvalidId as exc:
            raise InvalidTarget(str(exc)) from None
        target = OpencodeTarget(
            base_url.format(workspace=quote(ws, safe=""), session=quote(ses, safe="")),
            session_template.format(workspace=ws, session=ses),
        )
        session_path(target.session_id)
        return target

    return resolve


def _refuse_shared(table: Mapping[tuple[str, str], OpencodeTarget]) -> None:
    """SharedTarget naming the first two keys of different workspaces with one target (one
    server, however its URL is spelled, and one session ID)."""
    first: dict[tuple[Server, str], tuple[str, str]] = {}
    for key, target in table.items():
        seen = first.setdefault((server_of(target.base_url), target.session_id), key)
        if seen[0] != key[0]:
            raise SharedTarget(
                f"{'/'.join(seen)} and {'/'.join(key)} both name opencode session "
                f"{target.session_id!r} on {target.base_url}: two workspaces would share one "
                f"agent session (give each its own target, or allow it: {_ALLOW})"
            )


def static_targets(
    mapping: Mapping[tuple[str, str], OpencodeTarget], *, allow_shared_sessions: bool = False
) -> TargetResolver:
    """A fixed map of ``(workspace, session) -> target``; an unmapped session is an error.
    InvalidTarget here for a target whose session ID cannot be a path segment or whose URL is
    no server base; SharedTarget for two workspaces' keys naming one target (one server, one
    session) unless ``allow_shared_sessions``."""
    table = dict(mapping)
    for (ws, ses), target in table.items():
        try:
            session_path(target.session_id)
            server_of(target.base_url)
        except InvalidTarget as exc:
            raise InvalidTarget(f"the target of {ws}/{ses}: {exc}") from None
    if not allow_shared_sessions:
        _refuse_shared(table)

    def resolve(ws: str, ses: str) -> OpencodeTarget:
        try:
            return table[(ws, ses)]
        except KeyError:
            raise LookupError(f"no opencode target configured for {ws}/{ses}") from None

    return resolve


def load_targets(path: str, *, allow_shared_sessions: bool = False) -> TargetResolver:
    """Read a static map from JSON: ``{"<ws>/<ses>": {"url": ..., "session": ...}, ...}``
    (refused as ``static_targets`` refuses, naming the file)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested too deep
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object of '<ws>/<ses>' -> {{url, session}}")
    table: dict[tuple[str, str], OpencodeTarget] = {}
    for key, value in raw.items():
        ws, sep, ses = str(key).partition("/")
        if not sep or not isinstance(value, dict) or not {"url", "session"} <= value.keys():
            raise ValueError(f"{path}: bad entry {key!r}: want '<ws>/<ses>': {{url, session}}")
        table[(ws, ses)] = OpencodeTarget(str(value["url"]), str(value["session"]))
    try:
        return static_targets(table, allow_shared_sessions=allow_shared_sessions)
    except InvalidTarget as exc:
        raise type(exc)(f"{path}: {exc}") from None
