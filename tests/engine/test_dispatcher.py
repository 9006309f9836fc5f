"""The dispatcher's four scans, one pass at a time."""

import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from tests.support.helpers import (
    drain,
    expire_lease,
    pop_queued,
    queued_task_ids,
    task_claim,
    wait_for,
)
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.operations import task_cancel
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.rules.errors import RetryableError
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start(owner):
    def trigger(workflow="demo.echo", payload=None):
        return task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                            payload=payload or {}).task

    return trigger


def test_an_expired_lease_is_recovered_and_the_lost_attempt_counts(start):
    task = start()
    pop_queued()
    task_claim(task_id=task.pk, worker="dead-worker")
    assert dispatch_once().recovered == 0  # lease still valid: nothing to do
    expire_lease(task.pk)
    report = dispatch_once()
    assert report.recovered == 1
    task.refresh_from_db()
    assert (task.state, task.attempts, task.error_type) == (S.RETRYING, 1, "LeaseExpired")
    audit = TaskTransition.objects.filter(task_id=task.pk).latest("id")
    assert audit.transition == "recover" and audit.actor.startswith("dispatcher:")
    assert "dead-worker" in audit.reason
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert (task.state, task.attempts) == (S.SUCCEEDED, 2)


def test_a_poison_task_that_kills_every_worker_ends_failed_after_max_attempts(start):
    poison = start("demo.slow", {"steps": 1, "seconds": 0})
    healthy = start()
    for attempt in range(1, 6):
        wait_for(lambda: Task.objects.get(pk=poison.pk).is_due(timezone.now()))
        # A worker claims it and dies; the lease runs out; the dispatcher recovers.
        assert task_claim(task_id=poison.pk, worker=f"doomed-{attempt}") is not None
        expire_lease(poison.pk)
        dispatch_once()
    poison.refresh_from_db()
    assert (poison.state, poison.attempts, poison.max_attempts) == (S.FAILED, 5, 5)
    assert poison.error_type == "LeaseExpired" and "no attempts left" in poison.error
    drain(lambda: Task.objects.get(pk=healthy.pk).is_finished)
    assert Task.objects.get(pk=healthy.pk).state == S.SUCCEEDED
    assert Task.objects.get(pk=poison.pk).state == S.FAILED


def test_due_retries_are_enqueued_once_and_not_before_they_are_due(start, temp_workflow):
    wf = temp_workflow("test.backoff", max_attempts=3, backoff_initial=3600, backoff_max=3600)

    @wf.step
    def fails_once(ctx):
        if ctx.attempt == 1:
            raise RetryableError("once")
        return "ok"

    task = start("test.backoff")
    drain(lambda: Task.objects.get(pk=task.pk).state == S.RETRYING)
    # Full jitter could draw a delay near 0: pin the retry an hour out so "not yet due"
    # holds whatever was drawn.
    Task.objects.filter(pk=task.pk).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    assert dispatch_once().retries_enqueued == 0
    assert queued_task_ids() == []
    task.refresh_from_db()
    assert (task.state, task.attempts) == (S.RETRYING, 1)
    Task.objects.filter(pk=task.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    assert dispatch_once().retries_enqueued == 1
    assert dispatch_once().retries_enqueued == 0  # already enqueued for this due time
    assert queued_task_ids() == [str(task.pk)]
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert Task.objects.get(pk=task.pk).result == "ok"


@pytest.mark.redis
def test_due_retries_go_ahead_of_a_backlog_of_new_triggers(start):
    """Work already under way does not wait behind new work: the dispatcher puts a
    due retry's message at the front of the Redis queue."""
    first, second = start(), start()
    pop_queued()
    for task in (first, second):
        assert task_claim(task_id=task.pk, worker="dead") is not None
        expire_lease(task.pk)
    assert dispatch_once().recovered == 2
    backlog = [start() for _ in range(3)]  # queued after the recovery, in order
    Task.objects.filter(pk=first.pk).update(next_attempt_at=timezone.now() - timedelta(2))
    Task.objects.filter(pk=second.pk).update(next_attempt_at=timezone.now() - timedelta(1))
    assert dispatch_once().retries_enqueued == 2
    queued = queued_task_ids()
    assert sorted(queued[:2]) == sorted([str(first.pk), str(second.pk)])
    assert queued[2:] == [str(t.pk) for t in backlog]


def test_the_next_due_retry_is_reported_so_the_loop_can_wake_for_it(start, temp_workflow):
    wf = temp_workflow("test.soon", max_attempts=2, backoff_initial=3600, backoff_max=3600)
    wf.add_step("boom", lambda ctx: (_ for _ in ()).throw(RetryableError("x")))
    task = start("test.soon")
    drain(lambda: Task.objects.get(pk=task.pk).state == S.RETRYING)
    # Pinned in the future (full jitter could draw ~0 s), so it is still pending when
    # dispatch_once looks: the report must name exactly that instant.
    due = timezone.now() + timedelta(minutes=30)
    Task.objects.filter(pk=task.pk).update(next_attempt_at=due)
    report = dispatch_once()
    assert report.retries_enqueued == 0
    assert report.next_due == due


def _waited(task, seconds):
    from django.db.models.functions import Now

    Task.objects.filter(pk=task.pk).update(enqueued_at=Now() - timedelta(seconds=seconds),
                                           next_attempt_at=Now() - timedelta(seconds=seconds))


def test_a_pending_task_whose_message_was_lost_is_enqueued_again(start, settings):
    task = start()
    pop_queued()  # the message is lost
    assert dispatch_once().reenqueued == 0  # too early to tell it from a slow one
    _waited(task, settings.PILOT_REENQUEUE_SECONDS + 1)
    assert dispatch_once().reenqueued == 1
    assert dispatch_once().reenqueued == 0
    assert queued_task_ids() == [str(task.pk)]


def test_drain_does_not_let_the_resend_hide_a_lost_message(start, settings):
    task = start()
    pop_queued()  # the message is lost, as with a broken enqueue
    _waited(task, settings.PILOT_REENQUEUE_SECONDS + 1)
    with pytest.raises(AssertionError, match="re-sent 1 lost task message"):
        drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    drain(lambda: Task.objects.get(pk=task.pk).is_finished, resend_ok=True)
    assert Task.objects.get(pk=task.pk).state == S.SUCCEEDED


def test_a_lost_message_is_resent_while_the_fleet_keeps_claiming_other_work(start, settings):
    """Review turn 3, F1: the re-send used to wait until nobody had claimed
    anything for PILOT_REENQUEUE_SECONDS — a fleet busy with runs longer than
    its drain window kept a lost task waiting forever. Liveness is decided per
    task: its message is older than that, so it gets another."""
    from workflows.engine.run import task_run

    lost = start()
    pop_queued()  # its message is lost
    _waited(lost, settings.PILOT_REENQUEUE_SECONDS + 1)
    busy = start()
    assert task_run(task_id=busy.pk, worker="w").outcome == "succeeded"  # a claim just now
    pop_queued()
    assert dispatch_once().reenqueued == 1
    assert queued_task_ids() == [str(lost.pk)]


def test_a_backlog_gets_a_few_resends_a_pass_oldest_first_each_at_most_once_a_period(
        start, settings):
    """Issue 16: under a backlog every pending task used to be re-sent every
    10 s — a duplicate storm exactly when the system was overloaded. A backlog
    whose messages are merely slow gets RESENDS_PER_PASS duplicates a pass, for
    the oldest due tasks (those the workers take next anyway), and no task a
    second one within PILOT_REENQUEUE_SECONDS."""
    from workflows.engine.dispatcher import RESENDS_PER_PASS as K

    backlog = [start() for _ in range(10)]
    pop_queued()
    for age, task in enumerate(reversed(backlog)):  # the first triggered is the oldest
        _waited(task, settings.PILOT_REENQUEUE_SECONDS + 5 + age)
    assert dispatch_once().reenqueued == K
    assert pop_queued() == [str(t.pk) for t in backlog[:K]]  # oldest first
    assert dispatch_once().reenqueued == K  # the next oldest: the first K just had one
    assert pop_queued() == [str(t.pk) for t in backlog[K:2 * K]]
    assert dispatch_once().reenqueued == len(backlog) - 2 * K
    assert pop_queued() == [str(t.pk) for t in backlog[2 * K:]]
    assert dispatch_once().reenqueued == 0  # every task had its one message this period


def test_a_cancelling_task_whose_worker_died_is_finished(start, owner, temp_workflow):
    undone = []
    wf = temp_workflow("test.orphan")
    wf.add_step("one", lambda ctx: "done", compensation=lambda ctx: undone.append(ctx.output))
    wf.add_step("two", lambda ctx: "done")

    plain = start()
    pop_queued()
    task_claim(task_id=plain.pk, worker="dies")
    task_cancel(task_id=plain.pk, user=owner)
    expire_lease(plain.pk)
    assert dispatch_once().cancels_finished == 1  # nothing to compensate: settled here
    assert Task.objects.get(pk=plain.pk).state == S.CANCELLED

    saga = start("test.orphan")
    claim = task_claim(task_id=pop_queued()[0], worker="dies-after-one")
    from workflows.engine.store import rows, store

    now = timezone.now()
    store().write_steps(claim.lease, [rows.started(0, "one", 1, now)])
    store().write_steps(claim.lease, [rows.succeeded(0, "one", "done", now, compensable=True),
                                      rows.started(1, "two", 1, now)])
    task_cancel(task_id=saga.pk, user=owner)
    expire_lease(saga.pk)
    assert dispatch_once().compensations_enqueued == 1
    assert dispatch_once().compensations_enqueued == 0
    drain(lambda: Task.objects.get(pk=saga.pk).is_finished)
    assert Task.objects.get(pk=saga.pk).state == S.CANCELLED
    assert undone == ["done"]
    assert StepCheckpoint.objects.get(task_id=saga.pk, index=0).state == "compensated"


def test_an_idle_pass_is_a_handful_of_small_queries(start, django_assert_max_num_queries):
    for _ in range(5):
        start()
    drain()
    # 15: the scans of dispatcher.py's docstring, the wake of due waits and of
    # parents whose children ended among them.
    with django_assert_max_num_queries(15):
        report = dispatch_once()
    assert report.actions == 0


def test_recover_tasks_runs_one_pass_and_prints_what_it_did(start, capsys):
    task = start()
    pop_queued()
    task_claim(task_id=task.pk, worker="gone")
    expire_lease(task.pk)
    call_command("recover_tasks")
    out = capsys.readouterr().out
    assert '"recovered": 1' in out
    assert Task.objects.get(pk=task.pk).state == S.RETRYING
