"""Worker and dispatcher isolation (docs/design.md, "Worker isolation",
"Dispatcher"): whatever a workflow does, `task_run` returns normally — no
control-flow signal, no error escapes it — and one bad task never stops the
dispatcher from handling the others."""

import threading
import uuid

import pytest
from django.db import OperationalError

from tests.support.helpers import audit, expire_lease, pop_queued
from workflows.engine import faults
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.loop import dispatcher_loop
from workflows.engine.operations import task_cancel
from workflows.engine.run import RunReport, task_run
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.registry import registry
from workflows.rules.errors import CancelRequested, LeaseLost, RetryableError
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


def trigger(owner, workflow, payload=None):
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                        payload=payload or {}).task
    pop_queued()
    return task


@pytest.fixture
def saga(temp_workflow):
    wf = temp_workflow("t.iso", max_attempts=2, backoff_initial=0, backoff_max=0)
    wf.add_step("a", lambda ctx: 1, compensation=lambda ctx: None)
    wf.add_step("b", lambda ctx: 2, atomic=True)
    return wf


# A fault at every point a run passes, of every kind a workflow or the
# database could throw at it.
POINTS = ["after_claim", "after_step_body", "after_checkpoint", "after_atomic_commit"]
ERRORS = {
    "lease_lost": lambda: LeaseLost("stolen"),
    "cancel_requested": lambda: CancelRequested("stop"),
    "database_gone": lambda: OperationalError("server closed the connection"),
    "a_bug": lambda: KeyError("engine bug"),
}


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("error", ERRORS)
def test_task_run_returns_normally_whatever_is_raised_inside_it(owner, saga, point, error):
    """Item 4: django-q2's worker catches only Exception; a BaseException (the
    worker's own signals) escaping task_run would kill the worker process and
    leave the message unacknowledged."""
    task = trigger(owner, "t.iso")
    with faults.armed(point, error=ERRORS[error]()):
        report = task_run(task_id=task.pk, worker="w")
    assert isinstance(report, RunReport) and report.outcome
    # Whatever happened, the task is in a legal state the dispatcher can take on.
    task.refresh_from_db()
    assert task.state in (S.RUNNING, S.RETRYING, S.SUCCEEDED, S.FAILED, S.COMPENSATING)


def test_a_step_that_raises_the_workers_own_signals_does_not_escape(owner, temp_workflow):
    wf = temp_workflow("t.misuse", max_attempts=1)

    @wf.step
    def confused(ctx):
        raise LeaseLost("a workflow raising the engine's signal itself")

    task = trigger(owner, "t.misuse")
    assert run_task(str(task.pk)) == "lease_lost"
    assert Task.objects.get(pk=task.pk).state == S.RUNNING  # the lease will run out


def test_a_cancel_racing_the_failure_of_a_removed_workflow_ends_cancelled(owner, temp_workflow):
    """Item 4: the workflow is gone (a deploy removed it) and a cancel lands
    right after the claim: the run notices the cancel when it writes the
    failure, takes the cancel over and ends it."""
    wf = temp_workflow("t.gone", max_attempts=1)
    wf.step(lambda ctx: 1, name="s")
    task = trigger(owner, "t.gone")
    registry.unregister("t.gone")
    with faults.on("after_claim", lambda: task_cancel(task_id=task.pk, user=owner)):
        report = task_run(task_id=task.pk, worker="A")
    assert report.outcome == "cancelled"
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "cancel", "resume", "finish_cancel"]


def test_taking_over_the_cancel_of_a_removed_workflow_records_what_is_left(
        owner, temp_workflow):
    """Item 4: COMPENSATE mode when the workflow cannot be read: the owed
    compensation is recorded as failed, naming the reason, and the cancel ends
    (no illegal `fail` from cancelling)."""
    wf = temp_workflow("t.iso_gone", max_attempts=2, backoff_initial=0, backoff_max=0)
    wf.add_step("a", lambda ctx: 1, compensation=lambda ctx: None)
    wf.add_step("b", _raise_retryable)
    task = trigger(owner, "t.iso_gone")
    assert task_run(task_id=task.pk, worker="A").outcome == "retrying"
    assert task_cancel(task_id=task.pk, user=owner).state == S.CANCELLING
    pop_queued()
    registry.unregister("t.iso_gone")
    report = task_run(task_id=task.pk, worker="C")
    assert report.outcome == "cancelled"
    task.refresh_from_db()
    assert task.error_type == "CompensationFailed"
    assert "No workflow is registered as 't.iso_gone'" in task.error
    assert StepCheckpoint.objects.get(task_id=task.pk, name="a").state == "compensation_failed"


def _lost_long_ago(task):
    """Its message was lost, and it has waited long enough, with nobody claiming
    anything, for the dispatcher to wake the workers."""
    from datetime import timedelta

    from django.db.models.functions import Now

    Task.objects.filter(pk=task.pk).update(enqueued_at=Now() - timedelta(minutes=1),
                                           next_attempt_at=Now() - timedelta(minutes=1))
    TaskTransition.objects.filter(transition="claim").update(
        at=Now() - timedelta(minutes=1))


def _raise_retryable(ctx):
    raise RetryableError("later")


def test_one_failing_row_does_not_stop_the_dispatcher(owner, monkeypatch):
    """Item 8: a failure while handling one task is that task's problem:
    logged, counted, rolled back alone; the other rows are still handled, and
    the pass completes (the re-enqueue scan after it still runs)."""
    tasks = [trigger(owner, "demo.echo") for _ in range(3)]
    from tests.support.helpers import task_claim

    for task in tasks:
        task_claim(task_id=task.pk, worker="dead")
        expire_lease(task.pk)
    lost = trigger(owner, "demo.echo")
    _lost_long_ago(lost)
    real = type(store()).transition
    bad = tasks[1].pk

    def transition(self, task, name, **kwargs):
        if task.pk == bad:
            raise RuntimeError("a row the dispatcher cannot handle")
        return real(self, task, name, **kwargs)

    monkeypatch.setattr(type(store()), "transition", transition)
    report = dispatch_once()
    assert (report.recovered, report.errors, report.reenqueued) == (2, 1, 1)
    states = {t.pk: Task.objects.get(pk=t.pk).state for t in tasks}
    assert states == {tasks[0].pk: S.RETRYING, bad: S.RUNNING, tasks[2].pk: S.RETRYING}
    from workflows.observability.metrics import DISPATCHER_ERRORS

    before = DISPATCHER_ERRORS._value.get()
    dispatch_once()
    assert DISPATCHER_ERRORS._value.get() == before + 1
    monkeypatch.setattr(type(store()), "transition", real)
    assert dispatch_once().recovered == 1  # the bad row is handled once it can be


def test_the_dispatcher_loop_outlives_a_pass_that_raises(monkeypatch):
    from workflows.engine import loop

    calls = []
    real = loop.dispatch_once

    def flaky(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug in one pass")
        return real(**kwargs)

    monkeypatch.setattr(loop, "dispatch_once", flaky)
    assert dispatcher_loop(threading.Event(), poll=0.01, max_passes=2) == 2
    assert len(calls) == 3


def test_a_task_whose_plan_now_raises_can_be_cancelled_and_does_not_stall_others(
        owner, temp_workflow):
    """Item 8: after a deploy the workflow's plan raises for this payload. The
    dispatcher never runs plan code, so it keeps moving the other tasks; a
    cancel is decided from the checkpoints (no 500); the worker that takes the
    cancel over records the compensation it cannot run."""
    broken = [False]

    def plan(wf, payload):
        if broken[0]:
            raise KeyError("mode")
        return wf.steps

    wf = temp_workflow("t.planned", max_attempts=3, backoff_initial=0, backoff_max=0,
                       plan=plan)
    wf.add_step("a", lambda ctx: 1, compensation=lambda ctx: None)
    wf.add_step("b", _raise_retryable)
    task = trigger(owner, "t.planned")
    assert task_run(task_id=task.pk, worker="A").outcome == "retrying"
    other = trigger(owner, "demo.echo")
    _lost_long_ago(other)
    broken[0] = True
    assert task_cancel(task_id=task.pk, user=owner).state == S.CANCELLING
    pop_queued()
    Task.objects.filter(pk=task.pk).update(enqueued_at=None)
    report = dispatch_once()
    assert (report.compensations_enqueued, report.reenqueued, report.errors) == (1, 1, 0)
    assert task_run(task_id=task.pk, worker="C").outcome == "cancelled"
    assert "the plan of t.planned raised KeyError" in Task.objects.get(pk=task.pk).error
