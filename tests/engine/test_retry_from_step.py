"""Retry from a chosen step (docs/design.md, "Operators"): that step and every
later one run again, the earlier checkpoints are kept — a compensated earlier
step (its effect undone) runs again too; a step the workflow does not have, or
from_step with from_start, is a validation error that changes nothing."""

import uuid

import pytest

from tests.support.helpers import drain, queued_task_ids
from workflows.engine.operations import task_retry
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.rules.errors import InvalidTransition, NonRetryableError, ValidationFailed
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def three_steps(temp_workflow):
    """a, b, c; c fails for good while `fail` holds True; b undoes itself."""
    runs, box = [], {"fail": True}
    wf = temp_workflow("test.retry_from", max_attempts=1)

    @wf.step
    def a(ctx):
        runs.append("a")
        return "a"

    def undo_b(ctx):
        runs.append("undo b")

    @wf.step(compensation=undo_b)
    def b(ctx):
        runs.append("b")
        return "b"

    @wf.step
    def c(ctx):
        runs.append("c")
        if box["fail"]:
            raise NonRetryableError("c fails")
        return "c"

    return runs, box


def failed(owner):
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="test.retry_from",
                        payload={}).task
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    return Task.objects.get(pk=task.pk)


def steps(task):
    return list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index")
                .values_list("name", "state"))


def test_from_a_step_runs_it_and_every_later_one_again_and_keeps_the_earlier(owner,
                                                                             three_steps):
    runs, box = three_steps
    task = failed(owner)
    assert runs == ["a", "b", "c", "undo b"] and task.state == S.FAILED
    box["fail"] = False
    task = task_retry(task_id=task.pk, user=owner, from_step="c")
    assert task.state == S.PENDING and queued_task_ids() == [str(task.pk)]
    assert steps(task) == [("a", "succeeded"), ("b", "pending"), ("c", "pending")]
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    # b was compensated (its effect undone), so it runs again though it is before c.
    assert runs == ["a", "b", "c", "undo b", "b", "c"]
    assert Task.objects.get(pk=task.pk).state == S.SUCCEEDED
    assert TaskTransition.objects.filter(task_id=task.pk, transition="retry").get().reason == (
        "runs again from step c, keeping the finished step(s) a; the undone step(s) b run again")


def test_from_a_succeeded_step_runs_it_again_and_says_its_effect_stands(owner, temp_workflow):
    runs = []
    wf = temp_workflow("test.cancelled_late", max_attempts=1)

    @wf.step
    def one(ctx):
        runs.append("one")
        return 1

    @wf.step
    def two(ctx):
        runs.append("two")
        return 2

    task = task_trigger(owner=owner, key="k", workflow="test.cancelled_late", payload={}).task
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert Task.objects.get(pk=task.pk).state == S.SUCCEEDED
    with pytest.raises(InvalidTransition):  # a succeeded task is not retried
        task_retry(task_id=task.pk, user=owner, from_step="two")
    Task.objects.filter(pk=task.pk).update(state=S.CANCELLED)  # as if cancelled at the end
    task = task_retry(task_id=task.pk, user=owner, from_step="one")
    assert TaskTransition.objects.filter(task_id=task.pk, transition="retry").get().reason == (
        "runs again from step one; the finished step(s) one, two run again, their effect not "
        "undone first")
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert runs == ["one", "two", "one", "two"]


@pytest.mark.parametrize("kwargs, says", [
    ({"from_step": "nope"}, "There is no step 'nope' in test.retry_from (its steps: a, b, c)"),
    ({"from_step": "a", "from_start": True}, "from_step and from_start cannot be combined"),
])
def test_a_bad_from_step_is_a_validation_error_and_changes_nothing(owner, three_steps,
                                                                   kwargs, says):
    task = failed(owner)
    before = (steps(task), list(TaskTransition.objects.filter(task_id=task.pk)
                                .values_list("id", flat=True)), task.lease_token)
    with pytest.raises(ValidationFailed) as refused:
        task_retry(task_id=task.pk, user=owner, **kwargs)
    assert says in refused.value.detail
    task.refresh_from_db()
    assert task.state == S.FAILED and queued_task_ids() == []
    assert (steps(task), list(TaskTransition.objects.filter(task_id=task.pk)
                              .values_list("id", flat=True)), task.lease_token) == before
