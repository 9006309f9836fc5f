import random

from workflows.rules.backoff import RetryPolicy, backoff_ceiling, backoff_delay

POLICY = RetryPolicy(max_attempts=10, initial=0.5, factor=2.0, max_delay=10.0)


def test_ceiling_grows_exponentially_then_caps():
    assert [backoff_ceiling(POLICY, n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]


def test_ceiling_survives_huge_attempt_numbers():
    assert backoff_ceiling(POLICY, 10_000) == 10.0


def test_delays_stay_within_zero_and_the_ceiling_and_are_spread():
    rng = random.Random(7)
    for attempt in range(1, 10):
        delays = [backoff_delay(POLICY, attempt, rng) for _ in range(500)]
        ceiling = backoff_ceiling(POLICY, attempt)
        assert all(0 <= d <= ceiling for d in delays)
        # Full jitter: both halves of the window are used.
        assert min(delays) < ceiling * 0.1 and max(delays) > ceiling * 0.9


def test_zero_initial_delay_means_immediate_retries():
    policy = RetryPolicy(max_attempts=3, initial=0.0, factor=2.0, max_delay=0.0)
    assert backoff_delay(policy, 5) == 0.0
