"""A retry whose backoff elapsed is claimed no later than one dispatcher poll
interval after it fell due (docs/design.md, "Heartbeats, progress, retries"):
the real dispatcher loop (`dispatcher_loop`, as `run_dispatcher` runs it) on its
own thread and connection, a worker delivering what it sends, and every instant
read from the database's clock — the backoff's `next_attempt_at` and the audit
rows' `at` — never from this process's sleeps."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connections
from django.db.models.functions import Now

from tests.support.helpers import pop_queued, wait_for
from workflows.engine import faults
from workflows.engine.loop import dispatcher_loop
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskReplay, TaskTransition
from workflows.rules.errors import RetryableError
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

POLL = 3.0  # the dispatcher's poll interval in this test (PILOT_DISPATCHER_POLL_SECONDS)


@pytest.fixture
def dispatcher():
    """The loop on a thread of its own (its own database connection), stopped and
    joined at the end, as SIGTERM stops run_dispatcher."""
    stop = threading.Event()

    def body():
        try:
            dispatcher_loop(stop, poll=POLL)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    yield thread.start
    stop.set()
    thread.join(30)
    assert not thread.is_alive()


@pytest.fixture
def retrying(owner, temp_workflow):
    """Tasks whose first attempt failed retryably, their backoff an hour (until the
    test pins it)."""
    wf = temp_workflow("t.late", max_attempts=2, backoff_initial=3600, backoff_max=3600)

    @wf.step
    def s(ctx):
        if ctx.attempt == 1:
            raise RetryableError("the first attempt fails")
        return "ok"

    def make() -> Task:
        task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="t.late",
                            payload={}).task
        [message] = pop_queued()
        assert run_task(message) == "retrying"
        return task

    return make


def _due_in(task: Task, seconds: float):
    """Pin the backoff to `seconds` from the database's now; returns that instant."""
    Task.objects.filter(pk=task.pk).update(next_attempt_at=Now() + timedelta(seconds=seconds))
    return Task.objects.values_list("next_attempt_at", flat=True).get(pk=task.pk)


def _deliver_until_claimed(task: Task):
    """Be the worker: deliver every message the dispatcher sends until `task` has
    been claimed again; returns that claim's audit row."""
    def claimed():
        for message in pop_queued():
            run_task(message)
        return (TaskTransition.objects.filter(task_id=task.pk, transition="claim",
                                              from_state=S.RETRYING).first())
    return wait_for(claimed, timeout=4 * POLL + 10, interval=0.02,
                    what="the retry to be claimed")


def test_a_due_retry_is_claimed_within_one_poll_interval_by_the_database_clock(
        retrying, dispatcher):
    known, unknown = retrying(), retrying()
    # Due before the loop starts: its first pass sees the backoff and wakes for it.
    due_known = _due_in(known, 0.5)
    dispatcher()
    claim_known = _deliver_until_claimed(known)
    # Made due while the loop sleeps a whole poll interval (the other task's backoff is
    # an hour away): the loop learns of it only at its next pass.
    due_unknown = _due_in(unknown, 1.5)
    claim_unknown = _deliver_until_claimed(unknown)

    for what, due, claim in (("known", due_known, claim_known),
                             ("made due mid-sleep", due_unknown, claim_unknown)):
        late = (claim.at - due).total_seconds()
        print(f"retry {what}: claimed {late:.3f} s after it fell due")
        assert 0 <= late <= POLL, (due, claim.at)  # never early, never a poll late
    for task in (known, unknown):
        task.refresh_from_db()
        assert (task.state, task.attempts) == (S.SUCCEEDED, 2)


def test_a_slow_pass_does_not_add_its_own_time_to_a_known_retrys_lateness(retrying, dispatcher):
    """The first pass sees the retry due in 2.5 s, then folds the replay log for
    2 s (a backlog after an upgrade, say): the loop sleeps what is left of the
    2.5 s, not 2.5 s more."""
    task = retrying()
    TaskReplay.objects.bulk_create([TaskReplay(task=task, workflow=task.workflow, count=1)
                                    for _ in range(2)])  # one group to fold
    due = _due_in(task, 2.5)
    with faults.on("before_fold_commit", lambda: time.sleep(2.0)):
        dispatcher()
        claim = _deliver_until_claimed(task)
    late = (claim.at - due).total_seconds()
    print(f"retry due during a 2 s fold: claimed {late:.3f} s after it fell due")
    assert 0 <= late < 1.0, (due, claim.at)  # the fold's 2 s would make it ~2 s
    assert TaskReplay.objects.filter(task=task).count() == 1  # and the fold went through
