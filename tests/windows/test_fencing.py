"""The fence (docs/design.md, "Fencing"): every transition moves the task's
token on, and every write a worker makes names the token it holds — so after
any change, a worker that held the task can never write again.

- every kind of worker write, after every kind of token change, is refused and
  changes nothing (table-driven);
- the review's zombie: a worker stalled past its lease, recovered, then the
  task cancelled and taken over — the zombie's writes are refused and it runs
  no compensation;
- a claim racing a cancel + retry(from_start) never runs with the old
  checkpoints (no ABA).
"""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from tests.support.helpers import (
    audit,
    drain,
    expire_lease,
    in_thread,
    pop_queued,
    task_claim,
    task_resume,
    wait_for,
)
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.leases import Refused, classify
from workflows.engine.operations import task_cancel, task_retry
from workflows.engine.run import task_run
from workflows.engine.store import rows, store
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task
from workflows.rules.errors import CancelRequested, LeaseLost, NonRetryableError
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


def snapshot(task_id):
    task = Task.objects.filter(pk=task_id).values().get()
    task.pop("updated_at")
    return task, sorted(StepCheckpoint.objects.filter(task_id=task_id).values_list(
        "index", "state", "output", "progress", "attempts", "compensation_attempts"))


# --- what a worker holding the task may write --------------------------------------------

def _at(task):
    return task.updated_at


def _transition(claimed, name, **kwargs):
    """A worker's transition: a compare-and-set on its token; refused like any write."""
    from django_fsm import ConcurrentTransition

    try:
        store().transition(claimed.task, name, at=_at(claimed.task), actor="w", **kwargs)
    except ConcurrentTransition:
        raise store().refusal(claimed.lease) from None


FORWARD_WRITES = {
    "boundary": lambda c: store().write_steps(c.lease, [
        rows.succeeded(0, "one", "out", _at(c.task), compensable=True),
        rows.started(1, "two", 1, _at(c.task))]),
    "boundary_with_renewal": lambda c: store().write_steps(
        c.lease, [rows.started(0, "one", 2, _at(c.task))], renew_for=timedelta(seconds=60)),
    "heartbeat": lambda c: store().renew(c.lease, lease_length=timedelta(seconds=60)),
    "atomic_heartbeat": lambda c: store().check(c.lease),
    "progress": lambda c: store().save_progress(c.lease, index=0, progress={"cursor": 9}),
    "succeed": lambda c: _transition(c, "succeed", result=1, now=_at(c.task)),
    "schedule_retry": lambda c: _transition(
        c, "schedule_retry", error="e", error_type="E", next_attempt_at=_at(c.task),
        steps=[rows.failed(0, "one", "e", _at(c.task))]),
    "fail": lambda c: _transition(c, "fail", error="e", error_type="E", now=_at(c.task)),
    "compensate": lambda c: _transition(c, "compensate", error="e", error_type="E",
                                        worker="w", now=_at(c.task),
                                        lease=timedelta(seconds=60)),
    "resume_after_cancel": lambda c: _resume_or_refuse(c),  # noqa: PLW0108 - defined below
}


def _resume_or_refuse(claimed):
    if store().resume(claimed.task.pk, worker="w", lease=timedelta(seconds=60),
                      after_cancel_of=claimed.lease.token) is None:
        raise store().refusal(claimed.lease)


PHASE_WRITES = {
    "compensation_started": lambda c: store().write_steps(
        c.lease, [rows.compensation_started(0, "one", 1)]),
    "compensated": lambda c: store().write_steps(c.lease, [rows.compensated(0, "one",
                                                                            _at(c.task))]),
    "compensation_failed": lambda c: store().write_steps(
        c.lease, [rows.compensation_failed(0, "one", "no", _at(c.task))]),
    "heartbeat": FORWARD_WRITES["heartbeat"],
    "progress": FORWARD_WRITES["progress"],
    "defer": lambda c: _transition(c, "defer", next_attempt_at=_at(c.task)),
    "end": lambda c: _transition(
        c, "fail" if c.task.state == S.COMPENSATING else "finish_cancel", error="",
        error_type="", now=_at(c.task)),
}


@pytest.fixture
def two_steps(temp_workflow):
    wf = temp_workflow("t.fenced", max_attempts=5, backoff_initial=0, backoff_max=0)
    wf.add_step("one", lambda ctx: "out", compensation=lambda ctx: None)
    wf.add_step("two", lambda ctx: "out")
    return wf


def _running(owner):
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="t.fenced",
                        payload={}).task
    pop_queued()
    claimed = task_claim(task_id=task.pk, worker="A")
    store().write_steps(claimed.lease, [rows.started(0, "one", 1, claimed.db_now)])
    return claimed


def _takeover(owner, claimed):
    expire_lease(claimed.task.pk)
    dispatch_once()
    Task.objects.filter(pk=claimed.task.pk).update(next_attempt_at=None)
    assert task_claim(task_id=claimed.task.pk, worker="B") is not None


def _recover(owner, claimed):
    expire_lease(claimed.task.pk)
    assert dispatch_once().recovered == 1


def _cancel(owner, claimed):
    assert task_cancel(task_id=claimed.task.pk, user=owner).state == S.CANCELLING


def _cancel_then_retry(owner, claimed):
    _cancel(owner, claimed)
    expire_lease(claimed.task.pk)
    assert task_run(task_id=claimed.task.pk, worker="B").outcome == "cancelled"
    task_retry(task_id=claimed.task.pk, user=owner)


TOKEN_CHANGES = {"takeover": _takeover, "recover": _recover, "cancel": _cancel,
                 "cancel_then_retry": _cancel_then_retry}


@pytest.mark.parametrize("write, change", [
    (write, change) for write in FORWARD_WRITES for change in TOKEN_CHANGES
    # the one legal move after a cancel of one's own run: the next test
    if (write, change) != ("resume_after_cancel", "cancel")])
def test_every_write_of_a_running_worker_is_refused_after_every_token_change(
        owner, two_steps, write, change):
    claimed = _running(owner)
    TOKEN_CHANGES[change](owner, claimed)
    before = snapshot(claimed.task.pk)
    with pytest.raises(Refused) as refused:
        FORWARD_WRITES[write](claimed)
    assert snapshot(claimed.task.pk) == before
    signal = classify(refused.value)
    assert isinstance(signal, CancelRequested if change == "cancel" else LeaseLost)


def test_after_a_cancel_of_its_own_run_a_worker_may_only_take_the_phase_over(
        owner, two_steps):
    claimed = _running(owner)
    _cancel(owner, claimed)
    resumed = task_resume(task_id=claimed.task.pk, worker="C")
    assert resumed is None  # A's lease is alive: nobody else may take it
    again = store().resume(claimed.task.pk, worker="A", lease=timedelta(seconds=60),
                           after_cancel_of=claimed.lease.token)
    assert again is not None and again.task.lease_token == claimed.lease.token + 2
    # ... and only once: the token moved on again.
    assert store().resume(claimed.task.pk, worker="A", lease=timedelta(seconds=60),
                          after_cancel_of=claimed.lease.token) is None


def _phase(owner, state):
    claimed = _running(owner)
    store().write_steps(claimed.lease, [rows.succeeded(0, "one", "out", claimed.db_now,
                                                       compensable=True)])
    if state == S.COMPENSATING:
        store().transition(claimed.task, "compensate", at=claimed.db_now, actor="A",
                           error="e", error_type="E", worker="A", now=claimed.db_now,
                           lease=timedelta(seconds=60))
        return claimed.__class__(claimed.task, claimed.db_now, None, "A")
    _cancel(owner, claimed)
    return store().resume(claimed.task.pk, worker="A", lease=timedelta(seconds=60),
                          after_cancel_of=claimed.lease.token)


@pytest.mark.parametrize("state", [S.COMPENSATING, S.CANCELLING])
@pytest.mark.parametrize("write", PHASE_WRITES)
def test_every_write_of_a_compensating_worker_is_refused_after_a_takeover(
        owner, two_steps, write, state):
    held = _phase(owner, state)
    assert held.task.state == state
    expire_lease(held.task.pk)
    taken = task_resume(task_id=held.task.pk, worker="B")
    assert taken is not None and taken.task.lease_token == held.lease.token + 1
    before = snapshot(held.task.pk)
    with pytest.raises(Refused):
        PHASE_WRITES[write](held)
    assert snapshot(held.task.pk) == before
    # The new holder's same write goes through.
    PHASE_WRITES[write](taken)


# --- the review's windows ------------------------------------------------------------------

def test_a_recovered_zombie_cannot_compensate_after_a_cancel_and_a_takeover(
        owner, temp_workflow):
    """Item 3: worker A stalls in step b past its lease; the dispatcher
    recovers the task, the owner cancels it, worker C takes the cancel over and
    compensates. A wakes: its writes are refused (lease lost, not "cancel
    requested": the cancel was not of A's run), so it runs no compensation."""
    calls = []
    wf = temp_workflow("t.zombie", max_attempts=3, backoff_initial=30, backoff_max=30)

    def undo_a(ctx):
        calls.append(("undo_a", ctx._lease.worker))

    def undo_b(ctx):
        calls.append(("undo_b", ctx._lease.worker))

    @wf.step(compensation=undo_a)
    def a(ctx):
        return "a"

    @wf.step(compensation=undo_b)
    def b(ctx):
        # A stalls here; on other connections the world moves on.
        def meanwhile():
            expire_lease(ctx.task_id)
            assert dispatch_once().recovered == 1
            assert task_cancel(task_id=ctx.task_id, user=owner).state == S.CANCELLING
            [message] = pop_queued()
            calls.append(("C", task_run(task_id=message, worker="C").outcome))

        in_thread(meanwhile)
        return "b"

    task = task_trigger(owner=owner, key="zz", workflow="t.zombie", payload={}).task
    pop_queued()
    report = task_run(task_id=task.pk, worker="A")
    assert report.outcome == "lease_lost"
    assert calls == [("undo_a", "C"), ("C", "cancelled")]
    assert Task.objects.get(pk=task.pk).state == S.CANCELLED
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "recover", "cancel", "resume",
                                                 "finish_cancel"]
    # b never succeeded (A's record was refused), so nothing of b is undone.
    assert list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index")
                .values_list("name", "state")) == [("a", "compensated"), ("b", "failed")]


@pytest.fixture
def two_step_retry(temp_workflow):
    calls = []
    fail = [True]
    wf = temp_workflow("t.aba", max_attempts=1)

    @wf.step
    def fetch(ctx):
        calls.append("fetch")
        return {"version": len(calls)}

    @wf.step
    def use(ctx):
        calls.append("use")
        if fail[0]:
            raise NonRetryableError("first run fails")
        return ctx.outputs["fetch"]

    return calls, fail


def _failed_then_retried(owner, calls, fail):
    task = task_trigger(owner=owner, key="aba", workflow="t.aba", payload={}).task
    [message] = pop_queued()
    assert task_run(task_id=message, worker="w").outcome == "failed"
    fail[0] = False
    task_retry(task_id=task.pk, user=owner)  # resume: pending, token 3
    pop_queued()
    return task


def test_a_claim_read_before_a_cancel_and_retry_from_start_cannot_win(
        owner, two_step_retry, monkeypatch):
    """Item 3 (ABA), for the store that reads before its compare-and-set: the
    operator cancels and retries from the start between the claim's read and
    its write. pending/3 and pending/5 are different versions, so the stale
    claim loses; the retry's own delivery runs every step again."""
    from workflows.engine.store.orm import OrmStore

    calls, fail = two_step_retry
    task = _failed_then_retried(owner, calls, fail)
    real = Task.is_due

    def interleave(self, now):
        monkeypatch.setattr(Task, "is_due", real)
        task_cancel(task_id=self.pk, user=owner)
        task_retry(task_id=self.pk, user=owner, from_start=True)
        return real(self, now)

    monkeypatch.setattr(Task, "is_due", interleave)
    assert OrmStore().claim(task.pk, worker="stale", lease=timedelta(seconds=60)) is None
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.result == {"version": 3}
    assert calls == ["fetch", "use", "fetch", "use"]
    assert list(StepCheckpoint.objects.filter(task_id=task.pk).values_list("state", flat=True)) \
        == ["succeeded", "succeeded"]


@pytest.mark.postgres
def test_a_claim_waiting_on_a_cancel_and_retry_from_start_runs_from_the_start(
        owner, two_step_retry):
    """Item 3 (ABA), PostgreSQL's one-statement claim: it waits for the
    operator's transaction (cancel, then retry from start) holding the row,
    then claims the new version and reads the checkpoints after it — so the
    run that follows starts from the first step."""
    calls, fail = two_step_retry
    task = _failed_then_retried(owner, calls, fail)
    holding, release = threading.Event(), threading.Event()

    def operator():
        with transaction.atomic():
            Task.objects.select_for_update().get(pk=task.pk)
            holding.set()
            assert release.wait(30)
            task_cancel(task_id=task.pk, user=owner)
            task_retry(task_id=task.pk, user=owner, from_start=True)

    op = threading.Thread(target=lambda: (operator(), connections.close_all()))
    op.start()
    assert holding.wait(30)
    box = {}
    worker = threading.Thread(target=lambda: (box.update(r=task_run(task_id=task.pk,
                                                                    worker="w2")),
                                              connections.close_all()))
    worker.start()
    wait_for(_waiting_on_a_lock, what="the claim to wait on the row lock")
    release.set()
    op.join(30)
    worker.join(30)
    assert box["r"].outcome == "succeeded"
    assert calls == ["fetch", "use", "fetch", "use"]
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.result == {"version": 3}


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0] > 0


def test_a_stale_worker_cannot_write_after_a_retry_from_a_step(owner, temp_workflow):
    """A worker paused between two steps loses its lease; the dispatcher fails
    the task (no attempt left) and the operator retries it from its first step.
    The stale worker wakes, runs its next body and its record is refused (the
    retry moved the version twice since its claim); the retry's own run
    records both steps, from the step asked for."""
    from workflows.engine.run.driver import Run

    calls = []
    wf = temp_workflow("t.from_step_fence", max_attempts=1)

    @wf.step
    def fetch(ctx):
        calls.append("fetch")
        return len(calls)

    @wf.step
    def use(ctx):
        calls.append("use")
        return {"fetched": ctx.outputs["fetch"]}

    task = task_trigger(owner=owner, key="fence-from", workflow="t.from_step_fence",
                        payload={}).task
    pop_queued()
    stale = Run(task.pk, "stale-worker").steps()
    assert next(stale) == "claimed" and next(stale) == "step"  # fetch about to run
    assert next(stale) == "step"  # fetch recorded, use recorded started: paused before its body
    expire_lease(task.pk)
    assert dispatch_once().failed == 1
    task_retry(task_id=task.pk, user=owner, from_step="fetch")
    assert list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index")
                .values_list("state", flat=True)) == ["pending", "pending"]
    with pytest.raises(StopIteration):
        while True:
            next(stale)  # use's body runs; its record is refused: the run ends
    assert list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index")
                .values_list("state", flat=True)) == ["pending", "pending"]
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert calls == ["fetch", "use", "fetch", "use"]
    assert task.state == S.SUCCEEDED and task.result == {"fetched": 3}  # the second fetch
