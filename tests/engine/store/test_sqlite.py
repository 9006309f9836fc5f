"""SQLite, the embedded default (docs/design.md, "SQLite"): one writer at a time.

- an atomic step holds the write lock from its BEGIN (IMMEDIATE) to its COMMIT:
  a step that reads, waits, then writes succeeds however many commits others
  try meanwhile (they wait for it); begun DEFERRED it failed on every round
  whenever anyone committed between its read and its write (review turn 3, F2);
- the shipped demos under a writer committing every 0.2 s, as django-q2's
  guard cycle does in `make run`: `demo.sync_orders` writes its rows on its
  first attempt, a failing `demo.saga` compensates everything;
- a trigger behind a running atomic step waits for it and goes through;
- a heartbeat that cannot get the lock in time (another task's atomic step
  holds it) is skipped, not the step's failure: it costs no attempt;
- a claim that loses a race returns nothing (it used to raise DatabaseError).

All but the claim race are about SQLite's single writer and run only there; the
claim race runs on every database. tests/acceptance/test_embedded_default.py
runs the demos with real processes and `make run`'s settings."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.cache import caches
from django.db import connection, connections

from tests.support.helpers import pop_queued, task_claim
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.run import task_run
from workflows.engine.triggers import task_trigger
from workflows.models import DemoLedger, DemoOrder, StepCheckpoint, Task, TaskTransition
from workflows.rules.states import TaskState as S

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


class _GuardCycle:
    """A writer committing every `every` seconds on its own connection, as
    django-q2's cluster saves its statistics to the cache table (pilot_cache)
    every guard cycle under `make run`. Counts its commits and keeps its longest
    wait: a commit that waited for an atomic step is the window of F2 hit."""

    def __init__(self, every: float = 0.2):
        self.every, self.commits, self.longest_wait = every, 0, 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                caches["djangoq"].set("cluster-stat", time.time())
                self.longest_wait = max(self.longest_wait, time.monotonic() - started)
                self.commits += 1
                time.sleep(self.every)
        finally:
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


def _until_finished(task, *, seconds: float = 120) -> list[str]:
    outcomes = []
    deadline = time.monotonic() + seconds
    while not Task.objects.get(pk=task.pk).is_finished:
        assert time.monotonic() < deadline, outcomes
        outcomes.append(task_run(task_id=task.pk, worker="w").outcome)
        dispatch_once()
    return outcomes


@sqlite_only
def test_an_atomic_step_that_reads_then_writes_succeeds_while_another_writer_commits(
        owner, temp_workflow):
    """The deterministic window of F2: the step has read; another connection
    commits; the step writes. The other writer now waits for the step's COMMIT
    (it held the write lock since BEGIN), so the step succeeds on its first round
    instead of being refused on every one."""
    batch = uuid.uuid4().hex[:8]
    wf = temp_workflow("t.sqlite_read_then_write", max_attempts=1)
    read_done, other_done = threading.Event(), threading.Event()
    rounds, order = [], []

    @wf.step(atomic=True)
    def write(ctx):
        rounds.append(DemoOrder.objects.filter(batch=batch).count())  # the read
        read_done.set()
        time.sleep(0.3)  # the other writer tries to commit now: it has to wait
        assert not other_done.is_set()
        DemoOrder.objects.create(batch=batch, n=rounds[-1])  # the write
        order.append("step wrote")
        return 1

    def other_writer():
        assert read_done.wait(30)
        caches["djangoq"].set(f"stat-{uuid.uuid4().hex}", 1)  # a guard-cycle write
        order.append("other committed")
        other_done.set()

    task = task_trigger(owner=owner, key=batch, workflow="t.sqlite_read_then_write",
                        payload={}).task
    pop_queued()
    writer = threading.Thread(target=lambda: (other_writer(), connections.close_all()))
    writer.start()
    try:
        report = task_run(task_id=task.pk, worker="w")
    finally:
        writer.join(30)
    assert report.outcome == "succeeded" and rounds == [0]
    assert order == ["step wrote", "other committed"]  # the fault landed, and waited
    assert DemoOrder.objects.filter(batch=batch).count() == 1


@sqlite_only
def test_demo_sync_orders_beside_a_guard_cycle_writer_writes_on_its_first_attempt(
        owner, settings):
    """demo.sync_orders, step_seconds 0.6 (its atomic `write` waits with
    ctx.sleep, whose fence check is a read), heartbeats every 0.2 s, a commit
    every 0.2 s: it failed all five attempts with `database is locked`."""
    settings.PILOT_HEARTBEAT_SECONDS = 0.2
    batch = uuid.uuid4().hex[:8]
    task = task_trigger(owner=owner, key=batch, workflow="demo.sync_orders",
                        payload={"batch": batch, "count": 3, "step_seconds": 0.6}).task
    pop_queued()
    with _GuardCycle() as guard:
        outcomes = _until_finished(task)
    # The writer committed while the task ran, and once had to wait for the write
    # step: it tried to commit between the step's read and its write.
    assert guard.commits >= 2 and guard.longest_wait >= 0.3
    task.refresh_from_db()
    assert (task.state, task.attempts, outcomes) == (S.SUCCEEDED, 1, ["succeeded"])
    assert DemoOrder.objects.filter(batch=batch).count() == 3


@sqlite_only
def test_demo_saga_beside_a_guard_cycle_writer_compensates_everything(owner, settings):
    """demo.saga's contract — on failure the ledger holds exactly reserve,
    charge, refund, release — with its atomic compensations each waiting 0.6 s
    beside a writer committing every 0.2 s: they used to be refused every round
    and given up."""
    settings.PILOT_HEARTBEAT_SECONDS = 0.2
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.saga",
                        payload={"fail": True, "step_seconds": 0.3,
                                 "compensate_seconds": 0.6}).task
    pop_queued()
    with _GuardCycle() as guard:
        _until_finished(task)
    assert guard.commits >= 1 and guard.longest_wait >= 0.3  # it waited for a compensation
    task.refresh_from_db()
    assert (task.state, task.error_type) == (S.FAILED, "NonRetryableError")
    assert sorted(DemoLedger.objects.filter(task=str(task.pk))
                  .values_list("action", flat=True)) == ["charge", "refund", "release",
                                                         "reserve"]
    assert "defer" not in TaskTransition.objects.filter(task_id=task.pk).values_list(
        "transition", flat=True)  # not one compensation was refused


@sqlite_only
def test_a_trigger_behind_a_running_atomic_step_waits_for_it_and_goes_through(
        owner, temp_workflow):
    """The price of the rule above, bounded: a trigger that arrives while an
    atomic step runs waits for the step's COMMIT (up to PILOT_SQLITE_TIMEOUT),
    then goes through."""
    entered, proceed = threading.Event(), threading.Event()
    batch = uuid.uuid4().hex[:8]
    wf = temp_workflow("t.sqlite_holds", max_attempts=1)

    @wf.step(atomic=True)
    def write(ctx):
        entered.set()
        assert proceed.wait(30)
        DemoOrder.objects.bulk_create([DemoOrder(batch=batch, n=n) for n in range(5)])
        return 5

    task = task_trigger(owner=owner, key=batch, workflow="t.sqlite_holds", payload={}).task
    pop_queued()
    outcome = {}
    worker = threading.Thread(target=lambda: (outcome.update(r=task_run(task_id=task.pk,
                                                                          worker="w")),
                                              connections.close_all()))
    worker.start()
    try:
        assert entered.wait(30)
        threading.Timer(0.5, proceed.set).start()
        started = time.monotonic()
        other = task_trigger(owner=owner, key="meanwhile", workflow="demo.echo", payload={})
        waited = time.monotonic() - started
    finally:
        proceed.set()
        worker.join(30)
    assert other.outcome == "created"
    assert waited >= 0.4  # it queued behind the step (the window was hit)
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
