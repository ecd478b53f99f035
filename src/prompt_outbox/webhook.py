"""Public import path for webhook receivers (README, "webhook deliverer"): check a delivery's
signature with ``verify_signature``. The code lives in ``prompt_outbox.core.signature``, which
the webhook deliverer signs with."""

from .core.signature import (
    DEFAULT_TOLERANCE,
    ENTRY_ID_HEADER,
    SCHEME,
    SESSION_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WORKSPACE_HEADER,
    HeaderSource,
    SignedDelivery,
    WebhookSignatureError,
    sign,
    signed_bytes,
    verify_signature,
)

__all__ = [
    "DEFAULT_TOLERANCE",
    "ENTRY_ID_HEADER",
    "SCHEME",
    "SESSION_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "WORKSPACE_HEADER",
    "HeaderSource",
    "SignedDelivery",
    "WebhookSignatureError",
    "sign",
    "signed_bytes",
    "verify_signature",
]
