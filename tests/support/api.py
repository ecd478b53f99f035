"""The HTTP API served by uvicorn on a loopback port over an Outbox, its test tokens, and a /metrics
parser."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from prompt_outbox import Outbox
from prompt_outbox.api import TokenTable, create_app
from prompt_outbox.embedded import free_port
from tests.support.waiting import eventually

TOKENS = TokenTable.from_json(
    json.dumps(
        {
            "tokens": [
                {"token": "alice-token", "user": "alice", "workspaces": ["acme"]},
                {"token": "bob-token", "user": "bob", "workspaces": ["other"]},
                {"token": "ops-token", "user": "ops", "admin": True},
            ]
        }
    )
)


ALICE = {"Authorization": "Bearer alice-token"}


JSON_BODY = {"Content-Type": "application/json"}


URL = "/v1/workspaces/acme/sessions/chat-1/prompts"


async def serve(
    outbox: Outbox, tokens: TokenTable = TOKENS, *, app: FastAPI | None = None, **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """``create_app(outbox, tokens, **options)`` (or ``app``, made by the caller) served on a
    loopback port; a client of it, for as long as the caller iterates."""
    port = free_port()
    app = app or create_app(outbox, tokens, **options)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    await eventually(lambda: _started(server))
    # Every body here is JSON, so the client says so (api/guard.py: 415 otherwise).
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=10, headers=JSON_BODY
    ) as http:
        yield http
    server.should_exit = True
    await task


async def _started(server: uvicorn.Server) -> bool:
    return server.started


OPS = {"Authorization": "Bearer ops-token"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
