"""Database time (docs/design.md, "Time"): whether a retry is due, a lease
expired or a message stale is decided by the database's clock, never by the
clocks of the machines involved. Here the process's own clock (Django's
`timezone.now`) is skewed by a minute either way; nothing changes."""

import uuid
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from tests.support.helpers import pop_queued, task_claim
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.rules.errors import RetryableError
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def skew(monkeypatch):
    real = timezone.now

    def set_skew(seconds: float):
        monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=seconds))

    return set_skew


@pytest.fixture
def retrying(owner, temp_workflow):
    wf = temp_workflow("t.skew", max_attempts=3, backoff_initial=1, backoff_max=1)
    runs = []

    @wf.step
    def s(ctx):
        runs.append(1)
        if len(runs) == 1:
            raise RetryableError("once")
        return "ok"

    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="t.skew", payload={}).task
    [message] = pop_queued()
    assert run_task(message) == "retrying"
    return task


def _due_in(task, seconds: float) -> None:
    Task.objects.filter(pk=task.pk).update(next_attempt_at=Now() + timedelta(seconds=seconds))


@pytest.mark.parametrize("seconds", [-60, 60])
def test_a_retry_is_neither_early_nor_late_whatever_the_process_clock_says(
        retrying, skew, seconds):
    """Item 7: a worker 50 ms (here: a minute) behind the dispatcher used to
    refuse the retry the dispatcher had just sent, and nothing re-sent it for
    10 s. Now both ask the database."""
    skew(seconds)
    _due_in(retrying, 30)
    assert dispatch_once().retries_enqueued == 0   # not due by the database: not sent
    assert run_task(str(retrying.pk)) == "skipped"  # and not claimed early
    _due_in(retrying, -0.001)
    assert dispatch_once().retries_enqueued == 1
    [message] = pop_queued()
    assert run_task(message) == "succeeded"


@pytest.mark.parametrize("seconds", [-60, 60])
def test_leases_expire_by_the_databases_clock(owner, skew, seconds):
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.echo",
                        payload={}).task
    pop_queued()
    skew(seconds)
    claimed = task_claim(task_id=task.pk, worker="w")
    assert abs((claimed.task.lease_expires_at - claimed.db_now).total_seconds() - 60) < 1
    assert dispatch_once().recovered == 0  # a fresh lease, whatever this clock says
    Task.objects.filter(pk=task.pk).update(lease_expires_at=Now() - timedelta(milliseconds=1))
    assert dispatch_once().recovered == 1
    assert Task.objects.get(pk=task.pk).state == S.RETRYING


@pytest.mark.parametrize("seconds", [-60, 60])
def test_a_lost_message_is_resent_after_ten_database_seconds(owner, skew, seconds):
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.echo",
                        payload={}).task
    pop_queued()
    skew(seconds)
    assert dispatch_once().reenqueued == 0
    Task.objects.filter(pk=task.pk).update(enqueued_at=Now() - timedelta(seconds=11),
                                           next_attempt_at=Now() - timedelta(seconds=11))
    assert dispatch_once().reenqueued == 1


@pytest.mark.parametrize("seconds", [-60, 60])
def test_an_idempotency_key_expires_by_the_databases_clock(owner, skew, seconds):
    key = uuid.uuid4().hex
    first = task_trigger(owner=owner, key=key, workflow="demo.echo", payload={}).task
    [message] = pop_queued()
    assert run_task(message) == "succeeded"
    skew(seconds)
    Task.objects.filter(pk=first.pk).update(expires_at=Now() + timedelta(seconds=30))
    assert task_trigger(owner=owner, key=key, workflow="demo.echo",
                        payload={}).outcome == "replayed"
    Task.objects.filter(pk=first.pk).update(expires_at=Now() - timedelta(seconds=1))
    again = task_trigger(owner=owner, key=key, workflow="demo.echo", payload={})
    assert again.outcome == "created" and again.task.pk != first.pk


@pytest.mark.parametrize("seconds", [-60, 60])
def test_cleanup_judges_expiry_by_the_databases_clock(owner, skew, seconds):
    """Review turn 3, F4: cleanup on a host whose clock ran a minute ahead
    deleted a key with 30 s left by the database; the upstream's retry then made
    a second task and ran the workflow again."""
    from workflows.engine.cleanup import tasks_cleanup

    key = uuid.uuid4().hex
    first = task_trigger(owner=owner, key=key, workflow="demo.echo", payload={}).task
    [message] = pop_queued()
    assert run_task(message) == "succeeded"
    Task.objects.filter(pk=first.pk).update(expires_at=Now() + timedelta(seconds=30),
                                            finished_at=Now() - timedelta(seconds=30))
    skew(seconds)
    assert tasks_cleanup().tasks == 0
    assert tasks_cleanup(older_than=timedelta(seconds=45)).tasks == 0  # finished 30 s ago
    assert task_trigger(owner=owner, key=key, workflow="demo.echo",
                        payload={}).outcome == "replayed"  # the key is still remembered
    assert tasks_cleanup(older_than=timedelta(seconds=15)).tasks == 1
    assert not Task.objects.filter(pk=first.pk).exists()


@pytest.mark.parametrize("seconds", [-60, 60])
def test_the_backlog_gauge_counts_due_retries_by_the_databases_clock(retrying, skew, seconds):
    from workflows.selectors import task_backlog

    skew(seconds)
    _due_in(retrying, 30)
    assert task_backlog()[0] == 0
    _due_in(retrying, -0.001)
    assert task_backlog()[0] == 1
