"""Public import path for webhook receivers (docs/deliverers.md): check a delivery's
signature with ``verify_signature``; end a turn handed back (a 202 with ``{"turn": id}``) by
POSTing ``turn_end_headers(...)`` to ``turn_end_path(...)`` on the API. The code lives in
``prompt_outbox.core.signature``, which the webhook deliverer signs with and the API's end
route checks with (``verify_turn_end``)."""

from .core.signature import (
    DEFAULT_TOLERANCE,
    ENTRY_ID_HEADER,
    SCHEME,
    SESSION_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TURN_END_DOMAIN,
    TURN_END_ROUTE,
    WORKSPACE_HEADER,
    HeaderSource,
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

__all__ = [
    "DEFAULT_TOLERANCE",
    "ENTRY_ID_HEADER",
    "SCHEME",
    "SESSION_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "TURN_END_DOMAIN",
    "TURN_END_ROUTE",
    "WORKSPACE_HEADER",
    "HeaderSource",
    "SignedDelivery",
    "WebhookSignatureError",
    "sign",
    "sign_turn_end",
    "signed_bytes",
    "turn_end_bytes",
    "turn_end_headers",
    "turn_end_path",
    "verify_signature",
    "verify_turn_end",
]
