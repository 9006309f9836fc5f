"""Exponential backoff with full jitter. Pure: no database.

The delay before attempt n+1 (after attempt n failed) is uniform in
[0, min(max_delay, initial * factor ** (n - 1))] — "full jitter", which spreads
a thundering herd of retries across the whole window.
"""

from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """A workflow's (or the webhook sender's) retries: how many attempts in
    all (0: no limit), the first delay's ceiling, its growth, its cap."""

    max_attempts: int
    initial: float
    factor: float
    max_delay: float


def backoff_ceiling(policy: RetryPolicy, attempt: int) -> float:
    """The upper bound of the delay after failed attempt number `attempt` (1-based)."""
    exponent = max(0, attempt - 1)
    try:
        ceiling = policy.initial * policy.factor ** exponent
    except OverflowError:
        return policy.max_delay
    return min(policy.max_delay, ceiling)


def backoff_delay(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """A jittered delay in seconds for the retry after failed attempt `attempt`."""
    return (rng or random).uniform(0.0, backoff_ceiling(policy, attempt))
