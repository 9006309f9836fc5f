"""ApiToken: an upstream client's API token, stored as a hash.

The secret is shown once, when it is issued (`create_api_client`); the
database keeps its SHA-256 and a short visible prefix, so a stolen backup or a
read-only SQL session yields no usable token, and an operator can still tell
which token is which (`pilot_3fa9c2d1…`). A fast hash is enough: the secret is
32 random bytes, not a password, so there is nothing to brute-force.

A user has one token, and for a while two: issuing a new one (`--rotate`)
gives the old an expiry PILOT_ROTATION_OVERLAP_SECONDS away, so the upstream
system can switch over without a refused request (`--no-overlap`: the old
stops at once, for a token that leaked). A token may also be issued with an
expiry of its own (`--token-expires-days`). Past `expires_at` it is refused.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

KEY_PREFIX = "pilot_"


def token_digest(key: str) -> str:
    """The stored form of a token: the hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def token_generate() -> tuple[str, str]:
    """A new secret `pilot_<8 hex>_<43 urlsafe>` and its visible prefix."""
    visible = KEY_PREFIX + secrets.token_hex(4)
    return f"{visible}_{secrets.token_urlsafe(32)}", visible


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="pilot_api_tokens")
    # What an operator sees (the admin, logs): never enough to authenticate.
    prefix = models.CharField(max_length=20)
    # Unique: authentication looks a presented token up by its digest.
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    # NULL: does not expire. Authentication refuses it from then on.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
