"""The webhook signature, scheme v2 (docs/security.md, finding 6): it covers the timestamp, the
workspace, the session, the entry ID and the body, and ``verify_signature`` refuses anything else
with a WebhookSignatureError naming what failed. No server: the helper is pure; the deliverer's
real deliveries are checked in tests/test_webhook.py."""

from __future__ import annotations

import hashlib
import hmac
from email.message import Message

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prompt_outbox.deliver import sign as deliver_sign
from prompt_outbox.webhook import (
    ENTRY_ID_HEADER,
    SESSION_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TURN_END_DOMAIN,
    TURN_END_ROUTE,
    WORKSPACE_HEADER,
    SignedDelivery,
    WebhookSignatureError,
    sign,
    sign_turn_end,
    signed_bytes,
    turn_end_bytes,
    turn_end_headers,
    turn_end_path,
    verify_signature,
    verify_turn_end,
)

SECRET = b"receiver-secret"
T = 1_700_000_000
BODY = b'{"id":"e1","text":"h\xc3\xa9llo"}'
VECTOR = "v2=edfd1249c993b3660ae338ee41fd6c72396f332d223bf8d6130d9d0c1bf21290"
"""The signature of BODY at T for acme/chat-1/e1 under SECRET: the TypeScript client's
test (clients/typescript/test/webhook.test.mjs) checks the same vector."""


def headers(ws: str = "acme", ses: str = "chat-1", entry_id: str = "e1") -> dict[str, str]:
    """A delivery's headers, as the deliverer sends them for BODY at T."""
    signature = sign(SECRET, timestamp=T, workspace=ws, session=ses, entry_id=entry_id, body=BODY)
    return {
        ENTRY_ID_HEADER: entry_id,
        TIMESTAMP_HEADER: str(T),
        SIGNATURE_HEADER: signature,
        WORKSPACE_HEADER: ws,
        SESSION_HEADER: ses,
    }


def refused(code: str, hdrs: object, body: bytes = BODY, **kw: float) -> WebhookSignatureError:
    with pytest.raises(WebhookSignatureError) as caught:
        verify_signature(SECRET, hdrs, body, now=kw.pop("now", T), **kw)  # type: ignore[arg-type]
    assert caught.value.code == code, caught.value
    return caught.value


def test_the_scheme_is_the_documented_canonical_string() -> None:
    # Spelled out by hand: another language's receiver (the TypeScript client's test uses this
    # same vector) reproduces exactly this.
    message = b"v2\n1700000000\nacme\nchat-1\ne1\n" + BODY
    assert signed_bytes(str(T), "acme", "chat-1", "e1", BODY) == message
    want = "v2=" + hmac.new(SECRET, message, hashlib.sha256).hexdigest()
    assert headers()[SIGNATURE_HEADER] == want == VECTOR
    assert deliver_sign is sign  # prompt_outbox.deliver names the one scheme, not a copy


def test_a_good_delivery_verifies_and_says_what_it_covers() -> None:
    got = verify_signature(SECRET, headers(), BODY, now=T)
    assert got == SignedDelivery("acme", "chat-1", "e1", T)
    # A str secret is its UTF-8 (the CLI reads it from the environment); names any case.
    lower = {k.lower(): v for k, v in headers().items()}
    assert verify_signature(SECRET.decode(), lower, BODY, now=T) == got


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (WORKSPACE_HEADER, "other-tenant"),  # the finding: replayed to another workspace
        (SESSION_HEADER, "chat-2"),  # ... or to another session
        (ENTRY_ID_HEADER, "e2"),  # ... or as another entry (the receiver dedupes by it)
        (TIMESTAMP_HEADER, str(T + 1)),  # a fresh timestamp on a captured delivery
    ],
)
def test_a_captured_delivery_with_a_signed_header_changed_is_refused(
    header: str, value: str
) -> None:
    tampered = headers() | {header: value}
    refused("bad_signature", tampered, now=T + 1)


def test_a_changed_body_is_refused() -> None:
    refused("bad_signature", headers(), BODY.replace(b"h", b"H"))
    refused("bad_signature", headers(), BODY + b" ")


def test_another_secret_is_refused() -> None:
    with pytest.raises(WebhookSignatureError) as caught:
        verify_signature(b"another-secret", headers(), BODY, now=T)
    assert caught.value.code == "bad_signature"


def test_the_timestamp_must_be_within_the_tolerance_either_way() -> None:
    assert verify_signature(SECRET, headers(), BODY, now=T + 300).timestamp == T
    assert verify_signature(SECRET, headers(), BODY, now=T - 300).timestamp == T
    refused("stale_timestamp", headers(), now=T + 301)  # a replay, past the window
    refused("stale_timestamp", headers(), now=T - 301)  # from the future: a skewed clock
    refused("stale_timestamp", headers(), now=T + 11, tolerance=10)
    assert verify_signature(SECRET, headers(), BODY, now=T + 3600, tolerance=3600)


def test_bad_arguments_are_the_callers_bug_not_a_refused_delivery() -> None:
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="tolerance"):
            verify_signature(SECRET, headers(), BODY, tolerance=bad)
    with pytest.raises(ValueError, match="now"):
        verify_signature(SECRET, headers(), BODY, now=float("nan"))  # would pass any window
    with pytest.raises(ValueError, match="empty secret"):
        verify_signature(b"", headers(), BODY, now=T)


@pytest.mark.parametrize(
    "header",
    [SIGNATURE_HEADER, TIMESTAMP_HEADER, WORKSPACE_HEADER, SESSION_HEADER, ENTRY_ID_HEADER],
)
def test_a_missing_header_is_named(header: str) -> None:
    hdrs = headers()
    del hdrs[header]
    assert header in str(refused("missing_header", hdrs))


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (TIMESTAMP_HEADER, "17e8"),
        (TIMESTAMP_HEADER, "-1"),
        (TIMESTAMP_HEADER, " 1700000000"),
        (TIMESTAMP_HEADER, "9" * 5000),  # int() of it would raise its own ValueError
        (TIMESTAMP_HEADER, "\u0661" + "\u0660" * 9),  # Unicode digits int() would take
        (WORKSPACE_HEADER, "acme\nchat-1"),  # a newline would make the string ambiguous
        (WORKSPACE_HEADER, "{acme}"),
        (SESSION_HEADER, ""),
        (ENTRY_ID_HEADER, "e" * 129),
    ],
)
def test_a_malformed_header_is_refused(header: str, value: str) -> None:
    refused("malformed_header", headers() | {header: value})


@pytest.mark.parametrize(
    "signature",
    [
        "v2=",
        "v2=abc",  # too short
        "v2=" + "0" * 66,  # too long
        "v2=" + "g" * 64,  # not hex
        "v2=" + "é" * 64,  # not ASCII: compare_digest on str would raise TypeError
        "v2=" + "\u0660" * 64,
        "v2=" + "0" * 64,  # well-formed, wrong
        "sha256=" + "0" * 64,  # the old scheme: no v2 signature at all
        "",
        "v2",
        "=" * 10,
        "v2=" + "0" * 64 + "\x00",
    ],
)
def test_a_bad_signature_value_is_refused_cleanly(signature: str) -> None:
    refused("bad_signature", headers() | {SIGNATURE_HEADER: signature})


def test_the_old_sha256_signature_no_longer_verifies() -> None:
    old = hmac.new(SECRET, str(T).encode() + b"." + BODY, hashlib.sha256).hexdigest()
    assert "holds no v2=" in str(
        refused("bad_signature", headers() | {SIGNATURE_HEADER: "sha256=" + old})
    )


def test_several_signatures_one_of_them_good() -> None:
    good = headers()[SIGNATURE_HEADER]
    for value in (
        f"sha256=00 {good}",
        f"v2={'0' * 64} {good}",
        f"{good} v3=zz",
        "v2=" + good[3:].upper(),
    ):
        assert verify_signature(SECRET, headers() | {SIGNATURE_HEADER: value}, BODY, now=T)
    refused("bad_signature", headers() | {SIGNATURE_HEADER: "V2=" + good[3:]})  # case-sensitive


def test_a_signed_header_sent_twice_is_refused() -> None:
    # http.server's headers keep both copies; the receiver's code might read the other one.
    message = Message()
    for name, value in headers().items():
        message[name] = value
    assert verify_signature(SECRET, message, BODY, now=T)  # type: ignore[arg-type]
    message[WORKSPACE_HEADER] = "other-tenant"
    refused("malformed_header", message)
    pairs = [*headers().items(), ("x-prompt-outbox-session", "chat-1")]
    refused("malformed_header", _Pairs(pairs))
    # httpx's Headers (and fetch's, and node's) join the copies with ", " instead.
    good = headers()[SIGNATURE_HEADER]
    refused("malformed_header", headers() | {SIGNATURE_HEADER: f"v2={'0' * 64}, {good}"})
    refused("malformed_header", headers() | {WORKSPACE_HEADER: "other-tenant, acme"})


class _Pairs:
    """Headers as a list of pairs, duplicates kept (Starlette's ``Headers.items()``)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def items(self) -> list[tuple[str, str]]:
        return self.pairs


def test_signing_refuses_what_would_make_the_string_ambiguous() -> None:
    with pytest.raises(ValueError):
        sign(SECRET, timestamp=T, workspace="a\nb", session="c", entry_id="e", body=b"")
    with pytest.raises(ValueError):
        signed_bytes("12.5", "a", "b", "e", b"")


header_values = st.text(max_size=80) | st.sampled_from(["acme", "chat-1", "e1", str(T)])


@given(
    ws=header_values,
    ses=header_values,
    entry_id=header_values,
    stamp=header_values,
    signature=st.text(max_size=140) | st.just(headers()[SIGNATURE_HEADER]),
    body=st.binary(max_size=64) | st.just(BODY),
)
def test_hostile_headers_give_only_the_typed_error(
    ws: str, ses: str, entry_id: str, stamp: str, signature: str, body: bytes
) -> None:
    hdrs = {
        WORKSPACE_HEADER: ws,
        SESSION_HEADER: ses,
        ENTRY_ID_HEADER: entry_id,
        TIMESTAMP_HEADER: stamp,
        SIGNATURE_HEADER: signature,
    }
    try:
        got = verify_signature(SECRET, hdrs, body, now=T)
    except WebhookSignatureError:
        return
    # It verified: then it is the genuine delivery, byte for byte.
    assert (got, body) == (SignedDelivery("acme", "chat-1", "e1", T), BODY)
    assert hdrs == headers()


# A turn end: a receiver ends a turn it handed back by signing the end with the webhook secret,
# over a string of its own domain.

TURN = "turn/1 \u00e9"  # any printable characters: a '/', a space, non-ASCII
TURN_VECTOR = "v2=79270cb04fb7628a590286dd29a357b6b9336a233a516bc146a397cef1d91c12"
"""The signature of ending TURN of acme/chat-1 at T under SECRET: the TypeScript client's
test (clients/typescript/test/webhook.test.mjs) checks the same vector."""


def end_headers(ws: str = "acme", ses: str = "chat-1", turn: str = TURN) -> dict[str, str]:
    return turn_end_headers(SECRET, ws, ses, turn, now=T)


def end_refused(code: str, hdrs: object, ws: str = "acme", ses: str = "chat-1", turn: str = TURN,
                **kw: float) -> None:  # fmt: skip
    with pytest.raises(WebhookSignatureError) as caught:
        verify_turn_end(SECRET, hdrs, ws, ses, turn, now=kw.pop("now", T), **kw)  # type: ignore[arg-type]
    assert caught.value.code == code, caught.value


def test_a_turn_end_signs_its_own_canonical_string() -> None:
    message = b"v2-turn-end\n1700000000\nacme\nchat-1\nturn/1 \xc3\xa9"
    assert turn_end_bytes(str(T), "acme", "chat-1", TURN) == message
    want = "v2=" + hmac.new(SECRET, message, hashlib.sha256).hexdigest()
    assert (
        sign_turn_end(SECRET, timestamp=T, workspace="acme", session="chat-1", turn_id=TURN) == want
    )
    assert end_headers() == {TIMESTAMP_HEADER: str(T), SIGNATURE_HEADER: TURN_VECTOR}
    assert want == TURN_VECTOR and TURN_END_DOMAIN == "v2-turn-end"
    assert verify_turn_end(SECRET, end_headers(), "acme", "chat-1", TURN, now=T) == T
    assert verify_turn_end(SECRET.decode(), end_headers(), "acme", "chat-1", TURN, now=T + 300)


@pytest.mark.parametrize("body", [b"", BODY])
def test_a_captured_delivery_signature_never_verifies_as_a_turn_end(body: bytes) -> None:
    """A delivery for entry e1 with its timestamp and signature, replayed as the end of a turn
    named e1 (a turn named by its entry ID), to the same workspace and session: refused, as is
    the reverse (an end's signature passed off as a delivery with an empty body)."""
    signature = sign(SECRET, timestamp=T, workspace="acme", session="chat-1", entry_id="e1",
                     body=body)  # fmt: skip
    captured = {TIMESTAMP_HEADER: str(T), SIGNATURE_HEADER: signature}
    end_refused("bad_signature", captured, turn="e1")
    end = end_headers(turn="e1")
    as_delivery = headers() | end
    refused("bad_signature", as_delivery, b"")


@pytest.mark.parametrize(
    ("ws", "ses", "turn"),
    [("other", "chat-1", TURN), ("acme", "chat-2", TURN), ("acme", "chat-1", "turn/2 \u00e9")],
)
def test_an_end_is_bound_to_its_workspace_session_and_turn(ws: str, ses: str, turn: str) -> None:
    end_refused("bad_signature", end_headers(), ws, ses, turn)


def test_an_end_is_refused_past_the_tolerance_with_another_secret_or_headers_off() -> None:
    end_refused("stale_timestamp", end_headers(), now=T + 301)  # replayed past the window
    end_refused("stale_timestamp", end_headers(), now=T - 301)
    with pytest.raises(WebhookSignatureError) as caught:
        verify_turn_end(b"other", end_headers(), "acme", "chat-1", TURN, now=T)
    assert caught.value.code == "bad_signature"
    for name in (TIMESTAMP_HEADER, SIGNATURE_HEADER):
        hdrs = end_headers()
        del hdrs[name]
        end_refused("missing_header", hdrs)
    end_refused("malformed_header", _Pairs([*end_headers().items(), (SIGNATURE_HEADER, "v2=0")]))
    end_refused("malformed_header", end_headers() | {TIMESTAMP_HEADER: "17e8"})
    end_refused("bad_signature", end_headers() | {SIGNATURE_HEADER: "v2=" + "0" * 64})


def test_the_end_path_percent_encodes_the_turn_id() -> None:
    path = turn_end_path("acme", "chat-1", "a/b?c=d%e f#\u00e9")
    assert path == "/v1/workspaces/acme/sessions/chat-1/turns/a%2Fb%3Fc%3Dd%25e%20f%23%C3%A9/end"
    assert (
        TURN_END_ROUTE.format(ws="w", ses="s", turn="t")
        == "/v1/workspaces/w/sessions/s/turns/t/end"
    )
    for bad in ("", "t" * 201, "a\nb", "a\x00"):
        with pytest.raises(ValueError):
            turn_end_path("acme", "chat-1", bad)
        with pytest.raises(ValueError):
            turn_end_bytes(str(T), "acme", "chat-1", bad)
    with pytest.raises(ValueError):
        turn_end_path("ac/me", "chat-1", "t")
    with pytest.raises(ValueError, match="empty secret"):
        turn_end_headers(b"", "acme", "chat-1", "t")


turn_ids = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=20)


@given(a=turn_ids, b=turn_ids)
def test_an_end_for_one_turn_never_verifies_for_another(a: str, b: str) -> None:
    if not (a.isprintable() and b.isprintable()) or a == b:
        return
    end_refused("bad_signature", end_headers(turn=a), turn=b)
