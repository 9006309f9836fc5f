"""Signing deliveries the Standard Webhooks way (docs/webhooks.md, "Verifying").

    webhook-id:        <task id>:<state>:<n>
    webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>

`key` is the base64-decoded part of the client's `whsec_…` secret. During a
rotation's overlap a delivery carries one signature per secret, space-separated
(`v1,<new> v1,<old>`): a receiver that knows either accepts it. The
client library's `verify_webhook` and the `standardwebhooks` package both
check exactly this (tests/webhooks/test_signing.py holds all three together).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def webhook_secret_new() -> str:
    """A fresh secret: `whsec_` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def _key(secret: str) -> bytes:
    text = secret.removeprefix(SECRET_PREFIX)
    return base64.b64decode(text + "=" * (-len(text) % 4))


def webhook_sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value for one delivery."""
    signed = f"{message_id}.{int(timestamp)}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def webhook_headers(signing: str | Sequence[str], message_id: str, timestamp: int,
                    body: bytes) -> dict:
    """The three Standard Webhooks headers of one delivery, signed with each
    secret of `signing` (the current one first)."""
    keys = [signing] if isinstance(signing, str) else list(signing)
    return {"webhook-id": message_id, "webhook-timestamp": str(int(timestamp)),
            "webhook-signature": " ".join(webhook_sign(secret, message_id, timestamp, body)
                                          for secret in keys)}
