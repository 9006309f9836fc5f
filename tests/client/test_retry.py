"""Backoff with full jitter and Retry-After (pilot_client/retry.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pilot_client
import pytest
from pilot_client import PilotClient, RetryPolicy, parse_retry_after

from tests.support.procs import free_port


def test_delays_are_full_jitter_under_a_doubling_capped_ceiling():
    policy = RetryPolicy(initial=0.5, max_delay=4.0)
    rng = random.Random(7)
    for retry, ceiling in enumerate([0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        delays = [policy.delay(retry, rng=rng) for _ in range(400)]
        assert 0 <= min(delays) and max(delays) <= ceiling
        assert max(delays) > 0.9 * ceiling and min(delays) < 0.1 * ceiling  # spread out


def test_retry_after_is_a_floor():
    policy = RetryPolicy(initial=0.5, max_delay=4.0)
    assert all(policy.delay(0, retry_after=3.0) >= 3.0 for _ in range(100))


def test_retry_after_in_seconds_or_as_an_http_date():
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True),
                             now=now) == 30.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True),
                             now=now) == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None


def test_a_bad_policy_is_refused():
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)
    with pytest.raises(ValueError):
        RetryPolicy(initial=2, max_delay=1)


def test_an_unreachable_server_raises_a_connection_error_after_the_retries():
    with PilotClient(f"http://127.0.0.1:{free_port()}", "token",
                     retry=RetryPolicy(max_retries=2, initial=0.01, max_delay=0.02)) as gone:
        with pytest.raises(pilot_client.PilotConnectionError) as caught:
            gone.trigger("demo.echo", {}, key="k-1")
    assert (caught.value.attempts, caught.value.key) == (3, "k-1")
