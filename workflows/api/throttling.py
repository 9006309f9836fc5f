"""Per-client rate limits, one per scope:

- `trigger` (PILOT_TRIGGER_RATE, e.g. 6000/min): POST /tasks costs 1, a batch
  one per item, so batching cannot bypass the limit;
- `action` (PILOT_ACTION_RATE, e.g. 600/min): POST /tasks/{id}/cancel and
  /retry together — a retry re-runs a whole workflow, so it must not escape the
  limit that holds triggers.

Each is a fixed-window counter in the `default` cache, which every web process
shares (the database cache, or Redis when REDIS_URL is set), so a limit holds
across processes and machines. Exceeding it is a 429 `throttled` with
Retry-After (the seconds left in the window).

When the cache fails (workflows.observability.shared_cache): a transient error lets the
request through unthrottled (logged `cache_unavailable`); a permanent one — a
misconfiguration — refuses it with 503 `unavailable` rather than run without a
limit. With Redis the counter is exact (INCRBY); with the database cache an
increment is a read and a write, so N requests racing in the same instant may
overshoot the limit by up to N-1.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.core.exceptions import ImproperlyConfigured
from rest_framework.exceptions import Throttled
from rest_framework.throttling import BaseThrottle

from workflows.conf import pilot_settings
from workflows.observability.shared_cache import cache, cache_alias, cache_guarded

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
RATE_PATTERN = r"\d+/(s|sec|second|m|min|minute|h|hour|d|day)"


@dataclass(frozen=True)
class Scope:
    name: str
    setting: str
    what: str  # for the 429's detail


TRIGGER = Scope("trigger", "PILOT_TRIGGER_RATE", "Trigger")
ACTION = Scope("action", "PILOT_ACTION_RATE", "Cancel/retry")


class RateLimited(Throttled):
    """A 429 whose detail names the limit that was hit."""

    def __init__(self, scope: Scope, wait: float):
        super().__init__(wait=wait, detail=f"{scope.what} rate limit ({scope.setting}) "
                                           "exceeded; retry after the number of seconds in "
                                           "Retry-After")


def parse_rate(setting: str, value: str) -> tuple[int, int]:
    """`"6000/min"` -> (6000, 60); ImproperlyConfigured for anything else."""
    if not isinstance(value, str) or not re.fullmatch(RATE_PATTERN, value):
        raise ImproperlyConfigured(
            f"{setting}={value!r} must look like 6000/min (s, min, hour, day)")
    count, period = value.split("/")
    return int(count), _PERIODS[period[0]]


def trigger_rate() -> tuple[int, int]:
    return parse_rate(TRIGGER.setting, pilot_settings.PILOT_TRIGGER_RATE)


def rate_consume(scope: Scope, user, cost: int = 1) -> None:
    """Count `cost` requests of `scope` for `user` in the current window; raise
    RateLimited (with the wait until the window ends) when that goes over the
    rate. Cache failures: see the module doc."""
    limit, period = parse_rate(scope.setting, getattr(pilot_settings, scope.setting))
    wait = cache_guarded(f"{scope.name} throttle",
                         lambda: _consume(f"{scope.name}-rate:{user.pk}", cost, limit, period),
                         None)
    if wait is not None:
        raise RateLimited(scope, wait)


def trigger_throttle_consume(user, cost: int = 1) -> None:
    rate_consume(TRIGGER, user, cost)


def _redis_count(backend: RedisCache, key: str, cost: int, lifetime: int) -> int:
    """INCRBY and the window's expiry in one round trip (MULTI/EXEC): Django's
    `incr` asks EXISTS first and `add` is a third command for the window's first
    request — a trigger paid two or three round trips to Redis for its count.
    Values stay what the cache API reads (Django stores integers as plain
    integers), so `cache.get`/`decr` see the same counter."""
    full = backend.make_and_validate_key(key)
    client = backend.__dict__.get("pilot_counter_client")
    if client is None:  # Django builds a new client object (~170 callbacks) per call
        client = backend.__dict__["pilot_counter_client"] = backend._cache.get_client(
            full, write=True)  # the backend object is per thread, so is this client
    pipe = client.pipeline(transaction=True)
    pipe.set(full, 0, ex=lifetime, nx=True)  # the window's first request starts it
    pipe.incrby(full, cost)
    _, used = pipe.execute()
    return int(used)


def _consume(prefix: str, cost: int, limit: int, period: int) -> float | None:
    """The seconds to wait if `cost` more requests exceed the rate, else None."""
    now = time.time()
    window = int(now // period)
    key = f"{prefix}:{window}"
    backend = caches[cache_alias()]  # (`cache` is a proxy to it)
    if isinstance(backend, RedisCache):
        used = _redis_count(backend, key, cost, period + 1)
    else:
        try:
            used = cache.incr(key, cost)
        except ValueError:  # first request of the window
            used = cost if cache.add(key, cost, timeout=period + 1) else cache.incr(key, cost)
    if used > limit:
        cache.decr(key, cost)  # a refused request does not use up the allowance
        return max(1.0, (window + 1) * period - now)
    return None


class TriggerRateThrottle(BaseThrottle):
    """For single-trigger views; batch views call trigger_throttle_consume with
    the number of items once they know it."""

    def allow_request(self, request, view):
        rate_consume(TRIGGER, request.user, 1)
        return True


class ActionRateThrottle(BaseThrottle):
    """For POST /tasks/{id}/cancel and /retry (one shared allowance)."""

    def allow_request(self, request, view):
        rate_consume(ACTION, request.user, 1)
        return True
