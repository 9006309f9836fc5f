"""The dashboard's reads (workflows/admin/stats.py), fed by real engine runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.factories import make_task
from tests.support.helpers import drain, expire_lease
from workflows.admin import stats
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskReplay, TaskTransition
from workflows.rules.fingerprint import fingerprint
from workflows.rules.states import TaskState as S
from workflows.selectors import task_counts_by_state

# transaction=True: with the Redis broker an enqueue happens on commit.
pytestmark = pytest.mark.django_db(transaction=True)


def old_activity(owner, hours_ago: float) -> None:
    """A task, a replay and a success from `hours_ago`, as history would hold them."""
    at = timezone.now() - timedelta(hours=hours_ago)
    task = Task.objects.create(owner=owner, idempotency_key=f"old-{hours_ago}",
                               workflow="demo.echo", payload={},
                               fingerprint=fingerprint("demo.echo", {}), max_attempts=3,
                               created_at=at, updated_at=at)
    TaskReplay.objects.create(task=task, workflow="demo.echo", count=4, at=at)
    TaskTransition.objects.create(task=task, transition="succeed", from_state="running",
                                  to_state="succeeded", actor="worker", at=at)


def test_counts_by_state_include_every_state(owner):
    for state in (S.PENDING, S.PENDING, S.FAILED):
        make_task(owner, state=state)
    counts = task_counts_by_state()
    assert counts == {"pending": 2, "running": 0, "retrying": 0, "waiting": 0, "cancelling": 0,
                      "compensating": 0, "succeeded": 0, "failed": 1, "cancelled": 0}


def test_activity_per_hour_counts_triggers_replays_successes_failures_and_retries(owner):
    trigger = task_trigger
    trigger(owner=owner, key="e1", workflow="demo.echo", payload={"a": 1})
    trigger(owner=owner, key="e1", workflow="demo.echo", payload={"a": 1})   # replay
    trigger(owner=owner, key="e1", workflow="demo.echo", payload={"a": 1})   # replay
    trigger(owner=owner, key="f1", workflow="demo.flaky", payload={"fail_times": 2})
    trigger(owner=owner, key="s1", workflow="demo.saga", payload={"fail": True})
    drain()
    old_activity(owner, hours_ago=30)   # outside the window
    old_activity(owner, hours_ago=5)    # inside, five buckets back
    with CaptureQueriesContext(connection) as queries:
        buckets = stats.activity_per_hour(timezone.now())
    assert len(queries) == 4  # the folded mark (none: no dispatcher ran), then history
    assert len(buckets) == 24
    current, earlier = buckets[-1], buckets[-6]
    assert (current.triggers, current.replays, current.successes, current.failures,
            current.retries) == (3, 2, 2, 1, 2)
    assert (earlier.triggers, earlier.replays, earlier.successes) == (1, 4, 1)
    assert sum(b.triggers for b in buckets) == 4  # the 30-hour-old task is not counted
    assert buckets[0].start == buckets[-1].start - timedelta(hours=23)


def test_activity_after_now_belongs_to_no_bucket(owner):
    """`now` read just before an hour turns, rows written in the next hour by
    the time the chart reads them (or by a database clock ahead of this
    process's): the chart is the 24 hours up to `now`, it does not fail."""
    now = timezone.now()
    old_activity(owner, hours_ago=-1)  # an hour after now
    old_activity(owner, hours_ago=0)   # now
    buckets = stats.activity_per_hour(now)
    assert (sum(b.triggers for b in buckets), sum(b.replays for b in buckets),
            sum(b.successes for b in buckets)) == (1, 4, 1)


def test_tasks_past_their_lease_and_the_oldest_pending(owner):
    fresh = make_task(owner, state=S.RUNNING)
    stuck = make_task(owner, state=S.RUNNING)
    expire_lease(stuck.pk)
    first = make_task(owner, state=S.PENDING)
    second = make_task(owner, state=S.PENDING)
    now = timezone.now()
    # The past-lease rule is the stuck rule (workers.tasks_stuck), on both pages.
    from workflows.admin.workers import work_status

    expired = [s.task.pk for s in work_status(now, shares=False).stuck if s.lease_expired]
    assert expired == [stuck.pk] and fresh.pk not in expired
    assert [t.pk for t in stats.tasks_oldest_pending()] == [first.pk, second.pk]


def test_top_failing_workflows_with_their_latest_error(owner):
    make_task(owner, state=S.FAILED)
    make_task(owner, state=S.FAILED)
    saga = task_trigger(owner=owner, key="s", workflow="demo.saga", payload={"fail": True}).task
    drain()
    rows = stats.workflows_top_failing(timezone.now())
    assert [(r["workflow"], r["failures"]) for r in rows] == [("demo.echo", 2), ("demo.saga", 1)]
    assert rows[1]["latest_id"] == saga.pk
    assert rows[1]["latest_error"] == "NonRetryableError: confirmation refused (payload asked " \
                                      "to fail)"
    assert rows[0]["latest_error_type"] == "NonRetryableError"
    # Outside the window nothing counts.
    assert stats.workflows_top_failing(timezone.now() + timedelta(days=2)) == []
