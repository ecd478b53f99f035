"""Lone surrogates (U+D800-U+DFFF alone) are refused in every string a client, a token file or an
operator hands in, by one rule (``core.validate.check_unicode``): no UTF-8 text can carry one, so
a strict receiver would refuse every delivery of an entry that held one. Over HTTP (a real
loopback port, a real Valkey) each is a 400 whose JSON body names the field, and nothing is
written; in the library an InvalidInput; on the command line a usage error (exit 2).

Only a JSON body can bring one over HTTP (a ``\\udfff`` escape): the server decodes a path's or a
query's percent-escapes that are not UTF-8 as U+FFFD, and a header's bytes as Latin-1."""

from __future__ import annotations

import json

import httpx
import pytest
import valkey.asyncio as valkey_async
from click.testing import CliRunner

from prompt_outbox import Outbox
from prompt_outbox.api import TokenTable
from prompt_outbox.cli import main
from prompt_outbox.core.errors import InvalidInput
from prompt_outbox.core.validate import check_unicode
from tests.support.api import ALICE, OPS, URL

LONE = "\udfff"
ESCAPED = "\\udfff"  # as a JSON body carries it: six ASCII characters
NOT_UTF8 = "\udcff"  # what the byte 0xff of argv or the environment decodes to


async def _written(client: valkey_async.Valkey) -> list[bytes]:
    return sorted([k async for k in client.scan_iter()])


def _refused(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"] and field in body["detail"] and "surrogate" in body["detail"], body


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("text", f'{{"clientMessageID": "c1", "text": "a {ESCAPED} b"}}'),
        ("model", f'{{"clientMessageID": "c1", "text": "x", "model": "{ESCAPED}"}}'),
        ("model", f'{{"clientMessageID": "c1", "text": "x", "model": {{"id": "{ESCAPED}"}}}}'),
        ("model", f'{{"clientMessageID": "c1", "text": "x", "model": {{"{ESCAPED}": 1}}}}'),
        (
            "model",
            '{"clientMessageID": "c1", "text": "x", "model": [{"a": [1, "\\ud800"]}]}',
        ),
        ("clientMessageID", f'{{"clientMessageID": "{ESCAPED}", "text": "x"}}'),
        ("whileBusy", f'{{"clientMessageID": "c1", "text": "x", "whileBusy": "{ESCAPED}"}}'),
    ],
)
async def test_an_accept_holding_one_is_a_400_naming_the_field(
    http: httpx.AsyncClient, outbox: Outbox, client: valkey_async.Valkey, field: str, body: str
) -> None:
    await outbox.accept("acme", "other", "u", "c0", "x")  # the store as it stands
    before = await _written(client)
    r = await http.post(URL, content=body, headers=ALICE)
    if field in ("clientMessageID", "whileBusy"):  # their own rules (visible ASCII, a word)
        assert r.status_code == 400 and field in r.json()["detail"], r.text
    else:
        _refused(r, field)
    assert await _written(client) == before


async def test_an_edit_holding_one_is_a_400_naming_the_field(
    http: httpx.AsyncClient, outbox: Outbox, client: valkey_async.Valkey
) -> None:
    entry = await outbox.accept("acme", "chat-1", "u", "c1", "before", '{"m": 1}')
    before = await _written(client)
    url = f"{URL}/{entry.id}"
    for field, body in (
        ("text", f'{{"text": "{ESCAPED}"}}'),
        ("model", f'{{"model": {{"m": "{ESCAPED}"}}}}'),
        ("model", f'{{"model": {{"{ESCAPED}": 1}}}}'),
    ):
        _refused(await http.patch(url, content=body, headers=ALICE), field)
    assert await _written(client) == before
    [kept] = await outbox.list("acme", "chat-1")
    assert (kept.text, kept.model) == ("before", '{"m": 1}')


async def test_a_park_reason_holding_one_is_a_400_naming_it(
    http: httpx.AsyncClient, outbox: Outbox, client: valkey_async.Valkey
) -> None:
    await outbox.accept("acme", "chat-1", "u", "c1", "x")
    before = await _written(client)
    r = await http.post(
        "/v1/workspaces/acme/park", content=f'{{"reason": "down {ESCAPED}"}}', headers=OPS
    )
    _refused(r, "reason")
    assert await _written(client) == before
    with pytest.raises(InvalidInput, match="park reason"):
        await outbox.park_workspace("acme", LONE)
    assert await _written(client) == before
    [entry] = await outbox.list("acme", "chat-1")
    assert str(entry.status) == "pending"


async def test_the_transport_never_hands_one_in_a_path_query_or_header(
    http: httpx.AsyncClient,
) -> None:
    # %ED%B3%BF is U+DCFF's would-be UTF-8: the server decodes it as U+FFFD (a character), so
    # what reaches a route is text, refused by the route's own rule, never a 500.
    turn = "/v1/workspaces/acme/sessions/chat-1/turns/%ED%B3%BF/end"
    r = await http.post(turn, headers=ALICE)
    assert (r.status_code, r.json()["error"]) == (404, "turn_not_found")
    events = "/v1/workspaces/acme/sessions/chat-1/events"
    r = await http.get(events + "?lastEventId=%ED%B3%BF", headers=ALICE)
    assert r.status_code == 400, r.text
    r = await http.get(events, headers={**ALICE, "Last-Event-ID": b"\xed\xb3\xbf"})
    assert r.status_code == 400, r.text
    r = await http.get(events + "?ticket=%ED%B3%BF")
    assert r.status_code == 401, r.text


async def test_the_library_refuses_one_in_every_field(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    cases = {
        "text": lambda: outbox.accept("acme", "s", "u", "c1", LONE),
        "model": lambda: outbox.accept("acme", "s", "u", "c1", "x", f'{{"a": "{ESCAPED}"}}'),
        "userID": lambda: outbox.accept("acme", "s", LONE, "c1", "x"),
        "turn ID": lambda: outbox.end_turn("acme", "s", f"t{LONE}"),
    }
    for field, call in cases.items():
        with pytest.raises(InvalidInput, match=field):
            await call()
    entry = await outbox.accept("acme", "s", "u", "c1", "x")
    before = await _written(client)
    for edit in ({"text": LONE}, {"model": f'["{ESCAPED}"]'}):
        with pytest.raises(InvalidInput, match="surrogate"):
            await outbox.edit("acme", "s", entry.id, **edit)
    assert await _written(client) == before


def test_the_rule_reads_every_string_and_key_of_parsed_json() -> None:
    good = {"a": ["b", {"c": 1.5, "d": None}], "é": "𐀀"}
    assert check_unicode("model", good) is good
    for bad in (LONE, [1, ["x", LONE]], {LONE: 1}, {"a": {"b": [LONE]}}):
        with pytest.raises(InvalidInput, match=r"^model is not valid Unicode"):
            check_unicode("model", bad)


def test_a_token_file_user_holding_one_is_refused() -> None:
    row = {"token": "t0k3n", "user": f"al{LONE}ce", "workspaces": ["acme"]}
    with pytest.raises(ValueError, match=r"tokens\[0\].*userID is not valid Unicode"):
        TokenTable.from_json(json.dumps({"tokens": [row]}))


def test_an_operator_argument_holding_one_is_a_usage_error(server_url: str) -> None:
    # A byte that is not UTF-8 on the command line comes as a lone surrogate (surrogateescape).
    done = CliRunner().invoke(
        main, ["park", "acme", "--reason", f"r{NOT_UTF8}", "--valkey-url", server_url]
    )
    assert done.exit_code == 2, done.output
    assert "reason" in done.output and "surrogate" in done.output


@pytest.mark.parametrize(
    ("deliverer", "variable"),
    [
        (["--webhook-url", "http://127.0.0.1:9/hook"], "PROMPT_OUTBOX_WEBHOOK_SECRET"),
        (["--opencode-url", "http://127.0.0.1:9/{workspace}"], "OPENCODE_SERVER_PASSWORD"),
    ],
)
def test_a_deliverer_secret_holding_one_is_a_usage_error(
    deliverer: list[str], variable: str
) -> None:
    # (A Valkey nobody listens on: were the variable taken, serve would stop there, exit 1.)
    args = ["serve", "--no-auth", "--valkey-url", "valkey://127.0.0.1:1", *deliverer]
    done = CliRunner().invoke(main, args, env={variable: f"s{NOT_UTF8}"})
    assert done.exit_code == 2, done.output
    assert variable in done.output and "surrogate" in done.output
