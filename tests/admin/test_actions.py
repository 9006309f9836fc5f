"""The operator actions' dry run and application (workflows/admin/actions.py)."""

from __future__ import annotations

import pytest

from tests.factories import make_task
from tests.support.helpers import drain, pop_queued
from workflows.admin.actions import (
    ACTIONS,
    CANCEL,
    RETRY,
    RETRY_FROM_START,
    actions_apply,
    actions_available,
    actions_plan,
)
from workflows.engine.operations import task_cancel
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.rules.errors import RetryableError
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

# transaction=True: with the Redis broker an enqueue happens on commit.
pytestmark = pytest.mark.django_db(transaction=True)


def test_each_action_is_gated_by_the_permission_declared_on_its_transition():
    assert CANCEL.permission == "workflows.cancel_task"
    assert RETRY.permission == RETRY_FROM_START.permission == "workflows.retry_task"
    assert set(ACTIONS) == {"cancel", "retry", "retry_from_start"}


def test_available_means_legal_and_permitted(owner, operator, viewer):
    pending, failed = make_task(owner, state=S.PENDING), make_task(owner, state=S.FAILED)
    assert actions_available(pending, operator) == [CANCEL]
    assert actions_available(failed, operator) == [RETRY, RETRY_FROM_START]
    assert actions_available(pending, viewer) == actions_available(failed, viewer) == []
    # The task's owner may cancel through the API, but not in the console.
    assert actions_available(pending, owner) == []


def undo(ctx):
    return {"undone": True}


def test_cancel_plan_names_the_compensations_a_worker_will_run(owner, operator, temp_workflow):
    """A task cancelled while it waits out a backoff, with two compensable steps
    done, goes through `cancelling` so a worker can undo them; the plan says so,
    and the engine then does exactly that."""
    wf = temp_workflow("t.admin_comp", max_attempts=3, backoff_initial=3600, backoff_max=3600)
    wf.step(lambda ctx: {"a": 1}, name="reserve", compensation=undo)
    wf.step(lambda ctx: {"b": 1}, name="charge", compensation=undo)

    @wf.step
    def confirm(ctx):
        raise RetryableError("upstream unavailable")

    task = task_trigger(owner=owner, key="comp", workflow="t.admin_comp", payload={}).task
    for task_id in pop_queued():
        run_task(task_id)
    task.refresh_from_db()
    assert task.state == S.RETRYING
    [plan] = actions_plan(CANCEL, [task])
    assert (plan.changes, plan.outcome) == (True, "retrying → cancelling")
    assert plan.detail == ("a worker runs the compensations of charge, reserve, then it "
                           "becomes cancelled")
    [result] = actions_apply(CANCEL, [task], user=operator, reason="")
    assert result.ok and result.after == S.CANCELLING
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert Task.objects.get(pk=task.pk).state == S.CANCELLED


def test_cancel_plan_for_running_and_finished_tasks(owner):
    running, done = make_task(owner, state=S.RUNNING), make_task(owner, state=S.SUCCEEDED)
    plans = actions_plan(CANCEL, [running, done])
    assert [(p.changes, p.outcome) for p in plans] == [
        (True, "running → cancelling"), (False, "no change")]
    assert "next step boundary or heartbeat" in plans[0].detail
    assert plans[1].detail == "a succeeded task cannot be cancelled"


def test_retry_plan_says_where_the_run_resumes(owner, temp_workflow):
    wf = temp_workflow("t.admin_resume", max_attempts=4)
    wf.step(lambda ctx: 1, name="s0")
    wf.step(lambda ctx: 2, name="s1")

    @wf.step
    def s2(ctx):
        raise ValueError("a bug in s2")

    task = task_trigger(owner=owner, key="resume", workflow="t.admin_resume", payload={}).task
    for task_id in pop_queued():
        run_task(task_id)
    task.refresh_from_db()
    assert task.state == S.FAILED
    [resume] = actions_plan(RETRY, [task])
    assert (resume.changes, resume.outcome) == (True, "failed → pending")
    assert resume.detail == "resumes after its finished step(s) s0, s1; a fresh budget of 4 " \
                            "attempt(s)"
    [again] = actions_plan(RETRY_FROM_START, [task])
    assert again.detail == "every step runs again from the first (2 finished step(s) reset); " \
                           "a fresh budget of 4 attempt(s)"
    [nothing_done] = actions_plan(RETRY, [make_task(owner, state=S.CANCELLED)])
    assert nothing_done.detail == "runs from the first step (none finished); a fresh budget " \
                                  "of 3 attempt(s)"
    [not_now] = actions_plan(RETRY, [make_task(owner, state=S.RUNNING)])
    assert (not_now.changes, not_now.outcome) == (False, "no change")


def test_apply_reports_each_task_and_one_refusal_does_not_undo_another(owner, operator):
    a, b = make_task(owner, state=S.PENDING), make_task(owner, state=S.PENDING)
    task_cancel(task_id=b.pk, user=operator, reason="first")  # b is cancelled meanwhile
    results = actions_apply(CANCEL, [a, b], user=operator, reason="bulk")
    assert [(r.ok, r.after) for r in results] == [(True, S.CANCELLED), (False, S.PENDING)]
    assert results[1].detail == "invalid_transition: A cancelled task cannot be cancelled"
    assert Task.objects.get(pk=a.pk).state == S.CANCELLED
