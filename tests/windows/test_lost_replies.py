"""Lost replies to a worker's claims and transitions (docs/design.md, "Execution"):
the statement committed on the server, the worker saw a connection error. It
re-reads before it decides, and adopts only a change that was its own.

- a claim (by id, or the next one from the queue) whose reply was lost is
  adopted: the task runs now, on that attempt, instead of sitting `running`
  under a lease nobody uses until the dispatcher recovers it and counts an
  attempt that never ran (review turn 3, F3: with max_attempts 1 it then
  failed without ever running);
- the success of a run that also claimed the next task (one statement on
  PostgreSQL, one transaction elsewhere), its reply lost — after a plain last
  step and inside the last atomic step's COMMIT: the next task is adopted and
  runs in the same drain;
- a transition whose reply was lost after it committed is adopted; one that
  never reached the server while the dispatcher recovered the task meanwhile
  is NOT adopted (the token moved by one, but not by this worker: review turn
  3's mutant M4) — the worker writes nothing more.

The faults are named fault points raising the connection error a lost reply
gives (workflows/engine/faults.py); each test asserts that its fault fired.
SQLite and PostgreSQL."""

import uuid

import pytest
from django.db import OperationalError

from tests.support.helpers import audit, expire_lease, pop_queued
from workflows.engine import faults
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.run import task_run, tasks_drain
from workflows.engine.triggers import task_trigger
from workflows.models import DemoOrder, StepCheckpoint, TaskTransition
from workflows.rules.errors import NonRetryableError
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)

LOST = "server closed the connection unexpectedly"


def trigger(owner, workflow="demo.echo", payload=None):
    return task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                        payload=payload or {}).task


def _ran_once(task, worker="worker:w"):
    task.refresh_from_db()
    assert (task.state, task.attempts) == (S.SUCCEEDED, 1)
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "succeed"]
    assert set(TaskTransition.objects.filter(task_id=task.pk)
               .values_list("actor", flat=True)) == {worker}


@pytest.mark.parametrize("how", ["by_id", "from_the_queue"])
def test_a_claim_whose_reply_was_lost_is_adopted_and_runs_on_that_attempt(
        owner, temp_workflow, how):
    wf = temp_workflow("t.one_attempt", max_attempts=1)
    wf.add_step("only", lambda ctx: "done")
    task = trigger(owner, "t.one_attempt")
    pop_queued()
    with faults.armed("claim_reply", error=OperationalError(LOST)) as lost:
        if how == "by_id":
            assert task_run(task_id=task.pk, worker="w").outcome == "succeeded"
        else:
            assert tasks_drain(worker="w", until=0) == 0  # the deadline has passed ...
            assert tasks_drain(worker="w", until=float("inf")) == 1  # ... now it has not
    assert lost.fired == 1
    _ran_once(task)
    assert dispatch_once().recovered == 0


@pytest.mark.parametrize("last_step", ["plain", "atomic"])
def test_a_lost_reply_to_a_success_that_claimed_the_next_task_runs_that_task(
        owner, temp_workflow, last_step):
    batch = uuid.uuid4().hex[:8]
    wf = temp_workflow("t.chained", max_attempts=1)

    def write(ctx):
        DemoOrder.objects.create(batch=batch, n=0)
        return "written"

    wf.add_step("write", write, atomic=last_step == "atomic")
    first, following = trigger(owner, "t.chained"), trigger(owner)
    pop_queued()
    point = "after_atomic_commit" if last_step == "atomic" else "transition_reply"
    with faults.armed(point, error=OperationalError(LOST)) as lost:
        report = task_run(task_id=first.pk, worker="w", drain_seconds=30)
    assert lost.fired == 1
    assert report.outcome == "succeeded"
    _ran_once(first)
    _ran_once(following)  # claimed with the success, adopted, run in the same drain
    assert DemoOrder.objects.filter(batch=batch).count() == 1
    assert dispatch_once().recovered == 0


def _saga(temp_workflow, name, undone):
    wf = temp_workflow(name, max_attempts=3, backoff_initial=3600, backoff_max=3600)
    wf.add_step("a", lambda ctx: "a", compensation=lambda ctx: undone.append("a"))

    @wf.step
    def b(ctx):
        raise NonRetryableError("for good")


def test_a_committed_transition_whose_reply_was_lost_is_adopted(owner, temp_workflow):
    """`compensate` committed; the worker saw the connection drop. It re-reads,
    finds its own change, and goes on with the compensations."""
    undone = []
    _saga(temp_workflow, "t.lost_compensate_reply", undone)
    task = trigger(owner, "t.lost_compensate_reply")
    [message] = pop_queued()
    with faults.armed("transition_reply", error=OperationalError(LOST)) as lost:
        report = task_run(task_id=message, worker="A")
    assert lost.fired == 1
    assert (report.outcome, undone) == ("failed", ["a"])
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "compensate", "fail"]


def test_a_transition_lost_while_the_dispatcher_recovered_the_task_writes_nothing(
        owner, temp_workflow):
    """The mutant M4 of review turn 3: `compensate` never reached the server;
    meanwhile the lease ran out and the dispatcher recovered the task — its
    token is now the worker's + 1, but the change is not the worker's. Adopting
    it, the worker compensated a task that is `retrying`."""
    undone = []
    _saga(temp_workflow, "t.lost_compensate_recovered", undone)
    task = trigger(owner, "t.lost_compensate_recovered")
    [message] = pop_queued()

    def recovered_meanwhile():
        expire_lease(task.pk)
        assert dispatch_once().recovered == 1

    with faults.on("before_transition", recovered_meanwhile) as hook, \
            faults.armed("before_transition", error=OperationalError(LOST)) as lost:
        report = task_run(task_id=message, worker="A")
    assert (hook.fired, lost.fired) == (1, 1)
    assert report.outcome == "lease_lost"
    assert undone == []
    task.refresh_from_db()
    assert task.state == S.RETRYING
    assert StepCheckpoint.objects.get(task_id=task.pk, name="a").state == "succeeded"
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "recover"]


def test_a_claim_of_a_predecessor_under_the_same_worker_id_is_not_adopted(owner):
    """A process restarted under a reused pid has its predecessor's worker id.
    The predecessor's claim is not this process's lost reply: only a claim made
    within the last ADOPTABLE_SECONDS is adopted, so the new process, whose own
    claim's reply was lost, claims afresh instead of taking over a task its
    predecessor may still be writing to until its lease expires."""
    from datetime import timedelta

    from django.db.models.functions import Now

    from tests.support.helpers import task_claim
    from workflows.engine.store.orm import ADOPTABLE_SECONDS

    old, new = trigger(owner), trigger(owner)
    pop_queued()
    assert task_claim(task_id=old.pk, worker="w") is not None  # the predecessor's claim
    TaskTransition.objects.filter(task_id=old.pk).update(
        at=Now() - timedelta(seconds=ADOPTABLE_SECONDS + 1))
    with faults.armed("claim_reply", error=OperationalError(LOST)) as lost:
        assert tasks_drain(worker="w", until=float("inf")) == 1
    assert lost.fired == 1
    _ran_once(new)
    old.refresh_from_db()
    assert (old.state, old.attempts) == (S.RUNNING, 1)  # left to its lease
