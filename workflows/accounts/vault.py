"""Secrets PILOT must be able to read back, stored so that the database alone
cannot (docs/security.md, "Secrets at rest").

A client's webhook signing secret has to be read at every send (it keys the
HMAC), so it cannot be hashed like an API token. It is sealed with Fernet
(AES-128-CBC + HMAC-SHA256, from `cryptography`) under a key the database
never holds: PILOT_SECRETS_KEYS, else one derived from DJANGO_SECRET_KEY. A
backup, a replica or a read-only SQL session yields `fernet:gAAAA…`, which
signs nothing.

Keys rotate like Django's SECRET_KEY_FALLBACKS: the first key seals, every key
opens, so a new key goes first and the old stays listed until
`manage.py seal_secrets` re-sealed every row under the new one.
"""

from __future__ import annotations

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from workflows.conf import pilot_settings

SEALED_PREFIX = "fernet:"


class SecretUnreadable(Exception):  # noqa: N818 - a state, with the reason to show
    """A sealed value none of the configured keys opens (the keys changed)."""


def _key_texts() -> tuple[str, ...]:
    configured = pilot_settings.PILOT_SECRETS_KEYS
    if configured:
        return tuple(k.strip() for k in configured.split(",") if k.strip())
    return (settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ()))


def _fernet_key(text: str) -> bytes:
    # Any string of enough entropy (a Django secret key, `openssl rand -base64 32`)
    # becomes a Fernet key; the label keeps it apart from every other use of it.
    digest = hashlib.sha256(b"pilot.secrets.v1\x00" + text.encode("utf-8")).digest()
    return base64.urlsafe_b64encode(digest)


@functools.lru_cache(maxsize=8)
def _multi(texts: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(_fernet_key(t)) for t in texts])


def _fernet() -> MultiFernet:
    return _multi(_key_texts())


def secret_seal(plain: str) -> str:
    """The stored form of `plain`: `fernet:` + a Fernet token under the first key."""
    if plain.startswith(SEALED_PREFIX):
        raise ValueError("already sealed")
    return SEALED_PREFIX + _fernet().encrypt(plain.encode("utf-8")).decode("ascii")


def secret_open(stored: str) -> str:
    """The secret `stored` holds; SecretUnreadable when no configured key opens it."""
    if not stored.startswith(SEALED_PREFIX):
        raise SecretUnreadable("not a sealed secret")
    try:
        return _fernet().decrypt(stored.removeprefix(SEALED_PREFIX).encode("ascii")).decode()
    except (InvalidToken, UnicodeError, ValueError):
        raise SecretUnreadable("no key of PILOT_SECRETS_KEYS (or DJANGO_SECRET_KEY and its "
                               "fallbacks) opens it") from None


def secret_reseal(stored: str) -> str:
    """`stored` sealed again under the first key (MultiFernet.rotate); as is when
    empty. SecretUnreadable when no key opens it."""
    if not stored:
        return stored
    try:
        token = _fernet().rotate(stored.removeprefix(SEALED_PREFIX).encode("ascii"))
    except (InvalidToken, ValueError):
        raise SecretUnreadable("no configured key opens it") from None
    return SEALED_PREFIX + token.decode("ascii")
