"""Per-client trigger throttle (PILOT_TRIGGER_RATE, e.g. 6000/min).

A fixed-window counter in the `default` cache, which every web process shares
(the database cache, or Redis when REDIS_URL is set), so the limit holds
across processes and machines. A single trigger costs 1; a batch costs one per
item, so batching cannot bypass the limit. Exceeding it is a 429 `throttled`
with Retry-After (the seconds left in the window).
"""

from __future__ import annotations

import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.exceptions import Throttled
from rest_framework.throttling import BaseThrottle

from workflows.shared_cache import cache_soft

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def trigger_rate() -> tuple[int, int]:
    count, period = settings.PILOT_TRIGGER_RATE.split("/")
    return int(count), _PERIODS[period[0]]


def trigger_throttle_consume(user, cost: int = 1) -> None:
    """Count `cost` triggers for `user` in the current window; raise Throttled
    (with the wait until the window ends) when that goes over the rate. With the
    cache unreachable the trigger goes through (see workflows.shared_cache)."""
    wait = cache_soft("trigger throttle", lambda: _consume(user, cost), None)
    if wait is not None:
        raise Throttled(wait=wait)


def _consume(user, cost: int) -> float | None:
    """The seconds to wait if `cost` more triggers exceed the rate, else None."""
    limit, period = trigger_rate()
    now = time.time()
    window = int(now // period)
    key = f"trigger-rate:{user.pk}:{window}"
    try:
        used = cache.incr(key, cost)
    except ValueError:  # first trigger of the window
        if cache.add(key, cost, timeout=period + 1):
            used = cost
        else:
            used = cache.incr(key, cost)
    if used > limit:
        cache.decr(key, cost)  # a refused request does not use up the allowance
        return max(1.0, (window + 1) * period - now)
    return None


class TriggerRateThrottle(BaseThrottle):
    """For single-trigger views; batch views call trigger_throttle_consume with
    the number of items once they know it."""

    def allow_request(self, request, view):
        trigger_throttle_consume(request.user, 1)
        return True
