"""Bearer tokens, each scoped to a set of workspaces (or admin), from a JSON file or string,
and the route dependencies that check them (``Caller``, ``Admin``).

{"tokens": [{"token": "s3cret", "user": "alice", "workspaces": ["acme"]},
            {"token": "ops", "user": "ops", "admin": true}]}
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request

from ..core.errors import InvalidInput
from ..core.keys import check_id
from ..core.validate import MAX_USER_ID, check_user_id
from .errors import ApiError


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a token speaks for: the userID stamped on its accepts, and where it may act."""

    user_id: str
    workspaces: frozenset[str]
    admin: bool = False

    def may_use(self, workspace_id: str) -> bool:
        """May this token act on ``workspace_id``? Admin tokens may act on any."""
        return self.admin or workspace_id in self.workspaces


DEV_PRINCIPAL = Principal(user_id="dev", workspaces=frozenset(), admin=True)

MAX_TOKEN = 512
_TOKEN = re.compile(f"[!-~]{{1,{MAX_TOKEN}}}")  # visible ASCII: what a header value can carry
MAX_FILE_BYTES = 4 * 1024 * 1024
"""A token file's bound: read no more (tens of thousands of tokens fit)."""


class TokenTable:
    """Token -> Principal. ``disabled`` (loopback development only) lets every request in."""

    def __init__(self, principals: dict[str, Principal], *, disabled: bool = False) -> None:
        self.disabled = disabled
        # By the token's SHA-256: one dict lookup whatever the number of tokens (a loop of
        # compare_digest over 40 000 tokens cost 5 ms a request, without a token). The digest
        # of what the caller sent tells it nothing about the stored tokens' bytes.
        self._by_digest = {_digest(token): p for token, p in principals.items()}
        self._by_id = {token_id(token): p for token, p in principals.items()}
        self.ticket_key = hashlib.sha256(
            b"prompt-outbox stream tickets\x00"
            + b"\x00".join(sorted(t.encode() for t in principals))
        ).digest()
        """Signs stream tickets (api/tickets.py): derived from every token, so replicas that
        share the token file accept each other's tickets, and no one who holds fewer than all
        the tokens can forge one. A new token file voids the tickets out (they live a minute)."""

    def by_id(self, tid: str) -> Principal | None:
        """The Principal of the token whose ``token_id`` is ``tid`` (a stream ticket's)."""
        if self.disabled:
            return DEV_PRINCIPAL
        return self._by_id.get(tid)

    @classmethod
    def from_json(cls, text: str) -> TokenTable:
        """Parse the token file's JSON; raises ValueError saying what is wrong (nothing of
        the file in the message but row numbers: it holds secrets)."""
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError("token file is not JSON") from exc
        rows = doc.get("tokens") if isinstance(doc, dict) else None
        if not isinstance(rows, list):
            raise ValueError('token file needs {"tokens": [...]}')
        principals: dict[str, Principal] = {}
        for n, row in enumerate(rows):
            token = row.get("token") if isinstance(row, dict) else None
            if not isinstance(token, str) or not _TOKEN.fullmatch(token):
                raise ValueError(
                    f"tokens[{n}] needs a 'token' of 1-{MAX_TOKEN} visible ASCII characters "
                    "(what a Bearer header can carry)"
                )
            if token in principals:
                raise ValueError(f"tokens[{n}] repeats an earlier token")
            user, workspaces = row.get("user", ""), row.get("workspaces", [])
            if not isinstance(user, str) or not user or len(user) > MAX_USER_ID:
                raise ValueError(f"tokens[{n}] needs a 'user' of 1-{MAX_USER_ID} characters")
            if not isinstance(workspaces, list):
                raise ValueError(f"tokens[{n}].workspaces must be a list of workspace IDs")
            try:
                scope = frozenset(check_id("workspace ID", w) for w in workspaces)
                check_user_id(user)
            except InvalidInput as exc:
                raise ValueError(f"tokens[{n}]: {exc}") from None
            principals[token] = Principal(user, scope, admin=row.get("admin") is True)
        return cls(principals)

    @classmethod
    def from_file(cls, path: str | Path) -> TokenTable:
        """Read and parse the token file; raises ValueError saying what is wrong. A file over
        MAX_FILE_BYTES is refused before it is read."""
        with Path(path).open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"token file is over {MAX_FILE_BYTES} bytes")
        try:
            return cls.from_json(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError("token file is not UTF-8") from None

    def lookup(self, token: str) -> Principal | None:
        """The Principal of ``token``, or None if it is not in the table."""
        if self.disabled:
            return DEV_PRINCIPAL
        if not token:
            return None
        return self._by_digest.get(_digest(token))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def token_id(token: str) -> str:
    """A token's name in a stream ticket: not the token, which must not reach a URL."""
    return hashlib.sha256(token.encode()).hexdigest()[:24]


def bearer(authorization: str) -> str:
    """The token of an ``Authorization: Bearer ...`` header, or ''."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def principal(request: Request) -> Principal:
    """The caller's token, checked against the workspace in the path (401 / 403). Read from
    the raw path so that the route's declaration of ``ws`` (with its pattern) is the only one:
    auth is decided first, the ID checked after. ``async`` although it never awaits: FastAPI
    runs a plain ``def`` dependency in its threadpool, a thread hop per request."""
    tokens: TokenTable = request.app.state.tokens
    return authenticate(
        tokens, request.headers.get("authorization", ""), request.path_params.get("ws", "")
    )


def authenticate(tokens: TokenTable, authorization: str, ws: str | None) -> Principal:
    """The Principal of an ``Authorization`` header that may act on ``ws`` (any token, for
    None), or the refusal: 401 (no valid bearer token), 403 (not this workspace)."""
    found = tokens.lookup(bearer(authorization))
    if found is None:
        raise ApiError(401, "unauthorized", "a valid bearer token is required")
    if ws is not None and not found.may_use(ws):
        raise ApiError(403, "forbidden", f"this token may not use workspace {ws!r}")
    return found


Caller = Annotated[Principal, Depends(principal)]


async def anyone(request: Request) -> Principal:
    """Any valid token (401 otherwise), for a route that names no workspace and shows each
    token only its own (the workspaces listing)."""
    tokens: TokenTable = request.app.state.tokens
    return authenticate(tokens, request.headers.get("authorization", ""), None)


Anyone = Annotated[Principal, Depends(anyone)]


async def admin(caller: Caller) -> Principal:
    """Workspace-wide operator actions need an admin token (403 otherwise)."""
    if not caller.admin:
        raise ApiError(403, "forbidden", "this route needs an admin token")
    return caller


Admin = Annotated[Principal, Depends(admin)]
