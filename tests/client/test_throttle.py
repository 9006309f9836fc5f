"""Throttled triggers (429 + Retry-After) against a live PILOT whose trigger rate
is 3 per second: the client waits at least what Retry-After says, re-sends the
same key, and every trigger lands exactly once."""

from __future__ import annotations

import sys
import time
import urllib.request

import pilot_client
import pytest
from pilot_client import PilotClient, RetryPolicy

from tests.support.procs import free_port, wait_until
from workflows.models import Task

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def throttled_url(live_pilot):
    fleet, _ = live_pilot
    port = free_port()
    web = fleet.start_process("web-throttled", [
        sys.executable, "-m", "gunicorn", "pilot.wsgi", "-w", "1", "-b", f"127.0.0.1:{port}"],
        PILOT_TRIGGER_RATE="3/s")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers(url), 30, what="the throttled web server")
    yield url
    web.stop(timeout=5)


def test_throttled_triggers_wait_out_retry_after_and_each_lands_once(throttled_url, api_client):
    user, token = api_client
    timings = []
    with PilotClient(throttled_url, token,
                     retry=RetryPolicy(max_retries=8, initial=0.05, max_delay=0.2)) as client:
        for i in range(8):
            started = time.monotonic()
            result = client.trigger("demo.echo", {"i": i})
            timings.append((result, time.monotonic() - started))
    assert all(result.created for result, _ in timings)
    assert Task.objects.filter(owner=user).count() == 8
    retried = [(result, took) for result, took in timings if result.attempts > 1]
    assert retried, "8 triggers at 3/s must have been throttled"
    for result, took in retried:  # every retry waited a Retry-After of at least 1 s
        assert took >= 0.95 * (result.attempts - 1), (result.attempts, took)


def test_without_retries_the_throttle_is_a_typed_error_with_its_retry_after(
        throttled_url, api_client):
    with PilotClient(throttled_url, api_client[1], retry=RetryPolicy(max_retries=0)) as client:
        with pytest.raises(pilot_client.Throttled) as caught:
            for i in range(10):
                client.trigger("demo.echo", {"i": i})
    assert caught.value.status == 429 and caught.value.retry_after >= 1
