"""Brute-force protection for password logins (the admin, any Django login view).

After PILOT_LOGIN_MAX_FAILURES failed logins for one username from one client
address within PILOT_LOGIN_LOCKOUT_SECONDS, that (username, address) pair is
locked out for PILOT_LOGIN_LOCKOUT_SECONDS: even the right password is refused
until the lockout expires by itself. A successful login clears the pair's
count. An address that fails PILOT_LOGIN_MAX_FAILURES_PER_IP times across any
usernames (password spraying) is locked out the same way for every username.

Why keyed by username + address: a lockout per username alone lets anyone lock
an operator out from anywhere; one per address alone lets an attacker behind
many addresses try forever. The pair stops guessing at one account, the
per-address cap stops spraying, and the real operator at another address still
gets in.

How: `LockoutBackend` is the first authentication backend; for a locked pair it
raises PermissionDenied, which makes django.contrib.auth.authenticate() stop
and fail before any password is checked. Failures and successes are recorded
from Django's `user_login_failed` / `user_logged_in` signals. State lives in
the shared cache (settings.CACHES), so every gunicorn worker on every machine
sees the same counts (and, the cache being unreachable, logins go on without
lockouts rather than failing: workflows.shared_cache); expiry is by the timestamps stored in
the entry, not by the cache's own timeout. Counting is read-modify-write: under
a truly parallel attack a few increments can be lost, which at worst allows a
handful of extra attempts before the lock — never an unlock.

Client address: REMOTE_ADDR, or — behind PILOT_TRUSTED_PROXIES reverse
proxies — the address the outermost trusted proxy saw (X-Forwarded-For,
counted from the right, so a client cannot forge it).
"""

from __future__ import annotations

import hashlib
import time

from django.conf import settings
from django.contrib.auth.backends import BaseBackend, ModelBackend
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver

from workflows.observability.events import emit
from workflows.shared_cache import cache_soft

_PREFIX = "pilot:login:"


def client_ip(request) -> str:
    """The client's address as the first trusted hop saw it (see module doc)."""
    proxies = settings.PILOT_TRUSTED_PROXIES
    remote = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    if proxies and request is not None:
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
                if h.strip()]
        if len(hops) >= proxies:
            return hops[-proxies]
    return remote or "unknown"


def _key(*parts: str) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()
    return f"{_PREFIX}{digest}"


def _keys(username: str, ip: str) -> tuple[str, str]:
    return _key("pair", (username or "").strip().lower(), ip), _key("ip", ip)


def _remaining(entry, now: float) -> float:
    return max(0.0, entry["locked_until"] - now) if entry else 0.0


def login_lockout_remaining(*, username: str, ip: str, now: float | None = None) -> float:
    """Seconds until (username, ip) may try again; 0.0 when not locked out."""
    now = time.time() if now is None else now
    pair_key, ip_key = _keys(username, ip)
    entries = cache_soft("login lockout read", lambda: cache.get_many([pair_key, ip_key]), {})
    return max(_remaining(entries.get(pair_key), now), _remaining(entries.get(ip_key), now))


def _count(key: str, limit: int, now: float) -> dict:
    window = settings.PILOT_LOGIN_LOCKOUT_SECONDS
    entry = cache.get(key)
    if entry is None or now - entry["first"] > window:
        entry = {"failures": 0, "first": now, "locked_until": 0.0}
    entry["failures"] += 1
    if entry["failures"] >= limit:
        entry["locked_until"] = max(entry["locked_until"], now + window)
    # The cache's own expiry only frees space; the timestamps decide.
    cache.set(key, entry, timeout=int(window * 2) + 60)
    return entry


def login_failure_record(*, username: str, ip: str, now: float | None = None) -> float:
    return cache_soft("login failure count",
                      lambda: _failure_record(username=username, ip=ip, now=now), 0.0)


def _failure_record(*, username: str, ip: str, now: float | None = None) -> float:
    """Count one failed login; returns the lockout it caused (seconds, 0.0 if none).
    Failures while already locked out are not counted (they never reached a
    password check), so a lockout is never extended by hammering it."""
    now = time.time() if now is None else now
    if login_lockout_remaining(username=username, ip=ip, now=now):
        return 0.0
    pair_key, ip_key = _keys(username, ip)
    pair = _count(pair_key, settings.PILOT_LOGIN_MAX_FAILURES, now)
    per_ip = _count(ip_key, settings.PILOT_LOGIN_MAX_FAILURES_PER_IP, now)
    locked = max(_remaining(pair, now), _remaining(per_ip, now))
    if locked:
        emit("login_locked_out", username=username, client_ip=ip,
             failures=pair["failures"], seconds=round(locked))
    return locked


def login_success_record(*, username: str, ip: str) -> None:
    """A successful login clears its pair's count (not the per-address cap)."""
    cache_soft("login success", lambda: cache.delete(_keys(username, ip)[0]), None)


class LockoutBackend(BaseBackend):
    """First in AUTHENTICATION_BACKENDS: refuses a locked-out (username, address)
    before any password is checked; otherwise lets the next backend decide."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            return None
        ip = client_ip(request)
        if login_lockout_remaining(username=username, ip=ip):
            emit("login_refused_locked_out", username=username, client_ip=ip)
            raise PermissionDenied("too many failed logins; try again later")
        return None

    def get_user(self, user_id):
        # A session whose backend is this one (Django's login() without a
        # preceding authenticate(), e.g. Client.force_login) still resolves to
        # the user: this backend only ever refuses, it never owns accounts.
        return ModelBackend().get_user(user_id)


@receiver(user_login_failed, dispatch_uid="pilot.login_guard.failed")
def _on_login_failed(sender, credentials, request=None, **kwargs):
    username = credentials.get("username")
    if username is not None:
        login_failure_record(username=username, ip=client_ip(request))


@receiver(user_logged_in, dispatch_uid="pilot.login_guard.succeeded")
def _on_logged_in(sender, request, user, **kwargs):
    if request is not None:
        login_success_record(username=user.get_username(), ip=client_ip(request))
