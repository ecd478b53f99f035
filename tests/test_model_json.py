"""What a client may put in a model (docs/security.md, finding 7), in the library and through the
HTTP API on a real loopback port: only finite JSON (what a browser's JSON.parse reads as it was
written, and JSON.stringify writes back the same), and entries stored before that rule listed, and
sent over SSE, as JSON all the same."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from prompt_outbox import Outbox
from prompt_outbox.core.errors import InvalidInput
from prompt_outbox.core.validate import check_model
from tests.support.api import ALICE, URL
from tests.support.events import EVENTS, SpecSse

JSON = {**ALICE, "Content-Type": "application/json"}

NOT_FINITE = [
    "NaN",
    "Infinity",
    "-Infinity",
    '{"temperature":NaN}',
    "[1,[2,-Infinity]]",
    "1e999",  # JSON.parse: Infinity; JSON.stringify writes it back as null
    "-1e400",
    '{"n":' + "9" * 400 + "}",  # an integer past a double's range: Infinity too
]
FINITE = [
    '"anthropic/claude"',
    "1.7976931348623157e308",  # the largest double
    "12345678901234567890",  # exact only as text, but finite: kept byte for byte
    '{"a":\n1,\r\n"b":[2,\r3]}',  # JSON whitespace holding line breaks: still JSON
    "-0.0",
]


def strict_json(text: str) -> Any:
    """Parse as JSON.parse would, refusing what it would read otherwise than written: NaN and
    Infinity (not JSON), and numbers it would turn into Infinity."""

    def finite(number: str) -> float:
        value = float(number)
        assert value not in (float("inf"), float("-inf")), f"{number} overflows a double"
        return value

    def constant(name: str) -> Any:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=constant, parse_float=finite, parse_int=finite)


@pytest.mark.parametrize("model", NOT_FINITE)
def test_a_model_must_be_finite_json(model: str) -> None:
    with pytest.raises(InvalidInput, match="finite JSON"):
        check_model(model)


@pytest.mark.parametrize("model", FINITE)
def test_finite_models_are_kept_byte_for_byte(model: str) -> None:
    assert check_model(model) == model


async def test_accept_and_edit_refuse_a_model_that_is_not_finite(outbox: Outbox) -> None:
    for model in NOT_FINITE:
        with pytest.raises(InvalidInput):
            await outbox.accept("acme", "s1", "u", "c1", "hi", model=model)
    assert await outbox.list("acme", "s1") == []  # nothing half-written
    entry = await outbox.accept("acme", "s1", "u", "c1", "hi", model='"a/b"')
    for model in NOT_FINITE:
        with pytest.raises(InvalidInput):
            await outbox.edit("acme", "s1", entry.id, model=model)
    [kept] = await outbox.list("acme", "s1")
    assert kept.model == '"a/b"'


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ('{"clientMessageID":"m1","text":"hi","model":NaN}', "invalid_json"),
        ('{"clientMessageID":"m1","text":"hi","model":{"t":-Infinity}}', "invalid_json"),
        ('{"clientMessageID":"m1","text":"hi","model":1e999}', "invalid_input"),
        ('{"clientMessageID":"m1","text":"hi","model":[' + "1" * 400 + "]}", "invalid_input"),
        # Not only the model: NaN is not JSON wherever it stands.
        ('{"clientMessageID":"m1","text":NaN}', "invalid_json"),
        ('{"clientMessageID":"m1","text":"hi","extra":Infinity}', "invalid_json"),
    ],
)
async def test_the_http_accept_refuses_what_is_not_finite_json(
    http: httpx.AsyncClient, body: str, code: str
) -> None:
    r = await http.post(URL, content=body, headers=JSON)
    assert (r.status_code, r.json()["error"]) == (400, code), r.text
    listed = await http.get(URL, headers=ALICE)
    assert listed.json() == {"entries": []}


async def test_the_http_edit_refuses_a_model_that_is_not_finite_json(
    http: httpx.AsyncClient,
) -> None:
    body = '{"clientMessageID":"m1","text":"hi","model":"a/b"}'
    entry_id = (await http.post(URL, content=body, headers=JSON)).json()["id"]
    for model, code in (("NaN", "invalid_json"), ("1e999", "invalid_input")):
        r = await http.patch(f"{URL}/{entry_id}", content='{"model":' + model + "}", headers=JSON)
        assert (r.status_code, r.json()["error"]) == (400, code), r.text
    listed = strict_json((await http.get(URL, headers=ALICE)).text)
    assert [e["model"] for e in listed["entries"]] == ["a/b"]


def _stored(entry_id: str, model: str) -> str:
    return (
        f'{{"id":"{entry_id}","clientMessageID":"{entry_id}","userID":"u","text":"old",'
        f'"model":{model},"acceptedAt":"2026-01-02T03:04:05Z","attempts":0,"status":"pending"}}'
    )


async def test_entries_stored_before_the_rule_are_listed_as_json(
    http: httpx.AsyncClient, outbox: Outbox
) -> None:
    """An entry written before accept refused such models keeps its raw text, as a JSON
    string: its List and its events stay JSON every parser reads (they were `"model":NaN`)."""
    for entry_id, model in (("e1", "NaN"), ("e2", '{"t":-Infinity}'), ("e3", "1e999")):
        await outbox.seed_entry_for_test("acme", "chat-1", _stored(entry_id, model))
    await outbox.seed_entry_for_test("acme", "chat-1", _stored("e4", '{"a":\n1}'))
    want = ["NaN", '{"t":-Infinity}', "1e999", {"a": 1}]
    listed = strict_json((await http.get(URL, headers=ALICE)).text)
    assert [e["model"] for e in listed["entries"]] == want
    async with http.stream("GET", EVENTS, headers=ALICE) as r:
        reset = await SpecSse(r).next()
    assert reset is not None and reset["event"] == "queue.reset"
    assert [e["model"] for e in strict_json(reset["data"])["entries"]] == want
    [first, *_] = await outbox.list("acme", "chat-1")
    assert first.model == '"NaN"'  # what a deliverer gets too: a webhook body stays JSON
