"""Errors at COMMIT (docs/design.md, "Atomic steps"): the reply to an atomic
step's COMMIT can be lost while the commit happened, and a COMMIT can fail
(a deferred constraint) after the transition was applied in memory. The worker
re-reads before it decides; a succeeded checkpoint is never downgraded, and the
in-memory task never claims a state the database does not have."""

import contextlib
import uuid

import pytest
from django.db import OperationalError, connection

from tests.support.helpers import audit, drain, pop_queued
from workflows.engine import faults
from workflows.engine.triggers import task_trigger
from workflows.models import DemoOrder, StepCheckpoint, Task, TaskReplay
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)

@contextlib.contextmanager
def lost_commit_reply(monkeypatch):
    """While armed (`armed["on"] = True`), the next COMMIT goes through on the
    server but its reply is lost: the client sees the connection error."""
    armed = {"on": False}
    real = connection.commit

    def commit():
        real()
        if armed["on"]:
            armed["on"] = False
            raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(connection, "commit", commit)
    try:
        yield armed
    finally:
        monkeypatch.undo()


def test_a_lost_reply_to_an_atomic_steps_commit_does_not_run_it_again(owner, temp_workflow,
                                                                      monkeypatch):
    """Item 2: the server committed the step (rows and checkpoint), the reply
    was lost. The worker re-reads, finds the checkpoint, and goes on: 7 rows,
    not 14, and the step stays succeeded."""
    batch = uuid.uuid4().hex[:8]
    wf = temp_workflow("t.lost_reply", max_attempts=3, backoff_initial=0, backoff_max=0)


    @wf.step(atomic=True)
    def write(ctx):
        DemoOrder.objects.bulk_create([DemoOrder(batch=batch, n=n) for n in range(7)])
        armed["on"] = True  # this step's COMMIT loses its reply
        return 7

    @wf.step
    def after(ctx):
        return ctx.outputs["write"]

    task = task_trigger(owner=owner, key=batch, workflow="t.lost_reply", payload={}).task
    [message] = pop_queued()
    with lost_commit_reply(monkeypatch) as armed:
        assert run_task(message) == "succeeded"
    task.refresh_from_db()
    assert (task.state, task.result, task.attempts) == (S.SUCCEEDED, 7, 1)
    assert DemoOrder.objects.filter(batch=batch).count() == 7
    assert StepCheckpoint.objects.get(task_id=task.pk, name="write").attempts == 1


def test_a_lost_reply_to_the_last_atomic_steps_commit_ends_the_run_succeeded(
        owner, temp_workflow, monkeypatch):
    batch = uuid.uuid4().hex[:8]
    wf = temp_workflow("t.lost_last", max_attempts=3, backoff_initial=0, backoff_max=0)

    @wf.step(atomic=True)
    def write(ctx):
        DemoOrder.objects.bulk_create([DemoOrder(batch=batch, n=n) for n in range(3)])
        armed["on"] = True
        return 3

    task = task_trigger(owner=owner, key=batch, workflow="t.lost_last", payload={}).task
    [message] = pop_queued()
    with lost_commit_reply(monkeypatch) as armed:
        assert run_task(message) == "succeeded"
    assert Task.objects.get(pk=task.pk).state == S.SUCCEEDED
    assert DemoOrder.objects.filter(batch=batch).count() == 3
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "succeed"]


def test_an_error_before_commit_is_the_steps_failure_and_its_rows_are_gone(
        owner, temp_workflow):
    """The other side of the same decision: when the transaction did not
    commit, the re-read finds no checkpoint, the step failed (retryably), and
    the next attempt writes the rows once."""
    batch = uuid.uuid4().hex[:8]
    wf = temp_workflow("t.failed_commit", max_attempts=3, backoff_initial=0, backoff_max=0)

    @wf.step(atomic=True)
    def write(ctx):
        DemoOrder.objects.bulk_create([DemoOrder(batch=batch, n=n) for n in range(4)])
        return 4

    @wf.step
    def after(ctx):
        return ctx.outputs["write"]

    task = task_trigger(owner=owner, key=batch, workflow="t.failed_commit", payload={}).task
    [message] = pop_queued()
    with faults.armed("after_step_body", error=OperationalError("connection reset")):
        assert run_task(message) == "retrying"
    assert DemoOrder.objects.filter(batch=batch).count() == 0
    assert StepCheckpoint.objects.get(task_id=task.pk, name="write").state == "failed"
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert Task.objects.get(pk=task.pk).state == S.SUCCEEDED
    assert DemoOrder.objects.filter(batch=batch).count() == 4


@pytest.mark.postgres
def test_a_commit_that_fails_in_the_last_atomic_step_leaves_no_phantom_success(
        owner, temp_workflow):
    """Item 2, second half: a deferred foreign key fails at COMMIT of the last
    atomic step, after `succeed` was applied in memory. The worker re-reads,
    brings its task back to `running`, and fails it (IntegrityError is not
    retryable) — it is not stranded `running` until its lease expires."""
    wf = temp_workflow("t.deferred_fk", max_attempts=3, backoff_initial=0, backoff_max=0)

    @wf.step(atomic=True)
    def write(ctx):
        TaskReplay.objects.create(task_id=uuid.uuid4(), workflow="x")  # dangling FK
        return 1

    task = task_trigger(owner=owner, key="deferred", workflow="t.deferred_fk",
                        payload={}).task
    [message] = pop_queued()
    assert run_task(message) == "failed"
    task.refresh_from_db()
    assert (task.state, task.error_type) == (S.FAILED, "IntegrityError")
    assert task.lease_expires_at is None and task.result is None
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "fail"]
    assert connection.is_usable()
