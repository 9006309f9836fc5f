"""Brute-force protection for password logins (the admin, any Django login
view) and for the admin's current-password check.

Failed logins are counted in four ways, each within PILOT_LOGIN_LOCKOUT_SECONDS;
reaching a bound locks what it counts for PILOT_LOGIN_LOCKOUT_SECONDS, during
which even the right password is refused:

- (username, address): PILOT_LOGIN_MAX_FAILURES (5) — guessing one account
  from one place;
- username, every address: PILOT_LOGIN_MAX_FAILURES_PER_USER (20) — guessing
  one account from many addresses (a botnet, a forged X-Forwarded-For);
- address, every username: PILOT_LOGIN_MAX_FAILURES_PER_IP (50) — spraying;
- (username, device): PILOT_LOGIN_MAX_FAILURES (5) — guessing with a stolen
  device cookie.

**Known devices.** A browser that once logged in as a user carries a signed
device cookie for that user (PILOT_LOGIN_DEVICE_DAYS, HttpOnly). Its attempts
for that user count and lock only against (username, device): none of the
first three counters applies to it, so no lockout that an attacker can cause —
of an address, of every address (the whole site behind a proxy whose address
everyone shares), of the username itself — ever locks the real user out of a
browser they used before. An attacker without the cookie (it is signed with
SECRET_KEY and names the user) gets the first three bounds. This is OWASP's
"device cookie" defence against lockout denial of service.

**Fail closed.** The counters live in the shared cache (settings.CACHES). When
it cannot be read, every password login is refused (`login_refused_unavailable`)
until it is back: an attacker must not switch the lockout off by making its
store unreachable.

**Current password.** /admin/password_change/ asks for the current password;
a session that gets it wrong PILOT_LOGIN_MAX_FAILURES times is locked out of
that form the same way (per user), so a hijacked session cannot brute-force it.

How: `LockoutBackend` is the first authentication backend; for a locked
attempt it raises PermissionDenied, which makes django.contrib.auth.authenticate()
stop before any password is checked. Failures and successes are recorded from
Django's `user_login_failed` / `user_logged_in` signals; `LoginDeviceMiddleware`
sets the device cookie on the response of a successful login. Expiry is by the
timestamps stored in an entry, not by the cache's own timeout, and failures
while locked are not counted, so hammering a lockout never extends it.
Counting is read-modify-write: under a truly parallel attack a few increments
can be lost, which at worst allows a handful of extra attempts before the lock
— never an unlock.

Client address: REMOTE_ADDR, or — behind PILOT_TRUSTED_PROXIES reverse
proxies — the address the outermost trusted proxy saw (X-Forwarded-For,
counted from the right, so a client cannot forge it). docs/security.md gives
the one right value per deployment shape.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.backends import BaseBackend, ModelBackend
from django.core import signing
from django.core.exceptions import PermissionDenied

from workflows.conf import pilot_settings
from workflows.observability.events import Event, emit
from workflows.observability.shared_cache import (
    CacheFailure,
    cache,
    cache_soft,
    cache_strict,
)

_PREFIX = "pilot:login:"
DEVICE_COOKIE = "pilot_login_device"
_DEVICE_SALT = "pilot.login_guard.device"

# Why a login was refused before its password was checked (request attribute,
# read by the login form to say so).
REFUSED_LOCKED = "locked_out"
REFUSED_UNAVAILABLE = "lockout_store_unavailable"


# --- the client -----------------------------------------------------------------------------

_proxy_warned: set[str] = set()


def client_ip(request) -> str:
    """The client's address as the first trusted hop saw it (see module doc)."""
    if request is None:
        return "unknown"
    proxies = pilot_settings.PILOT_TRUSTED_PROXIES
    remote = request.META.get("REMOTE_ADDR", "")
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    if proxies and len(hops) >= proxies:
        return hops[-proxies]
    if proxies and "direct" not in _proxy_warned:
        # Fewer hops than proxies: this request did not come through them.
        _proxy_warned.add("direct")
        emit(Event.PROXY_SETTING_SUSPECT, level=logging.WARNING, trusted_proxies=proxies,
             forwarded_hops=len(hops),
             hint="a request reached the app without passing the trusted proxies; "
                  "if clients can reach it directly, X-Forwarded-For can be forged: "
                  "see docs/security.md")
    elif not proxies and hops and "ignored" not in _proxy_warned:
        _proxy_warned.add("ignored")
        emit(Event.PROXY_SETTING_SUSPECT, level=logging.WARNING, trusted_proxies=0,
             forwarded_hops=len(hops),
             hint="requests carry X-Forwarded-For but PILOT_TRUSTED_PROXIES=0: behind a "
                  "proxy every client shares its address; see docs/security.md")
    return remote or "unknown"


def _norm(username) -> str:
    return str(username or "").strip().lower()


def device_cookie_value(username: str, device: str | None = None) -> str:
    """A signed device cookie for `username` (a new device id unless given)."""
    return signing.dumps({"u": _norm(username), "d": device or secrets.token_hex(16)},
                         salt=_DEVICE_SALT, compress=True)


def device_for(request, username) -> str | None:
    """The device id of the request's device cookie if it is valid (signed, not
    older than PILOT_LOGIN_DEVICE_DAYS) and issued for `username`; else None."""
    raw = request.COOKIES.get(DEVICE_COOKIE) if request is not None else None
    if not raw:
        return None
    try:
        data = signing.loads(raw, salt=_DEVICE_SALT,
                             max_age=pilot_settings.PILOT_LOGIN_DEVICE_DAYS * 86400)
    except signing.BadSignature:  # also SignatureExpired
        return None
    if not isinstance(data, dict) or data.get("u") != _norm(username):
        return None
    device = data.get("d")
    return device if isinstance(device, str) and device else None


# --- counters -------------------------------------------------------------------------------

def _key(*parts: str) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8", "backslashreplace")).hexdigest()
    return f"{_PREFIX}{digest}"


@dataclass(frozen=True)
class _Counter:
    key: str
    limit: int


def _counters(username, ip: str, device: str | None) -> list[_Counter]:
    """The counters an attempt is judged and counted by (see module doc)."""
    user = _norm(username)
    if device is not None:
        return [_Counter(_key("device", user, device), pilot_settings.PILOT_LOGIN_MAX_FAILURES)]
    return [_Counter(_key("pair", user, ip), pilot_settings.PILOT_LOGIN_MAX_FAILURES),
            _Counter(_key("user", user), pilot_settings.PILOT_LOGIN_MAX_FAILURES_PER_USER),
            _Counter(_key("ip", ip), pilot_settings.PILOT_LOGIN_MAX_FAILURES_PER_IP)]


def _remaining(entry, now: float) -> float:
    return max(0.0, entry["locked_until"] - now) if entry else 0.0


def _lockout(counters: list[_Counter], now: float) -> float:
    entries = cache.get_many([c.key for c in counters])
    return max((_remaining(entries.get(c.key), now) for c in counters), default=0.0)


def login_lockout_remaining(*, username: str, ip: str, device: str | None = None,
                            now: float | None = None) -> float:
    """Seconds until this attempt may be made; 0.0 when not locked out.
    Raises CacheFailure when the store cannot be read (callers fail closed)."""
    now = time.time() if now is None else now
    return cache_strict("login lockout read",
                        lambda: _lockout(_counters(username, ip, device), now))


def _count(counter: _Counter, now: float) -> dict:
    window = pilot_settings.PILOT_LOGIN_LOCKOUT_SECONDS
    entry = cache.get(counter.key)
    if entry is None or now - entry["first"] > window:
        entry = {"failures": 0, "first": now, "locked_until": 0.0}
    entry["failures"] += 1
    if entry["failures"] >= counter.limit:
        entry["locked_until"] = max(entry["locked_until"], now + window)
    # The cache's own expiry only frees space; the timestamps decide.
    cache.set(counter.key, entry, timeout=int(window * 2) + 60)
    return entry


def login_failure_record(*, username: str, ip: str, device: str | None = None,
                         now: float | None = None) -> float:
    """Count one failed login; returns the lockout it caused (seconds, 0.0 if
    none). Failures while already locked out are not counted (they never
    reached a password check), so a lockout is never extended by hammering it.
    A cache failure is logged and the failure goes uncounted (the next attempt's
    lockout read fails closed anyway)."""
    return cache_soft("login failure count",
                      lambda: _failure_record(username, ip, device, now), 0.0)


def _failure_record(username, ip, device, now) -> float:
    now = time.time() if now is None else now
    counters = _counters(username, ip, device)
    if _lockout(counters, now):
        return 0.0
    entries = [_count(counter, now) for counter in counters]
    locked = max(_remaining(entry, now) for entry in entries)
    if locked:
        emit(Event.LOGIN_LOCKED_OUT, username=username, client_ip=ip,
             known_device=device is not None, failures=entries[0]["failures"],
             seconds=round(locked))
    return locked


def login_success_record(*, username: str, ip: str, device: str | None = None) -> None:
    """A successful login clears the count of its (username, address) or
    (username, device) — never the per-username or per-address bounds, which
    an attacker who knows one password must not reset."""
    key = _counters(username, ip, device)[0].key
    cache_soft("login success", lambda: cache.delete(key), None)


def login_lockouts_clear(*, username: str, ip: str | None = None) -> None:
    """An operator's unlock: the per-username counter of `username`, and with
    `ip` also its (username, address) and per-address counters. Raises
    CacheFailure when the store is unreachable."""
    keys = [_key("user", _norm(username))]
    if ip is not None:
        keys += [_key("pair", _norm(username), ip), _key("ip", ip)]
    cache_strict("login unlock", lambda: cache.delete_many(keys))
    emit(Event.LOGIN_UNLOCKED, username=username, client_ip=ip)


# --- the current-password check (/admin/password_change/) ------------------------------------

def _password_counter(user) -> _Counter:
    return _Counter(_key("password-change", str(user.pk)), pilot_settings.PILOT_LOGIN_MAX_FAILURES)


def password_check_lockout_remaining(user, *, now: float | None = None) -> float:
    """Seconds until `user` may try their current password again (0.0 if they
    may). Raises CacheFailure when the store cannot be read."""
    now = time.time() if now is None else now
    return cache_strict("password check lockout read",
                        lambda: _lockout([_password_counter(user)], now))


def password_check_failure_record(user, *, now: float | None = None) -> float:
    now = time.time() if now is None else now
    counter = _password_counter(user)
    entry = cache_soft("password check failure count", lambda: _count(counter, now), None)
    locked = _remaining(entry, now)
    if locked:
        emit(Event.PASSWORD_CHECK_LOCKED_OUT, username=user.get_username(),
             failures=entry["failures"], seconds=round(locked))  # type: ignore[index]  # locked: counted
    return locked


def password_check_success_record(user) -> None:
    key = _password_counter(user).key
    cache_soft("password check success", lambda: cache.delete(key), None)


# --- Django integration -----------------------------------------------------------------------

class LockoutBackend(BaseBackend):
    """First in AUTHENTICATION_BACKENDS: refuses a locked-out attempt, or any
    attempt while the lockout store is unreachable, before any password is
    checked; otherwise lets the next backend decide."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            return
        ip = client_ip(request)
        device = device_for(request, username)
        try:
            remaining = login_lockout_remaining(username=username, ip=ip, device=device)
        except CacheFailure as exc:
            emit(Event.LOGIN_REFUSED_UNAVAILABLE, level=logging.WARNING, username=username,
                 client_ip=ip, cache_error=exc.kind)
            _refuse(request, REFUSED_UNAVAILABLE, 0.0)
        if remaining:
            emit(Event.LOGIN_REFUSED_LOCKED_OUT, username=username, client_ip=ip,
                 known_device=device is not None)
            _refuse(request, REFUSED_LOCKED, remaining)
        return

    def get_user(self, user_id):
        # A session whose backend is this one (Django's login() without a
        # preceding authenticate(), e.g. Client.force_login) still resolves to
        # the user: this backend only ever refuses, it never owns accounts.
        return ModelBackend().get_user(user_id)


def _refuse(request, reason: str, seconds: float):
    if request is not None:
        request.pilot_login_refused = (reason, seconds)
    raise PermissionDenied("login refused: " + reason)


# Connected by the opt-in app workflows.login_guard (its ready()), never on import.
def on_login_failed(sender, credentials, request=None, **kwargs):
    username = credentials.get("username")
    if username is not None and not getattr(request, "pilot_login_refused", None):
        login_failure_record(username=username, ip=client_ip(request),
                             device=device_for(request, username))


def on_logged_in(sender, request, user, **kwargs):
    if request is None:
        return
    username = user.get_username()
    device = device_for(request, username)
    login_success_record(username=username, ip=client_ip(request), device=device)
    # LoginDeviceMiddleware puts it on the response: this browser is now known
    # (its expiry starts again).
    request.pilot_device_cookie = device_cookie_value(username, device)


class LoginDeviceMiddleware:
    """Sets the device cookie on the response to a successful password login."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        value = getattr(request, "pilot_device_cookie", None)
        if value:
            response.set_cookie(DEVICE_COOKIE, value,
                                max_age=pilot_settings.PILOT_LOGIN_DEVICE_DAYS * 86400,
                                secure=settings.SESSION_COOKIE_SECURE, httponly=True,
                                samesite="Lax")
        return response
