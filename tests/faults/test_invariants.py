"""The invariant checker can fail: a run of each demo workflow passes it, and
for every invariant a state that breaks it — built from a real run, then
corrupted the way a broken engine would leave it — is reported. (An invariant no
state can violate would prove nothing.)"""

import uuid
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from tests.faults.invariants import Observed, violations
from tests.support.helpers import drain
from workflows.engine.triggers import task_trigger
from workflows.models import DemoLedger, DemoOrder, StepCheckpoint, Task, TaskTransition
from workflows.rules.states import FINISHED_STATES
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(owner):
    """Trigger `workflow` with `payload` and play worker and dispatcher until it ends."""
    def finished(workflow, payload):
        task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                            payload=payload).task
        drain(lambda: Task.objects.get(pk=task.pk).state in FINISHED_STATES)
        task.refresh_from_db()
        return task

    return finished


def only(task):
    return violations(tasks=Task.objects.filter(pk=task.pk))


def reported(task, fragment, **kwargs):
    found = violations(tasks=Task.objects.filter(pk=task.pk), **kwargs)
    assert any(fragment in v for v in found), found
    return found


def test_real_runs_of_every_demo_shape_break_nothing(run):
    tasks = [run("demo.echo", {"x": 1}),
             run("demo.sync_orders", {"batch": "inv-ok", "count": 5}),
             run("demo.saga", {"fail": False}),
             run("demo.saga", {"fail": True}),
             run("demo.flaky", {"fail_times": 1})]
    assert [t.state for t in tasks] == [S.SUCCEEDED, S.SUCCEEDED, S.SUCCEEDED, S.FAILED,
                                        S.SUCCEEDED]
    assert violations(tasks=Task.objects.filter(pk__in=[t.pk for t in tasks])) == []


def test_an_attempt_handed_back_is_reported(run):
    task = run("demo.echo", {})
    Task.objects.filter(pk=task.pk).update(max_attempts=5, attempts=F("attempts") + 1)
    reported(task, "1 claims but 2 attempts counted")


def test_a_step_run_more_often_than_its_task_was_claimed_is_reported(run):
    task = run("demo.echo", {})
    StepCheckpoint.objects.filter(task_id=task.pk).update(attempts=2)
    reported(task, "step echo ran 2 times in 1 claims")


def test_a_succeeded_task_with_a_step_not_succeeded_is_reported(run):
    task = run("demo.saga", {"fail": False})
    StepCheckpoint.objects.filter(task_id=task.pk, name="charge").update(state="failed")
    reported(task, "succeeded with step charge failed")


def test_a_finished_task_with_a_step_still_running_is_reported(run):
    task = run("demo.saga", {"fail": True})
    StepCheckpoint.objects.filter(task_id=task.pk, name="confirm").update(state="running")
    reported(task, "is failed with step confirm still running")


def test_a_compensation_nobody_asked_for_is_reported(run):
    task = run("demo.saga", {"fail": False})
    StepCheckpoint.objects.filter(task_id=task.pk, name="charge").update(
        state="compensated", compensation_attempts=1)
    found = reported(task, "step charge compensated without a compensate or cancel")
    assert any("succeeded with step charge compensated" in v for v in found)


def test_a_compensated_step_that_was_never_tried_is_reported(run):
    task = run("demo.saga", {"fail": True})
    StepCheckpoint.objects.filter(task_id=task.pk, name="reserve").update(
        compensation_attempts=0)
    reported(task, "step reserve compensated but compensable=True, compensation attempts 0")


def test_a_step_that_succeeded_after_its_task_ended_is_reported(run):
    task = run("demo.saga", {"fail": True})
    ended = TaskTransition.objects.filter(task_id=task.pk).order_by("-id").first().at
    StepCheckpoint.objects.filter(task_id=task.pk, name="confirm").update(
        state="succeeded", finished_at=ended + timedelta(milliseconds=5))
    reported(task, "step confirm succeeded at")


@pytest.mark.parametrize("action, change, expected", [
    ("charge", "double", "2 charge effect(s), expected 1"),
    ("release", "lose", "0 release effect(s), expected 1"),
    ("confirm", "double", "1 confirm effect(s), expected 0"),
])
def test_a_ledger_effect_doubled_or_lost_is_reported(run, action, change, expected):
    task = run("demo.saga", {"fail": True})
    if change == "double":
        DemoLedger.objects.create(task=task.pk, action=action)
    else:
        DemoLedger.objects.filter(task=task.pk, action=action).delete()
    reported(task, expected)


def test_a_restarted_saga_may_repeat_its_effects_once_per_life_only(run, owner):
    task = run("demo.saga", {"fail": True})
    Task.objects.filter(pk=task.pk).update(restarts=1)
    assert only(task) == []  # two lives: a second reserve would be allowed
    for _ in range(2):
        DemoLedger.objects.create(task=task.pk, action="reserve")
    reported(task, "3 reserve effects in 2 lives")


def test_an_atomic_write_landed_twice_or_not_at_all_is_reported(run):
    task = run("demo.sync_orders", {"batch": "inv-rows", "count": 5})
    DemoOrder.objects.filter(batch="inv-rows").first().delete()
    reported(task, "batch inv-rows: 4 rows, expected 5")


def test_a_history_that_does_not_end_in_the_tasks_state_is_reported(run):
    task = run("demo.echo", {})
    TaskTransition.objects.filter(task_id=task.pk, transition="succeed").delete()
    reported(task, "history ends in running but the task is succeeded")


def test_an_illegal_edge_is_reported(run):
    task = run("demo.echo", {})
    TaskTransition.objects.filter(task_id=task.pk, transition="succeed").update(
        transition="fail")
    reported(task, "illegal edge fail running->succeeded")


def test_a_task_running_on_a_long_expired_lease_is_reported_while_running(owner):
    task = task_trigger(owner=owner, key="abandoned", workflow="demo.echo", payload={}).task
    from tests.support.helpers import task_claim

    assert task_claim(task_id=task.pk, worker="gone") is not None
    assert violations(require_terminal=False, tasks=Task.objects.filter(pk=task.pk)) == []
    Task.objects.filter(pk=task.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=30))
    reported(task, "running on a lease that expired more than", require_terminal=False)
    # ... and not with a grace longer than the expiry (the dispatcher may be mid-poll).
    assert violations(require_terminal=False, tasks=Task.objects.filter(pk=task.pk),
                      lease_grace=60) == []


def test_an_unfinished_task_is_reported_only_when_the_end_is_required(owner):
    task = task_trigger(owner=owner, key="waiting", workflow="demo.echo", payload={}).task
    assert violations(require_terminal=False, tasks=Task.objects.filter(pk=task.pk)) == []
    reported(task, f"task {task.pk} is still pending")


def test_an_acknowledged_task_that_is_missing_is_reported(owner):
    observed = Observed(acknowledged={(owner.pk, "lost"): uuid.uuid4()})
    assert any("for key 'lost' is missing" in v for v in violations(observed))
