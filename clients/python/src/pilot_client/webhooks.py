"""Verifying PILOT's completion webhooks (the Standard Webhooks scheme).

A delivery is a POST whose raw body is signed with the client's secret:

    webhook-id:        <task id>:<state>:<n>       (the same on every re-delivery)
    webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>

where `key` is the base64-decoded part of the `whsec_...` secret. Several
space-separated signatures may be sent (while a secret rotates); one valid
`v1` signature is enough. The timestamp must be within `tolerance` of now, so a
captured delivery cannot be replayed later; dedupe on `webhook-id` for the
rest.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from pilot_client.errors import WebhookVerificationError

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE = 300.0  # seconds, as the Standard Webhooks libraries use


def _key(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        key = secret
    elif isinstance(secret, str):
        text = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
        try:
            # Padding added: a secret copied without its trailing "=" still works.
            key = base64.b64decode(text + "==", validate=False)
        except (binascii.Error, ValueError):
            raise ValueError("the webhook secret is not base64 (expected whsec_...)") from None
    else:
        raise TypeError("the webhook secret must be a str (whsec_...) or bytes")
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def _body_bytes(body: bytes | str) -> bytes:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    raise TypeError("body must be the raw request body (bytes or str), not parsed JSON")


def sign_webhook(secret: str | bytes, msg_id: str, timestamp: int, body: bytes | str) -> str:
    """The `webhook-signature` value for one delivery: `v1,<base64 HMAC-SHA256>`
    (for a receiver's own tests)."""
    signed = f"{msg_id}.{int(timestamp)}.".encode() + _body_bytes(body)
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify_webhook(secret: str | bytes, headers: Mapping[str, str], body: bytes | str, *,
                   tolerance: float = DEFAULT_TOLERANCE, now: float | None = None) -> Any:
    """Check one delivery and return its parsed JSON body (the task).

    `headers` as received (any case); `body` the raw bytes exactly as received
    — not re-serialised JSON, whose bytes would differ. Raises
    WebhookVerificationError when a header is missing, the timestamp is more
    than `tolerance` seconds away from `now` (default: this machine's clock), or
    no `v1` signature matches."""
    lowered = {str(k).lower(): v for k, v in headers.items()}
    msg_id = lowered.get("webhook-id")
    timestamp = lowered.get("webhook-timestamp")
    signatures = lowered.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise WebhookVerificationError(
            "missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        sent_at = int(timestamp)
    except (TypeError, ValueError):
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    current = time.time() if now is None else now
    if sent_at < current - tolerance:
        raise WebhookVerificationError("webhook-timestamp is too old")
    if sent_at > current + tolerance:
        raise WebhookVerificationError("webhook-timestamp is in the future")
    raw = _body_bytes(body)
    expected = base64.b64decode(sign_webhook(secret, msg_id, sent_at, raw)[3:])
    for candidate in str(signatures).split(" "):
        version, _, encoded = candidate.partition(",")
        if version != "v1" or not encoded:
            continue
        try:
            given = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        if hmac.compare_digest(expected, given):
            try:
                return json.loads(raw)
            except ValueError:
                raise WebhookVerificationError("the signed body is not JSON") from None
    raise WebhookVerificationError("no matching v1 signature")
