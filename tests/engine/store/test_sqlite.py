"""SQLite, the embedded default (docs/design.md, "SQLite"): one writer at a time.

- an atomic step takes the write lock at its first write, not at BEGIN, so a
  trigger goes through while the step computes or waits before writing;
- a heartbeat that cannot get the lock in time (another task's atomic step
  holds it) is skipped, not the step's failure: it costs no attempt;
- a claim that loses a race returns nothing (it used to raise DatabaseError).

The first two are about SQLite's single writer and run only there; the claim
race runs on every database."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections

from tests.support.helpers import pop_queued
from workflows.engine.claims import task_claim
from workflows.engine.runner import task_run
from workflows.engine.triggers import task_trigger
from workflows.models import DemoOrder, StepCheckpoint, Task

pytestmark = pytest.mark.django_db(transaction=True)
sqlite_only = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3",
    reason="about SQLite's single writer (PostgreSQL has none); runs in the SQLite pass")

BUSY_MS = 400  # a short busy timeout: waiting for the lock becomes a visible failure


def _short_busy_timeout():
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_MS}")


def _worker(target):
    def body():
        try:
            _short_busy_timeout()
            target()
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


@sqlite_only
def test_a_trigger_goes_through_while_an_atomic_step_waits_before_writing(owner,
                                                                          temp_workflow):
    """Item 9: the atomic step's transaction used to begin IMMEDIATE — holding
    SQLite's only write lock for its whole body — so a trigger behind it waited
    the busy timeout and failed with `database is locked`."""
    entered, proceed = threading.Event(), threading.Event()
    batch = uuid.uuid4().hex[:8]
    wf = temp_workflow("t.sqlite_late_write", max_attempts=1)

    @wf.step(atomic=True)
    def write(ctx):
        entered.set()
        assert proceed.wait(30)  # computing, calling out, waiting: no write yet
        DemoOrder.objects.bulk_create([DemoOrder(batch=batch, n=n) for n in range(5)])
        return 5

    task = task_trigger(owner=owner, key=batch, workflow="t.sqlite_late_write",
                        payload={}).task
    pop_queued()
    outcome = {}
    worker = _worker(lambda: outcome.update(r=task_run(task_id=task.pk, worker="w")))
    try:
        assert entered.wait(30)
        _short_busy_timeout()
        other = task_trigger(owner=owner, key="meanwhile", workflow="demo.echo", payload={})
        assert other.outcome == "created"
    finally:
        proceed.set()
        worker.join(30)
    assert outcome["r"].outcome == "succeeded"
    assert DemoOrder.objects.filter(batch=batch).count() == 5


@sqlite_only
def test_a_heartbeat_blocked_by_another_tasks_atomic_step_costs_no_attempt(owner,
                                                                           temp_workflow):
    """Item 9: while task X's atomic step holds the write lock (it wrote, then
    waits), task Y heartbeats. The renewal cannot get the lock within the busy
    timeout; it is skipped — Y's lease, renewed moments ago, still holds — and
    Y's step goes on. It used to fail the step with `database is locked`."""
    y_running, x_holds, y_beat = threading.Event(), threading.Event(), threading.Event()
    wf_x = temp_workflow("t.sqlite_holder", max_attempts=1)
    wf_y = temp_workflow("t.sqlite_beater", max_attempts=1)

    @wf_x.step(atomic=True)
    def hold(ctx):
        DemoOrder.objects.create(batch="holder", n=0)  # takes the write lock
        x_holds.set()
        assert y_beat.wait(30)
        return "held"

    @wf_y.step
    def beat(ctx):
        y_running.set()
        assert x_holds.wait(30)
        ctx.heartbeat(force=True)
        y_beat.set()
        return "beat"

    x = task_trigger(owner=owner, key="x", workflow="t.sqlite_holder", payload={}).task
    y = task_trigger(owner=owner, key="y", workflow="t.sqlite_beater", payload={}).task
    pop_queued()
    reports = {}
    y_thread = _worker(lambda: reports.update(y=task_run(task_id=y.pk, worker="y")))
    assert y_running.wait(30)  # Y claimed and is in its step: no lock held
    x_thread = _worker(lambda: reports.update(x=task_run(task_id=x.pk, worker="x")))
    x_thread.join(60)
    y_thread.join(60)
    assert (reports["x"].outcome, reports["y"].outcome) == ("succeeded", "succeeded")
    y.refresh_from_db()
    assert y.attempts == 1
    assert StepCheckpoint.objects.get(task_id=y.pk, name="beat").attempts == 1


def test_a_claim_that_loses_the_race_returns_nothing(owner, monkeypatch):
    """Item 10: two deliveries read the pending task; the second claims first.
    The first's compare-and-set then matches nothing and it returns None — on
    SQLite it used to raise DatabaseError ("did not affect any rows")."""
    task = task_trigger(owner=owner, key="race", workflow="demo.echo", payload={}).task
    pop_queued()
    real = Task.is_due

    def interleave(self, now):
        monkeypatch.setattr(Task, "is_due", real)
        assert task_claim(task_id=self.pk, worker="B") is not None  # B wins meanwhile
        return real(self, now)

    from workflows.engine.store import store
    from workflows.engine.store.orm import OrmStore

    ours = store() if isinstance(store(), OrmStore) and type(store()).claim is OrmStore.claim \
        else OrmStore()
    monkeypatch.setattr(Task, "is_due", interleave)
    assert ours.claim(task.pk, worker="A", lease=timedelta(seconds=60)) is None
    task.refresh_from_db()
    assert (task.state, task.attempts, task.lease_owner) == ("running", 1, "B")
