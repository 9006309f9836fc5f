"""When to retry and how long to wait: exponential backoff with full jitter,
never sooner than the server's Retry-After."""

from __future__ import annotations

import dataclasses
import random
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

# Statuses after which the request certainly did nothing and a retry may work:
# 429 (throttled) and 503 (unavailable: the transaction rolled back). 502/504
# come from a proxy in front of PILOT: the request may or may not have been
# processed, so they are retried only where a retry is safe (triggers carry
# their idempotency key; GETs change nothing).
RETRY_STATUSES_ALWAYS = frozenset({429, 503})
RETRY_STATUSES_IF_SAFE = frozenset({502, 504})
# A 409 with this code: the server lost a race and says "send it again".
RETRY_CODES = frozenset({"conflict"})


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """`max_retries` retries after the first attempt; the n-th waits a random
    time in [0, min(max_delay, initial * 2**n)] (full jitter, so many clients
    retrying together spread out), or at least Retry-After when the server sent
    one. A Retry-After longer than `max_retry_after` is not waited for: the
    error is raised at once."""

    max_retries: int = 5
    initial: float = 0.5
    max_delay: float = 30.0
    max_retry_after: float = 120.0

    def __post_init__(self):
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError("max_retries must be an integer >= 0")
        if self.initial < 0 or self.max_delay < self.initial:
            raise ValueError("need 0 <= initial <= max_delay")

    def delay(self, retry: int, retry_after: float | None = None,
              rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (0-based)."""
        ceiling = min(self.max_delay, self.initial * (2 ** retry))
        jittered = (rng or random).uniform(0, ceiling)
        if retry_after is not None:
            return max(retry_after, jittered)
        return jittered


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3);
    None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())
