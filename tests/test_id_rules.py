"""What a client may use as an ID (docs/security.md, finding 8), in the library and through the
HTTP API on a real loopback port: 1-128 characters of [A-Za-z0-9._-], never only dots (a path
segment a URL normaliser removes), and the OpenAPI saying the same as check_id."""

from __future__ import annotations

import re

import httpx
import pytest

from prompt_outbox.core.errors import InvalidId
from prompt_outbox.core.keys import ID_PATTERN, MAX_ID_LENGTH, check_id, session_keys

OPS = {"Authorization": "Bearer ops-token"}  # an admin token: any workspace, even ".."


@pytest.mark.parametrize("bad", [".", "..", "...", "a" * (MAX_ID_LENGTH + 1), "a/b", "a b", ""])
def test_ids_of_only_dots_or_past_the_length_are_refused(bad: str) -> None:
    with pytest.raises(InvalidId, match="not only dots"):
        check_id("session ID", bad)
    with pytest.raises(InvalidId):
        session_keys("acme", bad)
    with pytest.raises(InvalidId):
        session_keys(bad, "s1")


@pytest.mark.parametrize("good", ["a", "a.b", ".a", "a.", "..a", "-", "_", "a" * MAX_ID_LENGTH])
def test_ids_with_a_character_besides_dots_are_taken(good: str) -> None:
    assert check_id("session ID", good) == good


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/workspaces/acme/sessions/%2E%2E/prompts"),
        ("POST", "/v1/workspaces/acme/sessions/%2E/prompts"),  # the fast accept path
        ("GET", "/v1/workspaces/acme/sessions/..%2E/events"),
        ("PATCH", "/v1/workspaces/acme/sessions/chat-1/prompts/%2E%2E"),
        ("GET", "/v1/workspaces/%2E%2E/sessions/chat-1/prompts"),
        ("GET", f"/v1/workspaces/acme/sessions/{'a' * (MAX_ID_LENGTH + 1)}/prompts"),
    ],
)
async def test_the_http_api_refuses_dots_ids(
    http: httpx.AsyncClient, method: str, path: str
) -> None:
    body = '{"clientMessageID":"m1","text":"hi"}' if method != "GET" else None
    headers = {**OPS, "Content-Type": "application/json"} if body else OPS  # any workspace
    r = await http.request(method, path, content=body, headers=headers)
    assert (r.status_code, r.json()["error"]) == (400, "invalid_id"), r.text


async def test_the_openapi_declares_the_same_id_rule(http: httpx.AsyncClient) -> None:
    """The schema a generator (schemathesis, a client's types) reads says what check_id does:
    a pattern that still admitted "." would be a mismatch for it to find."""
    doc = (await http.get("/openapi.json")).json()
    declared = [
        param["schema"]
        for op in doc["paths"].values()
        for spec in op.values()
        for param in spec.get("parameters", [])
        # A turn ID is the agent's, not ours: any printable characters (api/turns.py).
        if param["in"] == "path" and param["name"] != "turn"
    ]
    assert declared, "no path parameter declared"
    assert all(s == {**s, "pattern": ID_PATTERN, "maxLength": MAX_ID_LENGTH} for s in declared)
    for value in (".", "..", "...."):
        assert re.search(ID_PATTERN, value) is None
    for value in ("a", ".a", "a..b"):
        assert re.search(ID_PATTERN, value)
