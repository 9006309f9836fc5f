"""Waiting without a worker (docs/waiting.md): timers, signals, park and wake,
cancel of a waiting task — through the real worker entry point and dispatcher."""

import uuid

import pytest

from tests.support.helpers import audit, drain, ledger, pop_queued, rewind
from workflows.engine import task_cancel, task_retry
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.signals import task_signal
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskSignal
from workflows.rules.errors import (
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    InvalidTransition,
    PermissionDenied,
    TaskFinished,
    TaskNotFound,
    ValidationFailed,
)
from workflows.rules.states import TaskState as S
from workflows.testing import run_workflow
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def signaller(owner):
    from django.contrib.auth.models import Permission

    owner.user_permissions.add(Permission.objects.get(codename="signal_task"))
    return type(owner).objects.get(pk=owner.pk)


def trigger(owner, workflow, payload, key=None):
    return task_trigger(owner=owner, key=key or uuid.uuid4().hex, workflow=workflow,
                        payload=payload).task


def run_queued():
    for message in pop_queued():
        run_task(message)


def signal(task, user, name="decision", payload=None, key="k1"):
    return task_signal(task_id=task.pk, name=name, payload=payload, key=key, user=user,
                       actor=f"client:{user.username}")


def test_a_timer_parks_the_task_holding_no_worker_and_the_dispatcher_wakes_it_when_due(owner):
    task = trigger(owner, "demo.timer", {"seconds": 30})
    run_queued()
    task.refresh_from_db()
    assert task.state == S.WAITING
    assert task.lease_owner == "" and task.lease_expires_at is None
    assert task.waits_for["kind"] == "timer" and task.waits_for["step"] == 1
    assert [s.state for s in task.steps.order_by("index")] == ["succeeded", "running"]
    assert dispatch_once().woken == 0  # not due: nothing claims or wakes it
    assert pop_queued() == []
    rewind(task.pk, 31)
    task.refresh_from_db()
    task.waiting_for = {**task.waiting_for, "until": task.next_attempt_at.isoformat()}
    Task.objects.filter(pk=task.pk).update(waiting_for=task.waiting_for)
    assert dispatch_once().woken == 1
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.result == {"waited": 30}
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "park", "wake", "claim", "succeed"]
    # A wait is not an attempt: the claim after the wake continued the first.
    assert task.max_attempts - task.attempts == 3 - 1


def test_a_signal_sent_while_waiting_wakes_the_task_and_its_payload_is_the_steps_output(
        owner, signaller):
    task = trigger(owner, "demo.approval", {"timeout_seconds": 600})
    run_queued()
    task.refresh_from_db()
    assert task.state == S.WAITING and task.waits_for["name"] == "decision"
    sent = signal(task, signaller, payload={"approved": True, "by": "alice"})
    assert sent.http_status == 202 and sent.woke
    task.refresh_from_db()
    assert task.state == S.PENDING
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED
    assert task.result == {"approved": True, "by": "alice"}
    assert ledger(task.pk) == ["apply"]
    stored = TaskSignal.objects.get(task=task)
    assert stored.consumed_at is not None and stored.consumed_step == 1
    decision = StepCheckpoint.objects.get(task=task, name="decision")
    assert decision.output == {"approved": True, "by": "alice"}


def test_a_signal_sent_before_the_wait_is_kept_and_consumed_without_parking(owner, signaller):
    task = trigger(owner, "demo.approval", {})
    sent = signal(task, signaller, payload={"approved": False})
    assert sent.http_status == 202 and not sent.woke
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.result == {"approved": False}
    assert "park" not in [t for t, _, _ in audit(task.pk)]
    assert ledger(task.pk) == []


def test_each_signal_is_consumed_once_and_a_second_one_stays_in_the_mailbox(owner, signaller):
    task = trigger(owner, "demo.approval", {})
    signal(task, signaller, payload={"approved": True, "by": "first"}, key="a")
    signal(task, signaller, payload={"approved": True, "by": "second"}, key="b")
    run_queued()
    task.refresh_from_db()
    assert task.result == {"approved": True, "by": "first"}
    left = TaskSignal.objects.filter(task=task, consumed_at__isnull=True)
    assert [s.idempotency_key for s in left] == ["b"]


def test_the_same_key_replays_and_another_payload_under_it_is_refused(owner, signaller):
    task = trigger(owner, "demo.approval", {})
    first = signal(task, signaller, payload={"approved": True}, key="same")
    again = signal(task, signaller, payload={"approved": True}, key="same")
    assert again.replayed and again.http_status == 200 and again.signal.pk == first.signal.pk
    with pytest.raises(IdempotencyKeyReused):
        signal(task, signaller, payload={"approved": False}, key="same")
    assert TaskSignal.objects.filter(task=task).count() == 1


def test_a_finished_task_refuses_new_signals_but_replays_a_stored_one(owner, signaller):
    task = trigger(owner, "demo.approval", {})
    signal(task, signaller, payload={"approved": False}, key="early")
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED
    assert signal(task, signaller, payload={"approved": False}, key="early").replayed
    with pytest.raises(TaskFinished):
        signal(task, signaller, payload={"approved": True}, key="late")


def test_bad_signals_are_refused_and_change_nothing(owner, other_owner, signaller):
    task = trigger(owner, "demo.approval", {})
    with pytest.raises(ValidationFailed):
        signal(task, signaller, name="no spaces")
    with pytest.raises(ValidationFailed):
        signal(task, signaller, payload=[1, 2])
    with pytest.raises(IdempotencyKeyMissing):
        signal(task, signaller, key=None)
    with pytest.raises(TaskNotFound):  # another client's task: not even its existence
        task_signal(task_id=task.pk, name="decision", key="x", user=other_owner,
                    actor="client:client-b")
    plain = type(owner).objects.create_user("nosignal")
    theirs = trigger(plain, "demo.approval", {})
    with pytest.raises(PermissionDenied):  # its owner without workflows.signal_task
        task_signal(task_id=theirs.pk, name="decision", key="x", user=plain, actor="x")
    assert TaskSignal.objects.count() == 0


def test_a_signal_of_another_name_does_not_wake_the_wait(owner, signaller):
    task = trigger(owner, "demo.approval", {})
    run_queued()
    assert not signal(task, signaller, name="other").woke
    task.refresh_from_db()
    assert task.state == S.WAITING


def test_a_signal_wait_times_out_with_signal_timeout_by_the_dispatcher(owner):
    task = trigger(owner, "demo.approval", {"timeout_seconds": 5})
    run_queued()
    rewind(task.pk, 6)
    task.refresh_from_db()
    Task.objects.filter(pk=task.pk).update(
        waiting_for={**task.waiting_for, "until": task.next_attempt_at.isoformat()})
    assert dispatch_once().woken == 1
    run_queued()
    task.refresh_from_db()
    assert task.state == S.FAILED and task.error_type == "SignalTimeout"
    assert ledger(task.pk) == []


def test_cancelling_a_waiting_task_ends_it_and_its_wait_step(owner):
    task = trigger(owner, "demo.approval", {})
    run_queued()
    cancelled = task_cancel(task_id=task.pk, user=owner)
    assert cancelled.state == S.CANCELLED
    step = StepCheckpoint.objects.get(task=task, name="decision")
    assert step.state == "failed" and "cancelled while waiting" in step.error
    assert dispatch_once().woken == 0


def test_cancelling_a_waiting_saga_like_task_with_compensations_goes_through_cancelling(owner):
    from workflows.registry import registry

    wf = registry.define("tests.wait_after_effect")

    def undo(ctx):
        from workflows.models import DemoLedger

        DemoLedger.objects.create(task=ctx.task_id, action="undo")

    @wf.step(compensation=undo)
    def effect(ctx):
        return {"done": True}

    wf.wait_for_signal("go")
    try:
        task = trigger(owner, "tests.wait_after_effect", {})
        run_queued()
        task.refresh_from_db()
        assert task.state == S.WAITING
        assert task_cancel(task_id=task.pk, user=owner).state == S.CANCELLING
        drain(lambda: Task.objects.get(pk=task.pk).is_finished)
        task.refresh_from_db()
        assert task.state == S.CANCELLED and ledger(task.pk) == ["undo"]
    finally:
        registry.unregister("tests.wait_after_effect")


def test_a_waiting_task_cannot_be_retried_and_a_retried_one_waits_again(owner, signaller):
    task = trigger(owner, "demo.approval", {})
    run_queued()
    with pytest.raises(InvalidTransition):
        task_retry(task_id=task.pk, user=owner)
    task_cancel(task_id=task.pk, user=owner)
    task_retry(task_id=task.pk, user=owner)
    run_queued()
    task.refresh_from_db()
    assert task.state == S.WAITING
    signal(task, signaller, payload={"approved": True, "by": "bob"})
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.result == {"approved": True, "by": "bob"}


def test_run_workflow_takes_no_time_for_timers_and_delivers_signals_early():
    timer = run_workflow("demo.timer", {"seconds": 3600})
    assert timer.state == S.SUCCEEDED and timer.result == {"waited": 3600}
    approved = run_workflow("demo.approval", signals={"decision": {"approved": True, "by": "x"}})
    assert approved.result == {"approved": True, "by": "x"}
    timed_out = run_workflow("demo.approval")
    assert timed_out.state == S.FAILED and timed_out.error_type == "SignalTimeout"


# --- delayed start and priority -----------------------------------------------------------

def test_a_delayed_start_is_not_claimed_before_its_time_and_is_sent_once_due(owner):
    from datetime import timedelta

    from workflows.engine.store import store

    later = store().db_now() + timedelta(seconds=120)
    task = task_trigger(owner=owner, key="later", workflow="demo.echo", payload={},
                        run_after=later.isoformat()).task
    task.refresh_from_db()
    assert task.state == S.PENDING and task.next_attempt_at == later == task.run_after
    assert pop_queued() == []  # no message before it is due
    from workflows.engine.run import task_run

    assert task_run(task_id=task.pk).outcome == "skipped"  # a stray message claims nothing
    assert dispatch_once().owed_enqueued == 0
    rewind(task.pk, 121)
    assert dispatch_once().owed_enqueued == 1  # due: the dispatcher sends its message
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED


def test_a_run_after_in_the_past_runs_now_and_a_replay_returns_the_task_as_it_is(owner):
    from datetime import timedelta

    from django.utils import timezone

    first = task_trigger(owner=owner, key="past", workflow="demo.echo", payload={},
                         run_after="2001-01-01T00:00:00+00:00")
    assert first.outcome == "created" and pop_queued() == [str(first.task.pk)]
    again = task_trigger(owner=owner, key="past", workflow="demo.echo", payload={},
                         run_after=(timezone.now() + timedelta(days=1)).isoformat(), priority=5)
    assert again.outcome == "replayed" and again.task.pk == first.task.pk
    again.task.refresh_from_db()
    assert again.task.priority == 0


@pytest.mark.parametrize(("field", "value"), [
    ("run_after", "2026-12-24T18:00:00"),        # no offset
    ("run_after", "tomorrow"),
    ("run_after", "9999-01-01T00:00:00+00:00"),  # beyond PILOT_MAX_RUN_AFTER_DAYS
    ("priority", 101), ("priority", -101), ("priority", True), ("priority", 1.5),
])
def test_bad_run_after_and_priority_are_refused_and_create_nothing(owner, field, value):
    with pytest.raises(ValidationFailed) as refused:
        task_trigger(owner=owner, key="bad", workflow="demo.echo", payload={},
                     **{field: value})
    assert field in refused.value.errors
    assert not Task.objects.exists()


def test_among_due_tasks_the_highest_priority_is_claimed_first_then_the_oldest(owner):
    from workflows.engine.leases import lease_length
    from workflows.engine.store import store

    made = {}
    for key, priority in [("low-old", -5), ("mid-old", 0), ("high", 50), ("mid-new", 0)]:
        made[key] = task_trigger(owner=owner, key=key, workflow="demo.echo", payload={},
                                 priority=priority).task.pk
    order = []
    while (claimed := store().claim_next(worker="w", lease=lease_length())) is not None:
        order.append(claimed.task.idempotency_key)
    assert order == ["high", "mid-old", "mid-new", "low-old"]


def test_the_dispatcher_reports_when_the_next_timer_or_delayed_start_is_due(owner):
    from datetime import timedelta

    from workflows.engine.store import store

    start = store().db_now() + timedelta(seconds=300)
    task_trigger(owner=owner, key="later", workflow="demo.echo", payload={},
                 run_after=start.isoformat())
    assert dispatch_once().next_due == start  # the loop wakes for the delayed start
    timer = trigger(owner, "demo.timer", {"seconds": 60})
    run_queued()
    timer.refresh_from_db()
    assert timer.state == S.WAITING
    assert dispatch_once().next_due == timer.next_attempt_at < start  # and for the timer


def test_a_timed_out_wait_retried_from_the_start_waits_again_for_a_new_signal(owner, signaller):
    task = trigger(owner, "demo.approval", {"timeout_seconds": 5})
    signal(task, signaller, name="other", key="unrelated")  # kept: not what it waits for
    run_queued()
    rewind(task.pk, 6)
    task.refresh_from_db()
    Task.objects.filter(pk=task.pk).update(
        waiting_for={**task.waiting_for, "until": task.next_attempt_at.isoformat()})
    dispatch_once()
    run_queued()
    task.refresh_from_db()
    assert task.state == S.FAILED and task.error_type == "SignalTimeout"
    first_deadline = task.waiting_for["until"]
    task_retry(task_id=task.pk, user=owner, from_start=True)
    run_queued()
    task.refresh_from_db()
    assert task.state == S.WAITING and task.waits_for["name"] == "decision"
    assert task.waits_for["until"] > first_deadline  # a fresh deadline, not the old one
    signal(task, signaller, payload={"approved": True, "by": "second-try"}, key="k2")
    run_queued()
    task.refresh_from_db()
    assert task.result == {"approved": True, "by": "second-try"}
    prepare = StepCheckpoint.objects.get(task=task, name="prepare")
    assert prepare.attempts == 2  # run again from the start
    assert TaskSignal.objects.get(task=task, idempotency_key="unrelated").consumed_at is None
