"""Deliverers (and their verifiers) for real agents."""

from .webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookDeliverer, sign

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "WebhookDeliverer", "sign"]
