"""docs/api.md's route table names every route of the OpenAPI document and no other, so the
reference cannot drift from the code silently. The committed ``openapi.json`` is the code's
(tests/test_ts_client.py holds it equal to what ``create_app`` serves)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "api.md").read_text()
SESSION = "/v1/workspaces/{ws}/sessions/{ses}"


def documented(doc: str) -> set[tuple[str, str]]:
    """The (method, path) pairs the page's route table names, its ``...`` abbreviation (a
    session's routes, or a workspace's when what follows starts at ``/sessions/``) spelled out
    and query strings dropped."""
    routes = set()
    for method, path in re.findall(r"`(GET|POST|PUT|PATCH|DELETE) ([^`\s?]+)", doc):
        if path.startswith("..."):
            rest = path[3:]
            path = ("/v1/workspaces/{ws}" if rest.startswith("/sessions/") else SESSION) + rest
        routes.add((method, path.replace("{id}", "{entry_id}")))
    return routes


def test_the_route_table_names_every_route_and_no_other() -> None:
    spec = json.loads((ROOT / "clients" / "typescript" / "openapi.json").read_text())
    routes = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    # The page and its redirects are out of the OpenAPI on purpose (api/ui.py).
    assert documented(DOC) - routes == set()
    assert routes - documented(DOC) == set()


def test_the_abbreviation_is_read_as_the_page_means_it() -> None:
    doc = "`GET .../prompts` `POST .../sessions/{ses}/turns/{turn}/end` `GET /v1/x?limit=2`"
    assert documented(doc) == {
        ("GET", SESSION + "/prompts"),
        ("POST", SESSION + "/turns/{turn}/end"),
        ("GET", "/v1/x"),
    }
