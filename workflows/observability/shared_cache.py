"""The shared cache (settings.CACHES[PILOT_CACHE_ALIAS], "default" unless the
project chose another: Redis, or the `pilot_cache` table in the main
database) and what PILOT does when it fails. `cache` here is that alias's
backend, looked up on each use; PILOT's code uses it, never Django's
`django.core.cache.cache`, so a host keeps its default cache for its own.

Three things live there: the rate limits (triggers, task actions), the login
lockouts and the metrics' task counts. They do not deserve the same answer
to a failure, so every call goes through one of three doors:

- `cache_soft` — advisory reads (the metrics): any error gives the fallback.
- `cache_guarded` — the rate limits. A *transient* error (the store is there
  but did not answer: connection refused or reset, timeout, Redis loading or
  failing over, a database connection dropped) degrades: the caller gets its
  fallback and the request goes on unthrottled, logged as `cache_unavailable`.
  A *permanent* error (the configuration is wrong and will stay wrong: the
  cache table does not exist, Redis refuses the credentials or the command,
  the backend cannot be built) fails closed: `CacheMisconfigured`, a 503
  `unavailable`, logged as `cache_misconfigured` at ERROR. Anything not
  recognised as transient counts as permanent — the safe side.
- `cache_strict` — the login lockouts: any error raises `CacheFailure`, and the
  login is refused. An attacker must never be able to switch the lockout off
  by making its store unreachable.

`cache_error_kind` is the one place that tells transient from permanent;
`cache_probe` is what `/readyz` and the `pilot.E011` system check ask.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar, cast

from django.core.cache import BaseCache, caches
from django.db import InterfaceError, OperationalError
from redis import exceptions as redis_errors

from workflows.conf import pilot_settings
from workflows.observability.events import Event, emit
from workflows.rules.errors import Unavailable

T = TypeVar("T")

TRANSIENT = "transient"
PERMANENT = "permanent"

# The table behind the database cache; migrations create it whatever the
# broker, so switching REDIS_URL off later finds it there.
CACHE_TABLE = "pilot_cache"

# Redis said who we are or what we may do is wrong: retrying cannot help.
_REDIS_PERMANENT = (redis_errors.AuthenticationError, redis_errors.AuthorizationError,
                    redis_errors.NoPermissionError)
# Redis (or the path to it) is down, slow, loading, failing over or full.
_REDIS_TRANSIENT = (redis_errors.ConnectionError, redis_errors.TimeoutError,
                    redis_errors.BusyLoadingError, redis_errors.TryAgainError,
                    redis_errors.ReadOnlyError, redis_errors.ClusterDownError,
                    redis_errors.OutOfMemoryError)


def cache_alias() -> str:
    """The CACHES alias PILOT's shared state lives in (PILOT_CACHE_ALIAS)."""
    return str(pilot_settings.PILOT_CACHE_ALIAS)


class _SharedCache:
    """`caches[PILOT_CACHE_ALIAS]`, looked up on every use (as Django's own
    `cache` proxies "default"), so a changed setting is seen at once."""

    def __getattr__(self, name: str):
        return getattr(caches[cache_alias()], name)


cache = cast(BaseCache, _SharedCache())


class CacheFailure(Exception):
    """A cache call failed; `kind` is TRANSIENT or PERMANENT."""

    def __init__(self, operation: str, kind: str, error: BaseException):
        self.operation, self.kind, self.error = operation, kind, error
        super().__init__(f"{operation}: {kind} cache error: {describe(error)}")


class CacheMisconfigured(Unavailable):
    """The shared cache is misconfigured; the request is refused rather than
    served without its rate limit (503 `unavailable`)."""

    def __init__(self, operation: str):
        super().__init__("The rate limiter's store is misconfigured; the operator has been "
                         "alerted (see /readyz)")
        self.operation = operation


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def cache_error_kind(exc: BaseException) -> str:
    """TRANSIENT if `exc` says the store is momentarily unreachable, PERMANENT if
    the configuration is wrong (or the error is unknown: fail closed)."""
    if isinstance(exc, _REDIS_PERMANENT):
        return PERMANENT
    if isinstance(exc, _REDIS_TRANSIENT):
        return TRANSIENT
    if isinstance(exc, OperationalError | InterfaceError):
        # SQLite reports a missing table as an OperationalError; PostgreSQL's
        # (UndefinedTable) is a ProgrammingError, permanent below.
        return PERMANENT if "no such table" in str(exc).lower() else TRANSIENT
    if isinstance(exc, ConnectionError | TimeoutError):  # OS level, e.g. memcached
        return TRANSIENT
    return PERMANENT


def _record(operation: str, exc: BaseException) -> str:
    kind = cache_error_kind(exc)
    if kind == TRANSIENT:
        emit(Event.CACHE_UNAVAILABLE, level=logging.WARNING, operation=operation,
             error=describe(exc))
    else:
        emit(Event.CACHE_MISCONFIGURED, level=logging.ERROR, operation=operation,
             error=describe(exc))
    return kind


def cache_soft(operation: str, call: Callable[[], T], fallback: T) -> T:
    """`call()`, or `fallback` on any cache error (logged)."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - any backend failure: Redis, database
        _record(operation, exc)
        return fallback


def cache_guarded(operation: str, call: Callable[[], T], fallback: T) -> T:
    """`call()`; `fallback` on a transient error; CacheMisconfigured on a
    permanent one."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - classified below
        if _record(operation, exc) == TRANSIENT:
            return fallback
        raise CacheMisconfigured(operation) from exc


def cache_strict(operation: str, call: Callable[[], T]) -> T:
    """`call()`; CacheFailure on any cache error (logged)."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - classified below
        raise CacheFailure(operation, _record(operation, exc), exc) from exc


def cache_probe() -> tuple[str, str]:
    """One read of the shared cache: ("ok", ""), ("unreachable", why) for a
    transient error or ("misconfigured", why) for a permanent one. Logs nothing
    (its callers report)."""
    try:
        cache.get("pilot:probe")
    except Exception as exc:  # noqa: BLE001 - classified
        kind = cache_error_kind(exc)
        return ("unreachable" if kind == TRANSIENT else "misconfigured"), describe(exc)
    return "ok", ""
