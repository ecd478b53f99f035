"""Entries and contents several test modules write: models kept byte for byte, an error entry, the
whole keyspace."""

from __future__ import annotations

from prompt_outbox.core.keys import buckets
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.replies import text

MODELS = [
    "[]",
    "{}",
    '{"providerID":"anthropic","modelID":"claude","opts":[]}',
    # Numbers Lua's cjson would rewrite (1.5e+300, an integer past 2**53), kept as written.
    # (1e400, once here, is refused now: not finite JSON, validate.check_model.)
    '{"n":12345678901234567890123,"f":1.10,"e":1.5e300}',
    '{"deep":{"a":[{"b":[[],{}]}]}}',
    '{"name":"modèle ✓ 模型 🚀","esc":"\\u00e9\\n"}',
    '{ "spaced" : [ 1 ,\n 2 ] }',
    '"just a string"',
    "42",
]


def error_entry(entry_id: str) -> str:
    return (
        f'{{"id":"{entry_id}","clientMessageID":"{entry_id}","userID":"u","text":"t",'
        '"acceptedAt":"2026-12-01T00:00:00.000000Z","attempts":5,"status":"error"}'
    )


# The shared due-index buckets' keys: everything() leaves them out.
SHARED = {k for b in buckets() for k in b.script_keys()}


async def everything(client: Client) -> dict[str, bytes]:
    """Every key but the shared due-index buckets (a cluster marks them around any accept),
    with its serialised value."""
    out: dict[str, bytes] = {}
    async for key in client.scan_iter(count=1000):
        if text(key) not in SHARED:
            out[text(key)] = await client.dump(key)  # type: ignore[misc]
    return out
