"""The hard windows of waiting (docs/waiting.md), each opened deterministically
at its exact point, on PostgreSQL with separate connections: a signal while the
task parks, two signals at once, a crash after the park, a crash of the worker
a wake woke, the dispatcher and a signal (or a cancel) at the same wake, a
stale worker at a wait, and timers by the database's clock."""

import uuid
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from tests.support.helpers import (
    audit,
    background,
    drain,
    expire_lease,
    ledger,
    pop_queued,
    rewind,
    row_lock_waiters,
    run_at_once,
    wait_for,
)
from workflows.engine import faults, task_cancel, task_signal
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.run import task_run
from workflows.engine.run.driver import Run
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskSignal
from workflows.rules.errors import TaskFinished
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def approval(owner, timeout=600):
    return task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.approval",
                        payload={"timeout_seconds": timeout}).task


def send(task, payload=None, key="k1"):
    return task_signal(task_id=task.pk, name="decision", key=key, user=None,
                       payload={"approved": True, "by": key} if payload is None else payload,
                       actor="test:sender")


def run_queued():
    for message in pop_queued():
        run_task(message)


def parked(owner, timeout=600):
    task = approval(owner, timeout)
    run_queued()
    task.refresh_from_db()
    assert task.state == S.WAITING
    return task


def transitions(task):
    return [t for t, _, _ in audit(task.pk)]


def consumed(task):
    return list(TaskSignal.objects.filter(task=task, consumed_at__isnull=False)
                .values_list("idempotency_key", flat=True))


def make_due(task):
    """The wait's timeout passes, the way the database sees it."""
    rewind(task.pk, 10_000)
    task.refresh_from_db()
    Task.objects.filter(pk=task.pk).update(
        waiting_for={**task.waiting_for, "until": task.next_attempt_at.isoformat()})


def test_a_signal_sent_while_the_task_parks_waits_for_the_park_and_wakes_it(owner):
    task = approval(owner)
    sender = {}

    def signal_now():
        sender["bg"] = background(lambda: send(Task(pk=task.pk)))
        wait_for(lambda: row_lock_waiters() >= 1, what="the signal to wait for the task's row")

    with faults.on("before_park", signal_now) as hits:
        run_queued()
    assert hits.fired == 1
    outcome = sender["bg"].result()
    assert outcome.woke and not outcome.replayed  # it saw the park and woke the task
    task.refresh_from_db()
    assert task.state == S.PENDING
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.result == {"approved": True, "by": "k1"}
    assert consumed(task) == ["k1"]
    assert transitions(task) == ["claim", "park", "wake", "claim", "succeed"]


def test_two_signals_with_two_keys_at_once_are_both_kept_and_one_is_consumed(owner):
    task = parked(owner)
    results = run_at_once(2, lambda i: send(Task(pk=task.pk), key=f"key-{i}"))
    assert all(not isinstance(r, BaseException) for r in results), results
    assert sorted(r.woke for r in results) == [False, True]  # exactly one wake
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED
    assert len(consumed(task)) == 1
    assert TaskSignal.objects.filter(task=task, consumed_at__isnull=True).count() == 1
    assert transitions(task).count("wake") == 1


def test_one_key_twice_at_once_stores_one_signal_and_replays_the_other(owner):
    task = parked(owner)
    results = run_at_once(2, lambda i: send(Task(pk=task.pk), key="same"))
    assert all(not isinstance(r, BaseException) for r in results), results
    assert sorted(r.replayed for r in results) == [False, True]
    assert TaskSignal.objects.filter(task=task).count() == 1
    assert transitions(task).count("wake") == 1


def test_a_crash_after_the_parks_commit_leaves_it_waiting_with_no_lease_and_a_signal_ends_it(
        owner):
    task = approval(owner)
    [message] = pop_queued()
    with faults.armed("after_atomic_commit") as hits, pytest.raises(faults.SimulatedCrash):
        run_task(message)
    assert hits.fired == 1
    task.refresh_from_db()
    assert task.state == S.WAITING and task.lease_owner == "" and task.lease_expires_at is None
    report = dispatch_once()
    assert report.recovered == 0 and report.woken == 0  # nothing to recover: it holds nothing
    assert send(task).woke
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and ledger(task.pk) == ["apply"]


def test_a_crash_of_the_worker_a_signal_woke_is_recovered_and_consumes_the_signal_once(owner):
    task = parked(owner)
    send(task)
    [message] = pop_queued()
    with faults.armed("after_claim") as hits, pytest.raises(faults.SimulatedCrash):
        run_task(message)
    assert hits.fired == 1
    assert consumed(task) == []  # it died before its wait step looked
    expire_lease(task.pk)
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and consumed(task) == ["k1"] and ledger(task.pk) == ["apply"]


def test_the_dispatcher_and_a_signal_waking_at_once_make_one_wake_and_one_outcome(owner):
    task = parked(owner, timeout=5)
    make_due(task)
    sender = {}

    def signal_now():
        sender["bg"] = background(lambda: send(Task(pk=task.pk)))
        wait_for(lambda: row_lock_waiters() >= 1, what="the signal to wait for the wake")

    with faults.on("before_wake", signal_now) as hits:
        assert dispatch_once().woken == 1
    assert hits.fired == 1
    outcome = sender["bg"].result()
    assert not outcome.woke  # the dispatcher's wake came first: the signal is only stored
    assert transitions(task).count("wake") == 1
    run_queued()
    task.refresh_from_db()
    # One outcome: the signal stored before the woken wait looked is consumed,
    # even though its timeout passed.
    assert task.state == S.SUCCEEDED and consumed(task) == ["k1"]


def test_a_timeout_and_no_signal_fail_the_wait_once(owner):
    task = parked(owner, timeout=5)
    make_due(task)
    assert dispatch_once().woken == 1
    assert dispatch_once().woken == 0  # woken once
    run_queued()
    task.refresh_from_db()
    assert task.state == S.FAILED and task.error_type == "SignalTimeout"
    with pytest.raises(TaskFinished):
        send(task, key="late")


def test_a_cancel_racing_a_wake_ends_the_task_once(owner):
    task = parked(owner, timeout=5)
    make_due(task)
    box = {}

    def cancel_now():
        box["bg"] = background(lambda: task_cancel(task_id=task.pk, user=owner))
        wait_for(lambda: row_lock_waiters() >= 1, what="the cancel to wait for the wake")

    with faults.on("before_wake", cancel_now) as hits:
        dispatch_once()
    assert hits.fired == 1
    assert box["bg"].result().state == S.CANCELLED  # it found the woken task pending
    run_queued()  # the wake's message finds a cancelled task: nothing runs
    task.refresh_from_db()
    assert task.state == S.CANCELLED and ledger(task.pk) == []
    assert transitions(task)[-2:] == ["wake", "cancel"]


def test_a_stale_worker_at_a_wait_cannot_consume_or_park(owner):
    task = parked(owner)
    send(task, key="only")
    pop_queued()
    stale = Run(task.pk, "stale-worker")
    points = stale.steps()
    assert next(points) == "claimed"
    assert next(points) == "step"  # at the wait step: the decision comes next
    expire_lease(task.pk)
    dispatch_once()  # recovered: the stale worker's token is gone
    store().skip_backoff(task.pk)
    assert task_run(task_id=task.pk, worker="fresh-worker").outcome == "succeeded"
    for _ in points:  # the stale worker goes on: its fenced decision is refused
        pass
    assert stale.report.outcome == "lease_lost"
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and consumed(task) == ["only"]
    assert transitions(task).count("park") == 1  # only the first, before the signal


def test_a_timer_is_measured_by_the_databases_clock_whatever_the_machines_clock(owner):
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.timer",
                        payload={"seconds": 30}).task
    db_before = store().db_now()
    skewed = timezone.now() + timedelta(hours=2)
    with mock.patch("django.utils.timezone.now", return_value=skewed):
        run_queued()
    task.refresh_from_db()
    assert task.state == S.WAITING
    ends = task.next_attempt_at - db_before
    assert timedelta(seconds=29) <= ends <= timedelta(seconds=40), ends
    assert dispatch_once().woken == 0  # not due by the database, whatever this process says


def _due_timers(owner, n):
    """`n` demo.timer tasks parked at their wait, all due a moment ago."""
    from workflows.models import StepCheckpoint

    now = store().db_now()
    timers = Task.objects.bulk_create(
        Task(owner=owner, idempotency_key=f"timer-{i}", workflow="demo.timer",
             payload={"seconds": 1}, fingerprint="x", max_attempts=3, attempts=1,
             state=S.WAITING, next_attempt_at=now - timedelta(milliseconds=1),
             waiting_for={"kind": "timer", "step": 1, "until": now.isoformat()},
             created_at=now, updated_at=now, lease_token=2)
        for i in range(n))
    StepCheckpoint.objects.bulk_create(
        StepCheckpoint(task_id=t.pk, index=i, name=name, state=state, attempts=1)
        for t in timers for i, (name, state) in enumerate([("before", "succeeded"),
                                                           ("wait", "running")]))
    return timers


def test_ten_thousand_timers_due_at_once_are_woken_in_batches_behind_older_work(owner):
    """10 000 timers due in the same instant: each dispatcher pass wakes a batch
    in a bounded number of statements (one write for the batch, not one per
    task), says it is full (the loop runs again at once), every timer is woken
    within BATCH-sized passes, and work that was due before the wake is
    claimed first (a woken task is due from its wake), then the woken ones."""
    from django.db import connection
    from django.db.models import F
    from django.test.utils import CaptureQueriesContext

    from workflows.engine.dispatcher import BATCH
    from workflows.engine.leases import lease_length
    from workflows.models import TaskTransition

    n = 10_000
    timers = _due_timers(owner, n)
    earlier = task_trigger(owner=owner, key="earlier", workflow="demo.echo", payload={}).task
    passes = 0
    while Task.objects.filter(state=S.WAITING).exists():
        with CaptureQueriesContext(connection) as queries:
            report = dispatch_once()
        passes += 1
        assert report.woken <= BATCH and report.full == (report.woken == BATCH)
        assert passes <= n // BATCH + 1, "the timers were not woken batch by batch"
        assert len(queries) <= 40, f"a pass of {report.woken} wakes took {len(queries)} statements"
    assert TaskTransition.objects.filter(transition="wake").count() == n
    assert Task.objects.filter(pk__in=[t.pk for t in timers], state=S.PENDING,
                               max_attempts=F("attempts") + 3).count() == n
    first = store().claim_next(worker="w", lease=lease_length())
    assert first.task.pk == earlier.pk  # due before the wake: not starved by ten thousand
    second = store().claim_next(worker="w", lease=lease_length())
    assert second.task.workflow == "demo.timer"


def test_a_batch_wake_that_fails_is_done_row_by_row(owner):
    """One write for the batch; should it fail, each row is woken on its own
    (a bad row costs only itself), and the batch's failure is said."""
    from workflows.models import TaskTransition

    timers = _due_timers(owner, 5)
    with faults.armed("before_wake", error=RuntimeError("the batch's write failed")) as hit:
        report = dispatch_once()
    assert hit.fired == 1  # the batch's write failed; each row alone then went by
    assert report.woken == 5 and report.errors == 0
    assert TaskTransition.objects.filter(transition="wake").count() == 5
    assert Task.objects.filter(pk__in=[t.pk for t in timers], state=S.PENDING).count() == 5
