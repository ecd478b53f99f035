"""Deliverers (and their verifiers) for real agents."""

from .opencode import (
    OpencodeDeliverer,
    OpencodeTarget,
    TargetResolver,
    load_targets,
    static_targets,
    template_targets,
)
from .webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookDeliverer, sign

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "OpencodeDeliverer",
    "OpencodeTarget",
    "TargetResolver",
    "WebhookDeliverer",
    "load_targets",
    "sign",
    "static_targets",
    "template_targets",
]
