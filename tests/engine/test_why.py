"""Why a task is not running (engine/why.py): each reason from the engine's
own rules, in the order a claim meets them, at most one query for a page."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.factories import make_task
from workflows.engine.why import why_not_running
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db


def task(owner, key, state=S.PENDING, **fields):
    """A task in `state` (through its transitions), then given `fields`."""
    made = make_task(owner, key=key, state=state)
    Task.objects.filter(pk=made.pk).update(**fields)
    return Task.objects.get(pk=made.pk)


def test_each_reason_in_the_order_a_claim_meets_them(owner, settings,
                                                     django_assert_max_num_queries):
    settings.PILOT_MAX_RUNNING_PER_CLIENT = 1
    now = timezone.now()
    parked = task(owner, "w", S.WAITING, waiting_for={"kind": "signal", "name": "go",
                                                      "step": 0})
    delayed = task(owner, "d", next_attempt_at=now + timedelta(hours=1))
    backoff = task(owner, "b", S.RETRYING, next_attempt_at=now + timedelta(seconds=30))
    task(owner, "r", S.RUNNING, lease_owner="w1", lease_expires_at=now + timedelta(minutes=1))
    capped = task(owner, "c", next_attempt_at=now - timedelta(seconds=1))
    with django_assert_max_num_queries(1):
        why = why_not_running([parked, delayed, backoff, capped], now=now, workers=lambda: 2)
    assert why[parked.pk].text == "waiting for signal go"
    assert why[delayed.pk].kind == "delayed" and why[delayed.pk].until == delayed.next_attempt_at
    assert why[backoff.pk].kind == "backoff"
    assert why[capped.pk].kind == "client_cap"
    assert why[capped.pk].text == ("at its client's cap: 1 of 1 running "
                                   "(PILOT_MAX_RUNNING_PER_CLIENT)")


def test_a_due_task_under_every_cap_is_queued_or_has_no_worker(owner, settings):
    settings.PILOT_MAX_RUNNING_PER_CLIENT = 0  # no cap
    now = timezone.now()
    due = task(owner, "q", next_attempt_at=now - timedelta(seconds=1))
    assert why_not_running([due], now=now, workers=lambda: 2)[due.pk].kind == "queued"
    assert why_not_running([due], now=now, workers=lambda: 0)[due.pk].kind == "no_worker"
    running = task(owner, "run", S.RUNNING, lease_owner="w1",
                   lease_expires_at=now + timedelta(minutes=1))
    assert why_not_running([running], now=now, workers=lambda: 2) == {}  # it runs
