"""Cancel and retry (operator/owner actions) and cooperative cancel with
compensation, end to end in-process."""

import uuid

import pytest
from django.contrib.auth.models import Permission

from tests.support.helpers import drain, pop_queued, queued_task_ids
from workflows.engine.operations import task_cancel, task_retry
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.rules.errors import (
    InvalidTransition,
    PermissionDenied,
    RetryableError,
    TaskNotFound,
)
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start(owner):
    def trigger(workflow, payload):
        return task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                            payload=payload).task

    return trigger


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("operator")
    user.user_permissions.add(*Permission.objects.filter(
        codename__in=["cancel_task", "retry_task", "view_all_tasks"]))
    return django_user_model.objects.get(pk=user.pk)


def steps(task):
    return list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index")
                .values_list("name", "state"))


def test_cancelling_a_pending_task_is_immediate_and_audited(start, owner):
    task = start("demo.echo", {})
    task = task_cancel(task_id=task.pk, user=owner, reason="not needed")
    assert task.state == S.CANCELLED and task.finished_at is not None
    audit = TaskTransition.objects.get(task_id=task.pk)
    assert (audit.transition, audit.from_state, audit.to_state, audit.actor, audit.reason) == (
        "cancel", "pending", "cancelled", "user:client-a", "not needed")
    # Its queued message is now harmless.
    assert [run_task(t) for t in pop_queued()] == ["skipped"]


def test_cancel_and_retry_refuse_illegal_edges_with_a_clear_error(start, owner):
    task = start("demo.echo", {})
    with pytest.raises(InvalidTransition, match="pending task cannot be retried"):
        task_retry(task_id=task.pk, user=owner)
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    with pytest.raises(InvalidTransition, match="succeeded task cannot be cancelled"):
        task_cancel(task_id=task.pk, user=owner)


def test_only_owners_and_permitted_operators_may_act(start, other_owner, operator,
                                                     django_user_model):
    task = start("demo.echo", {})
    with pytest.raises(TaskNotFound):
        task_cancel(task_id=task.pk, user=other_owner)
    viewer = django_user_model.objects.create_user("viewer")
    viewer.user_permissions.add(Permission.objects.get(codename="view_all_tasks"))
    viewer = django_user_model.objects.get(pk=viewer.pk)
    with pytest.raises(PermissionDenied):
        task_cancel(task_id=task.pk, user=viewer)
    with pytest.raises(TaskNotFound):
        task_cancel(task_id=uuid.uuid4(), user=operator)
    assert Task.objects.get(pk=task.pk).state == S.PENDING
    assert task_cancel(task_id=task.pk, user=operator).state == S.CANCELLED


def test_the_admin_path_requires_the_permission_even_for_the_owner(start, owner):
    task = start("demo.echo", {})
    with pytest.raises(PermissionDenied):
        task_cancel(task_id=task.pk, user=owner, owner_may=False)
    assert Task.objects.get(pk=task.pk).state == S.PENDING


def test_retry_resumes_a_failed_task_with_a_fresh_budget(start, owner):
    task = start("demo.flaky", {"fail_times": 6})
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert (task.state, task.attempts) == (S.FAILED, 5)
    task = task_retry(task_id=task.pk, user=owner)
    assert (task.state, task.max_attempts) == (S.PENDING, 10)
    assert queued_task_ids() == [str(task.pk)]
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert (task.state, task.result, task.attempts) == (S.SUCCEEDED, {"attempts": 7}, 7)


def test_retry_from_start_runs_every_step_again(start, owner, temp_workflow):
    runs = []
    wf = temp_workflow("test.twostep", max_attempts=1)

    @wf.step
    def first(ctx):
        runs.append("first")
        return 1

    @wf.step
    def second(ctx):
        runs.append("second")
        if len(runs) < 4:
            raise RetryableError("second fails the first two times")
        return 2

    task = start("test.twostep", {})
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task_retry(task_id=task.pk, user=owner)  # resumes: only `second` runs
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert runs == ["first", "second", "second"]
    task_retry(task_id=task.pk, user=owner, from_start=True)
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert runs == ["first", "second", "second", "first", "second"]
    assert Task.objects.get(pk=task.pk).state == S.SUCCEEDED
    assert [t.reason for t in TaskTransition.objects.filter(task_id=task.pk, transition="retry")
            .order_by("id")] == ["resumes after its finished step(s) first",
                                 "every step runs again from the first (1 finished step(s) "
                                 "reset)"]


def test_a_running_task_is_cancelled_cooperatively_and_compensated(start, owner,
                                                                   temp_workflow):
    ran, undone = [], []
    wf = temp_workflow("test.cancellable")

    @wf.step(compensation=lambda ctx: undone.append(("booked", ctx.output)))
    def book(ctx):
        ran.append("book")
        return {"booking": 7}

    @wf.step
    def wait(ctx):
        ran.append("wait")
        # An operator cancels while this step runs; the next heartbeat notices.
        task_cancel(task_id=ctx.task_id, user=owner, reason="operator stop")
        assert Task.objects.get(pk=ctx.task_id).state == S.CANCELLING
        ctx.heartbeat(force=True)
        ran.append("after heartbeat")  # never reached

    @wf.step
    def never(ctx):
        ran.append("never")

    task = start("test.cancellable", {})
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert task.state == S.CANCELLED
    assert ran == ["book", "wait"]
    assert undone == [("booked", {"booking": 7})]
    assert steps(task) == [("book", "compensated"), ("wait", "failed")]
    # The worker noticed the cancel at its heartbeat and took the compensations
    # over under a new token (`resume`) before finishing the cancel.
    assert [(t.transition, t.to_state) for t in TaskTransition.objects.filter(
        task_id=task.pk).order_by("id")] == [("claim", "running"), ("cancel", "cancelling"),
                                             ("resume", "cancelling"),
                                             ("finish_cancel", "cancelled")]


def test_a_cancel_noticed_at_a_step_boundary_records_and_compensates_that_step(
        start, owner, temp_workflow):
    undone = []
    wf = temp_workflow("test.boundary")

    @wf.step(compensation=lambda ctx: undone.append(ctx.output))
    def charge(ctx):
        task_cancel(task_id=ctx.task_id, user=owner)
        return {"charged": 5}  # the effect happened; the checkpoint write finds the cancel

    @wf.step
    def ship(ctx):
        raise AssertionError("no step starts after a cancel")

    task = start("test.boundary", {})
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert Task.objects.get(pk=task.pk).state == S.CANCELLED
    assert undone == [{"charged": 5}]
    assert steps(task) == [("charge", "compensated")]


def test_cancelling_a_waiting_task_with_steps_to_undo_runs_the_compensations(
        start, owner, temp_workflow):
    undone = []
    wf = temp_workflow("test.waiting", max_attempts=3, backoff_initial=60, backoff_max=60)

    @wf.step(compensation=lambda ctx: undone.append("released"))
    def reserve(ctx):
        return "R1"

    @wf.step
    def pay(ctx):
        raise RetryableError("payment provider down")

    task = start("test.waiting", {})
    drain(lambda: Task.objects.get(pk=task.pk).state == S.RETRYING)
    task = task_cancel(task_id=task.pk, user=owner)
    assert task.state == S.CANCELLING
    assert queued_task_ids() == [str(task.pk)]
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert Task.objects.get(pk=task.pk).state == S.CANCELLED
    assert undone == ["released"]
    assert steps(task) == [("reserve", "compensated"), ("pay", "failed")]


def test_a_failing_compensation_is_recorded_and_the_others_still_run(start, owner,
                                                                     temp_workflow):
    def refuse(ctx):
        raise RuntimeError("refund API said no")

    wf = temp_workflow("test.stuck", max_attempts=1)
    undone = []

    @wf.step(compensation=lambda ctx: undone.append("first"))
    def first(ctx):
        return 1

    @wf.step(compensation=refuse)
    def second(ctx):
        return 2

    @wf.step
    def third(ctx):
        raise RuntimeError("third is broken")

    task = start("test.stuck", {})
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert (task.state, task.error_type) == (S.FAILED, "CompensationFailed")
    assert "third is broken" in task.error and "refund API said no" in task.error
    assert "steps left uncompensated: second" in task.error
    # `second` is still in effect and says why; the remaining compensation ran.
    assert steps(task) == [("first", "compensated"), ("second", "compensation_failed"),
                           ("third", "failed")]
    assert StepCheckpoint.objects.get(task_id=task.pk, name="second").error.startswith(
        "compensation failed: RuntimeError: refund API said no")
    assert undone == ["first"]
