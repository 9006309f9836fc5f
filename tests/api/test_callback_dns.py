"""No DNS lookup holds a web worker (issue 31, N4): a trigger or batch
resolves its callback hosts together within one deadline,
PILOT_WEBHOOK_RESOLVE_SECONDS, whatever the resolver does. Before, a batch
of 100 distinct hosts made 100 lookups one after the other inside the request
(5.4 s at 50 ms each; with an attacker's DNS that never answers, hours).

The resolver here really takes its time: `getaddrinfo` sleeps for names under
`slow.test` (tests/support/slow_dns.py) and then answers 127.0.0.1 — a
loopback address, so a name that does answer in time is refused, which shows
the check still runs."""

from __future__ import annotations

import time

import pytest

from tests.support.slow_dns import LOOKUPS, slow_dns
from workflows.accounts import client_webhook_ensure
from workflows.models import Task
from workflows.webhooks.targets import targets_check

pytestmark = pytest.mark.django_db

DEADLINE = 0.5
SLOW = 2.0  # each slow lookup: 400 s for 100 of them one after the other


@pytest.fixture(autouse=True)
def _deadline(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = False
    settings.PILOT_WEBHOOK_RESOLVE_SECONDS = DEADLINE


def batch(n: int, host: str) -> list[dict]:
    return [{"idempotency_key": f"dns-{i}", "workflow": "demo.echo", "payload": {},
             "callback_url": f"https://h{i}.{host}/hook"} for i in range(n)]


def test_a_batch_of_100_slow_hosts_costs_at_most_the_deadline(api):
    client_webhook_ensure(api.user)
    LOOKUPS.clear()
    with slow_dns("slow.test", SLOW):
        started = time.monotonic()
        r = api.post("/api/v1/tasks/batch", {"tasks": batch(100, "slow.test")}, format="json")
        elapsed = time.monotonic() - started
    assert r.status_code == 200, r.content
    assert LOOKUPS, "the slow resolver was not reached"
    # The lookups ran (some still do, in their threads) but the request did not
    # wait for them: the deadline, plus writing 100 tasks.
    assert elapsed < DEADLINE + 1.0, elapsed
    # Not answered in time: accepted, and checked by the sender at every attempt.
    assert [item["status"] for item in r.json()["results"]] == [202] * 100
    assert Task.objects.exclude(callback_url="").count() == 100


def test_the_check_alone_returns_at_the_deadline_and_refuses_what_answered_in_time():
    with slow_dns("slow.test", SLOW), slow_dns("fast.test", 0.0):
        urls = ["https://a.fast.test/x"] + [f"https://h{i}.slow.test/" for i in range(100)]
        started = time.monotonic()
        checked = targets_check(urls)
        elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + 0.1, elapsed
    refused = checked["https://a.fast.test/x"]
    assert "resolves to 127.0.0.1, which is not a public address" in refused.detail
    # The slow ones are accepted: the sender resolves and checks them again.
    assert all(checked[url] == url for url in urls[1:])


def test_one_trigger_with_a_name_that_answers_in_time_is_still_refused(api):
    client_webhook_ensure(api.user)
    with slow_dns("fast.test", 0.0):
        r = api.post("/api/v1/tasks", {"workflow": "demo.echo", "payload": {},
                                       "callback_url": "https://a.fast.test/hook"},
                     format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert r.status_code == 400
    assert "not a public address" in r.json()["errors"]["callback_url"][0]
