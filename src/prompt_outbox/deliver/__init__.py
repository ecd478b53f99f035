"""Deliverers (and their verifiers) for real agents."""

# The signature scheme lives in the core (the receiver's check shares it): named here too.
from ..core.signature import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from .opencode import (
    InvalidTarget,
    OpencodeDeliverer,
    OpencodeTarget,
    SharedTarget,
    TargetResolver,
    load_targets,
    static_targets,
    template_targets,
)
from .webhook import WebhookDeliverer

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "InvalidTarget",
    "OpencodeDeliverer",
    "OpencodeTarget",
    "SharedTarget",
    "TargetResolver",
    "WebhookDeliverer",
    "load_targets",
    "sign",
    "static_targets",
    "template_targets",
]
