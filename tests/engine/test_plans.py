"""Plans (engine/plans.py): what a run, a cancel or a retry will do, decided
before it is done, from the task and its checkpoints."""

from datetime import timedelta

import pytest

from tests.factories import make_task
from workflows.engine.plans import (
    Plan,
    PlanUnavailable,
    cancel_plan,
    owed_compensations,
    retry_plan,
)
from workflows.engine.store import store
from workflows.models import StepCheckpoint
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


def saga_with(owner, states: dict[int, str], *, state=S.PENDING):
    task = make_task(owner, workflow="demo.saga", payload={"fail": True}, state=state)
    for index, state in states.items():
        StepCheckpoint.objects.create(task_id=task.pk, index=index,
                                      name=("reserve", "charge", "confirm")[index], state=state,
                                      attempts=1, compensable=True)
    return task


def test_a_plan_refuses_a_checkpoint_that_names_another_step(owner):
    task = saga_with(owner, {0: "succeeded"})
    StepCheckpoint.objects.filter(task_id=task.pk, index=0).update(name="renamed")
    with pytest.raises(PlanUnavailable) as refused:
        Plan.build(task, store().checkpoints(task.pk))
    assert refused.value.error_type == "WorkflowChanged"


def test_a_plan_resumes_after_the_succeeded_steps(owner):
    task = saga_with(owner, {0: "succeeded", 1: "failed"})
    plan = Plan.build(task, store().checkpoints(task.pk))
    assert plan.todo() == [1, 2] and list(plan.done()) == [0]


def test_owed_compensations_are_the_compensable_finished_steps_last_first(owner):
    task = saga_with(owner, {0: "succeeded", 1: "succeeded", 2: "failed"})
    assert owed_compensations([task.pk]) == {task.pk: ["charge", "reserve"]}


def test_cancel_plans_by_state(owner):
    pending = make_task(owner)
    assert cancel_plan(pending, []).target == S.CANCELLED
    assert cancel_plan(pending, ["reserve"]).target == S.CANCELLING
    assert cancel_plan(pending, ["reserve"]).enqueue
    running = store().claim(make_task(owner).pk, worker="w", lease=timedelta(seconds=30)).task
    assert (cancel_plan(running, []).target, cancel_plan(running, []).compensate) == (
        S.CANCELLING, True)
    done = make_task(owner, state=S.SUCCEEDED)
    assert not cancel_plan(done, []).allowed


def test_a_retry_keeps_succeeded_steps_and_runs_undone_ones_again(owner):
    task = saga_with(owner, {0: "succeeded", 1: "compensated", 2: "failed"}, state=S.FAILED)
    plan = retry_plan(task, list(StepCheckpoint.objects.filter(task_id=task.pk)),
                      from_start=False)
    assert plan.allowed and plan.reset_to_pending == (1,) and plan.keep_as_done == ()
    assert "resumes after its finished step(s) reserve" in plan.summary
    again = retry_plan(task, list(StepCheckpoint.objects.filter(task_id=task.pk)),
                       from_start=True)
    assert again.reset_to_pending == (0, 1, 2)
    running = make_task(owner, state=S.RUNNING)
    assert not retry_plan(running, [], from_start=False).allowed
