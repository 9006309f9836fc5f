"""Deterministic crash windows: a named fault point makes the worker "die"
(SimulatedCrash, a BaseException nothing handles: the open transaction rolls
back, nothing else runs), then the lease runs out, the dispatcher recovers the
task and a new delivery resumes it."""

import uuid
from datetime import timedelta

import pytest

from tests.support.helpers import drain, expire_lease, pop_queued
from workflows.engine import faults
from workflows.engine.leases import lease_length
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.models import DemoOrder, StepCheckpoint, Task, TaskTransition
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sync(owner):
    def start(count=120, batch=None):
        batch = batch or uuid.uuid4().hex[:12]
        return task_trigger(owner=owner, key=batch, workflow="demo.sync_orders",
                            payload={"batch": batch, "count": count}).task, batch

    return start


def crash_once(point, task):
    [message] = pop_queued()
    with faults.armed(point), pytest.raises(faults.SimulatedCrash):
        run_task(message)
    task.refresh_from_db()
    return task


def recover_and_finish(task):
    expire_lease(task.pk)
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    return task


def step_attempts(task):
    return dict(StepCheckpoint.objects.filter(task_id=task.pk).values_list("name", "attempts"))


def test_crash_after_an_atomic_step_body_before_its_checkpoint_writes_once(sync):
    task, batch = sync()
    [message] = pop_queued()
    # fetch and transform pass the point first; `write` (atomic) crashes there.
    with faults.armed("after_step_body", skip=2), pytest.raises(faults.SimulatedCrash):
        run_task(message)
    task.refresh_from_db()
    assert task.state == S.RUNNING
    assert DemoOrder.objects.filter(batch=batch).count() == 0  # rolled back with the step
    task = recover_and_finish(task)
    assert (task.state, task.result) == (S.SUCCEEDED, {"written": 120})
    assert DemoOrder.objects.filter(batch=batch).count() == 120
    assert step_attempts(task) == {"fetch": 1, "transform": 1, "write": 2}
    assert task.attempts == 2


def test_crash_after_a_plain_step_body_runs_that_step_again(sync):
    task, batch = sync()
    task = crash_once("after_step_body", task)
    assert StepCheckpoint.objects.get(task_id=task.pk, name="fetch").state == "running"
    task = recover_and_finish(task)
    assert task.state == S.SUCCEEDED
    assert step_attempts(task) == {"fetch": 2, "transform": 1, "write": 1}
    assert DemoOrder.objects.filter(batch=batch).count() == 120


def test_crash_after_a_checkpoint_resumes_at_the_next_step(sync):
    task, batch = sync()
    task = crash_once("after_checkpoint", task)
    assert StepCheckpoint.objects.get(task_id=task.pk, name="fetch").state == "succeeded"
    task = recover_and_finish(task)
    assert task.state == S.SUCCEEDED
    assert step_attempts(task) == {"fetch": 1, "transform": 2, "write": 1}
    assert DemoOrder.objects.filter(batch=batch).count() == 120


def test_crash_right_after_the_claim_is_recovered(sync):
    task, _batch = sync()
    task = crash_once("after_claim", task)
    assert (task.state, task.attempts) == (S.RUNNING, 1)
    task = recover_and_finish(task)
    assert (task.state, task.attempts) == (S.SUCCEEDED, 2)
    assert list(TaskTransition.objects.filter(task_id=task.pk).order_by("id")
                .values_list("transition", flat=True)) == ["claim", "recover", "claim", "succeed"]


def test_crash_during_lease_renewal_loses_only_the_renewal(owner):
    task = task_trigger(owner=owner, key="slow-1", workflow="demo.slow",
                        payload={"steps": 2, "seconds": 0.3}).task
    from django.test import override_settings

    at_the_point = {}

    def look():  # the worker is at the point: what the database holds right then
        row = Task.objects.get(pk=task.pk)
        at_the_point.update(lease=row.lease_expires_at, token=row.lease_token,
                            held=row.lease_expires_at - store().db_now(),
                            s0=StepCheckpoint.objects.get(task_id=task.pk, name="s0").state)

    with override_settings(PILOT_HEARTBEAT_SECONDS=0.1), \
            faults.on("during_lease_renewal", look):
        task = crash_once("during_lease_renewal", task)
        # A renewal was due (a heartbeat interval since the last lease write) and not yet
        # sent: the lease left is at most the lease length less that interval.
        assert at_the_point["held"] <= lease_length() - timedelta(seconds=0.1)
        assert at_the_point["s0"] == "running"
        # ... and never sent: the lease is as it was at the point, the token the same.
        assert (task.state, task.attempts) == (S.RUNNING, 1)
        assert task.lease_expires_at == at_the_point["lease"]
        assert task.lease_token == at_the_point["token"]
        task = recover_and_finish(task)
    # Only the renewal (and the step it interrupted) was lost: s0 ran again, s1 once.
    assert (task.state, task.result) == (S.SUCCEEDED, {"completed_steps": 2})
    assert (task.attempts, step_attempts(task)) == (2, {"s0": 2, "s1": 1})
    assert list(TaskTransition.objects.filter(task_id=task.pk).order_by("id")
                .values_list("transition", flat=True)) == ["claim", "recover", "claim", "succeed"]


def test_crash_after_finishing_before_the_ack_makes_the_redelivery_a_no_op(sync):
    task, batch = sync()
    [message] = pop_queued()
    with faults.armed("before_ack"), pytest.raises(faults.SimulatedCrash):
        run_task(message)
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED
    assert run_task(message) == "skipped"  # django-q2 redelivers the unacknowledged message
    assert DemoOrder.objects.filter(batch=batch).count() == 120
    assert TaskTransition.objects.filter(task_id=task.pk).count() == 2


def test_a_crash_mid_step_resumes_from_the_cursor_it_saved(owner, temp_workflow):
    """A plain step saves a cursor page by page (`ctx.save_progress`); its worker
    dies on page 6; the lease runs out and the dispatcher recovers the task (the
    interrupted step is recorded failed). The next attempt reads the cursor and
    resumes at page 6, not 0 (docs/writing-workflows.md, progress). Review turn
    3's mutant M2 — the recover's write of the interrupted step also cleared its
    cursor — survived every test until this one."""
    starts = []
    wf = temp_workflow("t.cursor", max_attempts=3, backoff_initial=0, backoff_max=0)

    @wf.step
    def pages(ctx):
        start = (ctx.progress or {}).get("page", 0)
        starts.append(start)
        for page in range(start, 10):
            if page == 6 and ctx.attempt == 1:
                raise faults.SimulatedCrash("the worker dies mid-step")
            ctx.save_progress({"page": page + 1})
        return {"from": start}

    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="t.cursor",
                        payload={}).task
    [message] = pop_queued()
    with pytest.raises(faults.SimulatedCrash):
        run_task(message)
    assert StepCheckpoint.objects.get(task_id=task.pk).progress == {"page": 6}
    task = recover_and_finish(task)
    assert list(TaskTransition.objects.filter(task_id=task.pk).order_by("id")
            .values_list("transition", flat=True)) == ["claim", "recover", "claim", "succeed"]
    assert (task.state, task.result, starts) == (S.SUCCEEDED, {"from": 6}, [0, 6])
