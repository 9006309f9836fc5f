"""workflows.testing.run_workflow: a workflow run to its end in the test
database through the real engine, crashes included (SQLite, and PostgreSQL's
literal-SQL store when DATABASE_URL points there)."""

from __future__ import annotations

import time

import pytest

from workflows.engine import faults
from workflows.models import DemoLedger, DemoOrder, Task, TaskTransition
from workflows.rules.errors import NonRetryableError, UnknownWorkflow, ValidationFailed
from workflows.rules.states import TaskState as S
from workflows.testing import DEFAULT_OWNER, WorkflowRunStuck, run_workflow

pytestmark = pytest.mark.django_db


def steps(task):
    return [(s.name, s.state, s.attempts) for s in task.steps.all()]


def ledger(task):
    return list(DemoLedger.objects.filter(task=task.pk).order_by("id")
                .values_list("action", flat=True))


def test_a_run_ends_succeeded_with_its_result_and_every_checkpoint():
    task = run_workflow("demo.sync_orders", {"batch": "b-1", "count": 7})
    assert isinstance(task, Task)
    assert (task.state, task.result, task.attempts) == (S.SUCCEEDED, {"written": 7}, 1)
    assert steps(task) == [("fetch", "succeeded", 1), ("transform", "succeeded", 1),
                           ("write", "succeeded", 1)]
    assert next(s.output for s in task.steps.all()) == {"fetched": 7}
    assert DemoOrder.objects.filter(batch="b-1").count() == 7
    assert task.owner.username == DEFAULT_OWNER


def test_retries_run_without_waiting_their_backoff():
    started = time.monotonic()
    task = run_workflow("demo.flaky", {"fail_times": 3})
    assert (task.state, task.result, task.attempts) == (S.SUCCEEDED, {"attempts": 4}, 4)
    # demo.flaky's backoff would wait 0.1 + 0.2 + 0.4 s at least (full jitter: up to).
    assert time.monotonic() - started < 5
    assert list(TaskTransition.objects.filter(task_id=task.pk).order_by("at", "id")
                .values_list("transition", flat=True)).count("schedule_retry") == 3


def test_a_workflow_out_of_attempts_ends_failed_with_the_steps_error():
    task = run_workflow("demo.flaky", {"fail_times": 10})
    assert (task.state, task.error_type, task.attempts) == (S.FAILED, "RetryableError", 5)


def test_a_crash_after_an_atomic_body_rolls_it_back_and_the_next_worker_writes_once():
    task = run_workflow("demo.sync_orders", {"batch": "b-2", "count": 5},
                        crash_at="after_step_body", crash_skip=2)  # fetch, transform go by
    assert (task.state, task.attempts) == (S.SUCCEEDED, 2)
    assert steps(task) == [("fetch", "succeeded", 1), ("transform", "succeeded", 1),
                           ("write", "succeeded", 2)]
    assert DemoOrder.objects.filter(batch="b-2").count() == 5
    assert TaskTransition.objects.filter(task_id=task.pk, transition="recover").count() == 1


def test_a_crash_between_steps_resumes_at_the_next_step():
    task = run_workflow("demo.sync_orders", {"batch": "b-3", "count": 1},
                        crash_at="after_checkpoint")
    # fetch's checkpoint was written with transform's start (one write per boundary):
    # fetch does not run again; transform's start counted on the lost attempt.
    assert steps(task) == [("fetch", "succeeded", 1), ("transform", "succeeded", 2),
                           ("write", "succeeded", 1)]
    assert (task.state, task.attempts) == (S.SUCCEEDED, 2)


def test_a_workflow_that_kills_every_worker_ends_failed_after_max_attempts():
    task = run_workflow("demo.sync_orders", {"batch": "b-4", "count": 1},
                        crash_at="after_claim", crash_times=5)
    assert (task.state, task.error_type, task.attempts) == (S.FAILED, "LeaseExpired", 5)
    assert not task.steps.filter(state="succeeded").exists()


def test_a_failed_saga_is_compensated_in_reverse_order():
    task = run_workflow("demo.saga", {"fail": True})
    assert (task.state, task.error_type) == (S.FAILED, "NonRetryableError")
    assert ledger(task) == ["reserve", "charge", "refund", "release"]
    assert [s.state for s in task.steps.all()] == ["compensated", "compensated", "failed"]


def test_a_crash_after_a_compensation_commits_does_not_run_it_again():
    # after_atomic_commit: reserve and charge commit, then refund's commit is the third.
    task = run_workflow("demo.saga", {"fail": True}, crash_at="after_atomic_commit",
                        crash_skip=2)
    assert task.state == S.FAILED
    assert ledger(task) == ["reserve", "charge", "refund", "release"]


def test_the_same_key_replays_the_finished_task():
    first = run_workflow("demo.echo", {"n": 1}, key="k-1")
    again = run_workflow("demo.echo", {"n": 1}, key="k-1")
    assert again.pk == first.pk and again.attempts == 1
    assert again.result == {"echo": {"n": 1}}


def test_an_owner_of_your_own(django_user_model):
    owner = django_user_model.objects.create_user("shop")
    assert run_workflow("demo.echo", owner=owner).owner == owner


def test_refusals_raise_as_the_api_would_answer_them():
    with pytest.raises(ValidationFailed):
        run_workflow("demo.sync_orders", {"batch": "b-5"})
    with pytest.raises(UnknownWorkflow):
        run_workflow("demo.nope", {})
    with pytest.raises(ValueError, match="unknown fault point 'after_lunch'"):
        run_workflow("demo.echo", {}, crash_at="after_lunch")
    assert not Task.objects.exists()


def test_a_task_that_cannot_finish_in_the_deliveries_allowed_is_reported(temp_workflow):
    wf = temp_workflow("t.forever", max_attempts=50, backoff_initial=0.01)

    @wf.step
    def again(ctx):
        raise ConnectionError("upstream down")

    with pytest.raises(WorkflowRunStuck, match="still retrying after 3 deliveries"):
        run_workflow("t.forever", max_deliveries=3)


def test_the_fault_point_is_disarmed_afterwards():
    run_workflow("demo.echo", {}, crash_at="after_claim", crash_times=2)
    assert faults._armed == {}
    assert run_workflow("demo.echo", {}).attempts == 1


def test_a_step_error_that_is_not_retryable_fails_at_once(temp_workflow):
    wf = temp_workflow("t.refuse", max_attempts=5)

    @wf.step
    def refuse(ctx):
        raise NonRetryableError("no")

    task = run_workflow("t.refuse")
    assert (task.state, task.attempts, task.error) == (S.FAILED, 1, "NonRetryableError: no")


@pytest.mark.django_db(transaction=True)
def test_it_runs_outside_a_test_transaction_too():
    """Committed for real (transaction=True): on PostgreSQL this is the literal-SQL
    store's own path, row locks and all."""
    task = run_workflow("demo.saga", {"fail": False}, crash_at="after_checkpoint")
    assert task.state == S.SUCCEEDED
    assert ledger(task) == ["reserve", "charge", "confirm"]
