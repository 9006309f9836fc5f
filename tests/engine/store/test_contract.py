"""The store contract (docs/design.md, "The store"): every verb, run on the
database's own store (literal SQL on PostgreSQL) and on the portable ORM store,
with the same expectations — so the two can never drift apart."""

import itertools
import uuid
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone
from django_fsm import ConcurrentTransition

from tests.factories import make_task
from workflows.engine.leases import Lease, Refused
from workflows.engine.store import rows
from workflows.models import StepCheckpoint, Task, TaskReplay, TaskTransition
from workflows.rules.states import STEP_OVERWRITES, StepState
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(seconds=60)


def fields(task_id) -> dict:
    row = Task.objects.filter(pk=task_id).values().get()
    for name in ("updated_at", "created_at"):
        row.pop(name)
    return row


def history(task_id) -> list[tuple]:
    return list(TaskTransition.objects.filter(task_id=task_id).order_by("id").values_list(
        "transition", "from_state", "to_state", "actor", "reason"))


def db_now():
    return Task.objects.annotate(n=Now()).values_list("n", flat=True)[:1].get() \
        if Task.objects.exists() else None


def near(a, b, seconds=2.0) -> bool:
    return abs((a - b).total_seconds()) < seconds


# --- claim -----------------------------------------------------------------------------------

def test_claim_moves_a_pending_task_to_running_with_a_new_version(any_store, owner):
    task = make_task(owner)
    enqueued = task.enqueued_at
    claimed = any_store.claim(task.pk, worker="w1", lease=LEASE)
    assert claimed is not None and claimed.worker == "w1"
    row = fields(task.pk)
    assert (row["state"], row["attempts"], row["lease_token"], row["lease_owner"]) == (
        S.RUNNING, 1, 1, "w1")
    assert row["next_attempt_at"] is None and row["enqueued_at"] is None
    assert near(row["lease_expires_at"], claimed.db_now + LEASE)
    assert row["started_at"] is not None and near(row["started_at"], claimed.db_now)
    assert claimed.enqueued_at == enqueued
    assert claimed.lease == Lease(task.pk, 1, "w1")
    assert {k: getattr(claimed.task, k) for k in ("state", "attempts", "lease_token")} == {
        "state": S.RUNNING, "attempts": 1, "lease_token": 1}
    assert history(task.pk) == [("claim", "pending", "running", "worker:w1", "attempt 1 of 3")]


REFUSED = {
    "running": lambda owner: make_task(owner, state=S.RUNNING),
    "succeeded": lambda owner: make_task(owner, state=S.SUCCEEDED),
    "failed": lambda owner: make_task(owner, state=S.FAILED),
    "cancelled": lambda owner: make_task(owner, state=S.CANCELLED),
    "cancelling": lambda owner: make_task(owner, state=S.CANCELLING),
    "compensating": lambda owner: make_task(owner, state=S.COMPENSATING),
    "retry_not_due": lambda owner: _retrying(owner, due_in=30),
    "no_attempt_left": lambda owner: _retrying(owner, due_in=-1, attempts_left=0),
}


def _retrying(owner, *, due_in: float, attempts_left: int = 2):
    task = make_task(owner, state=S.RETRYING, max_attempts=1 + attempts_left)
    Task.objects.filter(pk=task.pk).update(next_attempt_at=Now() + timedelta(seconds=due_in))
    return task


@pytest.mark.parametrize("case", REFUSED)
def test_claim_refuses_what_is_not_claimable_and_changes_nothing(any_store, owner, case):
    task = REFUSED[case](owner)
    before, audit = fields(task.pk), history(task.pk)
    assert any_store.claim(task.pk, worker="w", lease=LEASE) is None
    assert (fields(task.pk), history(task.pk)) == (before, audit)


def test_claim_takes_a_due_retry_and_nothing_for_a_missing_task(any_store, owner):
    task = _retrying(owner, due_in=-0.001)
    claimed = any_store.claim(task.pk, worker="w", lease=LEASE)
    assert claimed is not None and claimed.task.attempts == 2 and claimed.task.lease_token == 3
    assert history(task.pk)[-1][:3] == ("claim", "retrying", "running")
    assert any_store.claim(uuid.uuid4(), worker="w", lease=LEASE) is None


def test_a_second_claim_of_the_same_task_finds_nothing(any_store, owner):
    task = make_task(owner)
    assert any_store.claim(task.pk, worker="a", lease=LEASE) is not None
    assert any_store.claim(task.pk, worker="b", lease=LEASE) is None
    assert fields(task.pk)["lease_owner"] == "a"


# --- resume ----------------------------------------------------------------------------------

@pytest.mark.parametrize("state", [S.COMPENSATING, S.CANCELLING])
def test_resume_takes_a_phase_nobody_holds(any_store, owner, state):
    task = make_task(owner, state=state)
    Task.objects.filter(pk=task.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    token = fields(task.pk)["lease_token"]
    claimed = any_store.resume(task.pk, worker="r", lease=LEASE)
    assert claimed is not None
    row = fields(task.pk)
    assert (row["state"], row["lease_token"], row["lease_owner"], row["attempts"]) == (
        state, token + 1, "r", 1)
    assert near(row["lease_expires_at"], claimed.db_now + LEASE)
    assert history(task.pk)[-1] == ("resume", state, state, "worker:r",
                                    "took the compensations over")


RESUME_REFUSED = {
    "live_lease": lambda t: Task.objects.filter(pk=t.pk).update(
        lease_expires_at=Now() + timedelta(seconds=30)),
    "backoff_pending": lambda t: Task.objects.filter(pk=t.pk).update(
        lease_expires_at=None, next_attempt_at=Now() + timedelta(seconds=30)),
}


@pytest.mark.parametrize("case", RESUME_REFUSED)
def test_resume_refuses_a_held_or_waiting_phase(any_store, owner, case):
    task = make_task(owner, state=S.COMPENSATING)
    RESUME_REFUSED[case](task)
    before = fields(task.pk)
    assert any_store.resume(task.pk, worker="r", lease=LEASE) is None
    assert fields(task.pk) == before
    for state in (S.PENDING, S.RUNNING, S.FAILED):
        assert any_store.resume(make_task(owner, state=state).pk, worker="r",
                                lease=LEASE) is None


def test_resume_after_a_cancel_is_for_the_cancelled_run_only(any_store, owner):
    task = make_task(owner)
    claimed = any_store.claim(task.pk, worker="a", lease=LEASE)
    from workflows.engine.operations import task_cancel

    task_cancel(task_id=task.pk, user=owner)
    assert any_store.resume(task.pk, worker="a", lease=LEASE,
                            after_cancel_of=claimed.lease.token - 1) is None
    mine = any_store.resume(task.pk, worker="a", lease=LEASE,
                            after_cancel_of=claimed.lease.token)
    assert mine is not None and mine.task.lease_token == claimed.lease.token + 2
    assert history(task.pk)[-1][:3] == ("resume", "cancelling", "cancelling")
    assert any_store.resume(task.pk, worker="a", lease=LEASE,
                            after_cancel_of=claimed.lease.token) is None


# --- step writes -------------------------------------------------------------------------------

@pytest.fixture
def held(any_store, owner):
    task = make_task(owner)
    return any_store.claim(task.pk, worker="w", lease=LEASE)


def _store_step(task_id, state, **extra):
    StepCheckpoint.objects.update_or_create(task_id=task_id, index=0, defaults={
        "name": "s", "state": state, "output": {"stored": True}, "attempts": 2,
        "compensable": True, "compensation_attempts": 1, "error": "stored error", **extra})


def _row_for(state, now):
    return {
        StepState.RUNNING: rows.started(0, "s", 3, now),
        StepState.SUCCEEDED: rows.succeeded(0, "s", {"new": True}, now, compensable=True),
        StepState.FAILED: rows.failed(0, "s", "new error", now),
        StepState.COMPENSATING: rows.compensation_started(0, "s", 2),
        StepState.COMPENSATED: rows.compensated(0, "s", now),
        StepState.COMPENSATION_FAILED: rows.compensation_failed(0, "s", "no", now),
    }[state]


# What a written state may replace, spelled out here rather than read from
# states.STEP_OVERWRITES: the test's own oracle, so a wrong entry in the engine's
# table (say, `failed` over `succeeded`) is a failure, not the new expectation.
MAY_REPLACE = {
    "running": {"pending", "running", "failed"},
    "succeeded": {"pending", "running", "failed"},
    "failed": {"pending", "running", "failed"},
    "compensating": {"succeeded", "compensating"},
    "compensated": {"succeeded", "compensating"},
    "compensation_failed": {"succeeded", "compensating"},
}


def test_the_engine_table_is_the_one_the_tests_spell_out():
    assert {k: set(v) for k, v in STEP_OVERWRITES.items()} == MAY_REPLACE


@pytest.mark.parametrize("stored, written", list(itertools.product(
    StepState.values, [s for s in StepState.values if s != StepState.PENDING])))
def test_a_step_row_only_moves_forward(any_store, held, stored, written):
    """Enforced by the upsert itself: a succeeded step is never downgraded (only its
    compensation replaces it), a finished compensation never redone."""
    _store_step(held.task.pk, stored)
    any_store.write_steps(held.lease, [_row_for(written, held.db_now)])
    now = StepCheckpoint.objects.get(task_id=held.task.pk, index=0).state
    assert now == (written if stored in MAY_REPLACE[written] else stored)
    if stored == "succeeded" and not written.startswith("compensat"):
        assert now == "succeeded"
    if stored in ("compensated", "compensation_failed"):
        assert now == stored


def test_a_new_step_row_is_inserted_and_an_upsert_keeps_what_it_does_not_say(any_store, held):
    task_id, now = held.task.pk, held.db_now
    any_store.write_steps(held.lease, [rows.started(0, "s", 1, now)])
    any_store.write_steps(held.lease, [rows.succeeded(0, "s", {"out": 1}, now,
                                                      compensable=True),
                                       rows.started(1, "t", 1, now)])
    cp = StepCheckpoint.objects.get(task_id=task_id, index=0)
    assert (cp.state, cp.output, cp.compensable, cp.attempts, cp.started_at) == (
        "succeeded", {"out": 1}, True, 1, now)
    any_store.write_steps(held.lease, [rows.compensation_started(0, "s", 1)])
    any_store.write_steps(held.lease, [rows.compensated(0, "s", now)])
    cp.refresh_from_db()
    # The compensation keeps the forward step's output, attempts, start and flag.
    assert (cp.state, cp.output, cp.compensable, cp.attempts, cp.compensation_attempts,
            cp.started_at) == ("compensated", {"out": 1}, True, 1, 1, now)
    second = StepCheckpoint.objects.get(task_id=task_id, index=1)
    assert (second.state, second.attempts, second.output) == ("running", 1, None)


@pytest.mark.postgres
@pytest.mark.parametrize("stored", [None, "running"])
def test_a_step_write_retried_while_its_first_try_is_still_open_lands_once(any_store, held,
                                                                          stored):
    """The window of a lost connection: the worker's first try of a step boundary
    is still open on the server (its connection gone, the server not yet told)
    when the worker writes the same rows again. The retry sees neither the new row
    nor the update the first try made; it must wait for that try and then move the
    row forward once — not fail on the unique (task, index), not write it twice.
    (PostgreSQL: on SQLite the one writer makes the window impossible.)"""
    import threading

    from django.db import connections, transaction

    task_id, now = held.task.pk, held.db_now
    if stored:
        _store_step(task_id, stored, attempts=1, output=None)
    boundary = [rows.succeeded(0, "s", {"out": 1}, now, compensable=False),
                rows.started(1, "t", 1, now)]
    open_, release, first_error = threading.Event(), threading.Event(), []

    def first_try():
        try:
            with transaction.atomic():
                any_store.write_steps(held.lease, boundary)
                open_.set()
                release.wait(30)
        except BaseException as exc:  # noqa: BLE001 - reported below
            first_error.append(exc)
            open_.set()
        finally:
            connections.close_all()

    opener = threading.Thread(target=first_try)
    opener.start()
    try:
        assert open_.wait(30) and not first_error
        timer = threading.Timer(0.5, release.set)  # the first try commits while we wait
        timer.start()
        any_store.write_steps(held.lease, boundary)
    finally:
        release.set()
        opener.join(30)
    assert not first_error
    got = list(StepCheckpoint.objects.filter(task_id=task_id).order_by("index").values_list(
        "index", "state", "output", "attempts"))
    assert got == [(0, "succeeded", {"out": 1}, 1 if stored else 0), (1, "running", None, 1)]


def test_every_step_write_is_refused_with_another_token(any_store, held):
    stale = Lease(held.task.pk, held.lease.token - 1, "w")
    for write in (lambda: any_store.write_steps(stale, [rows.started(0, "s", 1, held.db_now)]),
                  lambda: any_store.write_steps(stale, [], renew_for=LEASE),
                  lambda: any_store.renew(stale, lease_length=LEASE),
                  lambda: any_store.check(stale),
                  lambda: any_store.save_progress(stale, index=0, progress=1)):
        with pytest.raises(Refused) as refused:
            write()
        assert (refused.value.state, refused.value.token) == (S.RUNNING, held.lease.token)
    assert not StepCheckpoint.objects.filter(task_id=held.task.pk).exists()
    with pytest.raises(Refused) as gone:
        any_store.check(Lease(uuid.uuid4(), 1, "w"))
    assert (gone.value.state, gone.value.token) == (None, None)


def test_renewal_extends_the_lease_from_the_databases_clock(any_store, held):
    Task.objects.filter(pk=held.task.pk).update(lease_expires_at=Now())
    any_store.renew(held.lease, lease_length=timedelta(seconds=300))
    row = fields(held.task.pk)
    assert near(row["lease_expires_at"], held.db_now + timedelta(seconds=300), seconds=5)
    any_store.write_steps(held.lease, [rows.started(0, "s", 1, held.db_now)],
                          renew_for=timedelta(seconds=30))
    assert near(fields(held.task.pk)["lease_expires_at"], held.db_now + timedelta(seconds=30),
                seconds=5)


def test_progress_is_saved_under_the_fence(any_store, held):
    any_store.write_steps(held.lease, [rows.started(0, "s", 1, held.db_now)])
    any_store.save_progress(held.lease, index=0, progress={"cursor": 41})
    assert StepCheckpoint.objects.get(task_id=held.task.pk, index=0).progress == {"cursor": 41}


# --- transitions -------------------------------------------------------------------------------

def test_a_transition_persists_its_diff_audit_and_steps_together(any_store, owner):
    held = any_store.claim(make_task(owner, ttl=timedelta(hours=1)).pk, worker="w", lease=LEASE)
    task, now = held.task, held.db_now
    any_store.transition(task, "succeed", at=now, actor="worker:w", reason="done",
                         result={"r": 1}, now=now,
                         steps=[rows.succeeded(0, "s", {"r": 1}, now, compensable=False)])
    row = fields(task.pk)
    assert (row["state"], row["lease_token"], row["result"], row["lease_owner"]) == (
        S.SUCCEEDED, 2, {"r": 1}, "")
    assert row["expires_at"] - row["finished_at"] == timedelta(hours=1)
    assert (task.state, task.lease_token) == (S.SUCCEEDED, 2)
    assert history(task.pk)[-1] == ("succeed", "running", "succeeded", "worker:w", "done")
    assert StepCheckpoint.objects.get(task_id=task.pk, index=0).output == {"r": 1}


def test_a_refused_transition_writes_nothing_and_leaves_the_copy_as_it_was(any_store, held):
    stale = Task.objects.get(pk=held.task.pk)
    any_store.transition(held.task, "schedule_retry", at=held.db_now, actor="w", error="e",
                         error_type="E", next_attempt_at=held.db_now)
    before, audit = fields(held.task.pk), history(held.task.pk)
    with pytest.raises(ConcurrentTransition):
        any_store.transition(stale, "succeed", at=held.db_now, actor="w", result=1,
                             now=held.db_now,
                             steps=[rows.succeeded(0, "s", 1, held.db_now, compensable=False)])
    assert (stale.state, stale.lease_token, stale.result) == (S.RUNNING, 1, None)
    assert (fields(held.task.pk), history(held.task.pk)) == (before, audit)
    assert not StepCheckpoint.objects.filter(task_id=held.task.pk).exists()


def test_a_locked_batch_moves_like_one_transition_each_in_a_few_statements(any_store, owner):
    """transition_locked_in_tx: the rows the caller locked move by one edge
    together — each as its own `transition` would leave it (fields, audit
    row), the tasks' differing values kept apart — in one UPDATE per set of
    equal new values and one INSERT of audit rows."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    tasks = [make_task(owner, state=S.WAITING, max_attempts=m) for m in (3, 3, 5)]
    alone = make_task(owner, state=S.WAITING, max_attempts=3)
    with transaction.atomic():
        now = db_now()
        locked = any_store.lock_free_in_tx(
            Task.objects.filter(pk__in=[t.pk for t in tasks]).order_by("max_attempts"), 10)
        with CaptureQueriesContext(connection) as queries:
            facts = any_store.transition_locked_in_tx(locked, "wake", at=now, actor="d",
                                                      reason="due", now=now)
        any_store.transition(alone, "wake", at=now, actor="d", reason="due", now=now)
    assert len(queries) == 2  # one UPDATE (the budgets and versions: F() + 1), one INSERT
    assert [(f.transition, f.from_state, f.to_state) for f in facts] == [
        ("wake", S.WAITING, S.PENDING)] * 3
    ignore = {"id", "idempotency_key", "max_attempts", "fingerprint", "trace_id", "started_at"}
    expected = {k: v for k, v in fields(alone.pk).items() if k not in ignore}
    for task in tasks:
        row = fields(task.pk)
        assert {k: v for k, v in row.items() if k not in ignore} == expected
        assert row["max_attempts"] == task.max_attempts + 1
        assert history(task.pk)[-1] == ("wake", "waiting", "pending", "d", "due")


def test_a_batch_update_is_grouped_by_what_differs_and_shares_the_rest():
    """_update_groups: equal new values are constants, equal moves are F() + n,
    only what truly differs splits the batch."""
    from django.db.models import F

    from workflows.engine.store.orm import _update_groups

    a, b, c = (Task(pk=n, lease_token=n, max_attempts=3, error=e, state=S.PENDING)
               for n, e in ((1, "x"), (2, "y"), (3, "x")))
    befores = [{"lease_token": t.lease_token - 1, "max_attempts": 2, "error": "",
                "state": S.WAITING} for t in (a, b, c)]
    groups = _update_groups([a, b, c], befores, ["error", "lease_token", "max_attempts",
                                                 "state"])
    assert [pks for _, pks in groups] == [[1, 3], [2]]
    for values, _ in groups:
        assert values["lease_token"] == F("lease_token") + 1
        assert (values["max_attempts"], values["state"]) == (3, S.PENDING)
    assert [values["error"] for values, _ in groups] == ["x", "y"]


def test_a_locked_batch_with_an_illegal_edge_writes_nothing(any_store, owner):
    from django.db import transaction
    from django_fsm import TransitionNotAllowed

    waiting = make_task(owner, state=S.WAITING)
    pending = make_task(owner)
    before = [(fields(t.pk), history(t.pk)) for t in (waiting, pending)]
    with transaction.atomic():
        now = db_now()
        locked = any_store.lock_free_in_tx(
            Task.objects.filter(pk__in=[waiting.pk, pending.pk]).order_by("state"), 10)
        with pytest.raises(TransitionNotAllowed):
            any_store.transition_locked_in_tx(locked, "wake", at=now, actor="d", now=now)
        assert [t.state for t in locked] == [S.PENDING, S.WAITING]  # as they were
    assert [(fields(t.pk), history(t.pk)) for t in (waiting, pending)] == before


@pytest.mark.postgres
def test_the_literal_claim_and_the_fsm_claim_leave_the_same_row(owner):
    """The PostgreSQL store claims without django-fsm in the loop; hold its row
    to the one django-fsm's `claim` produces through the ORM store."""
    from workflows.engine.store.orm import OrmStore
    from workflows.engine.store.postgres import PostgresStore

    results = []
    for store_ in (PostgresStore(), OrmStore()):
        task = make_task(owner, state=S.RETRYING)
        Task.objects.filter(pk=task.pk).update(next_attempt_at=Now() - timedelta(seconds=1))
        claimed = store_.claim(task.pk, worker="same", lease=LEASE)
        row = fields(task.pk)
        for name in ("id", "idempotency_key", "lease_expires_at", "started_at"):
            row.pop(name)
        results.append((row, [(*h[:4], h[4]) for h in history(task.pk)][-1],
                        claimed.task.lease_token))
    assert results[0] == results[1]


# --- the queue ---------------------------------------------------------------------------------

def test_claim_next_takes_due_tasks_in_due_order_and_nothing_else(any_store, owner):
    late = make_task(owner, key="late")
    early = make_task(owner, key="early")
    backoff = _retrying(owner, due_in=30)
    due_retry = _retrying(owner, due_in=-60)
    exhausted = _retrying(owner, due_in=-120, attempts_left=0)
    Task.objects.filter(pk=late.pk).update(next_attempt_at=Now() - timedelta(seconds=1))
    Task.objects.filter(pk=early.pk).update(next_attempt_at=Now() - timedelta(seconds=2))
    make_task(owner, state=S.RUNNING)
    make_task(owner, state=S.SUCCEEDED)
    order = []
    while (claimed := any_store.claim_next(worker="q", lease=LEASE)) is not None:
        order.append(claimed.task.pk)
        assert claimed.task.state == S.RUNNING and claimed.worker == "q"
    assert order == [due_retry.pk, early.pk, late.pk]
    assert fields(backoff.pk)["state"] == S.RETRYING
    assert fields(exhausted.pk)["state"] == S.RETRYING
    assert history(early.pk)[-1][:4] == ("claim", "pending", "running", "worker:q")


@pytest.mark.postgres
def test_claim_next_passes_by_a_task_another_claim_holds(any_store, owner):
    import threading

    from django.db import connection, connections, transaction

    first, second = make_task(owner, key="first"), make_task(owner, key="second")
    Task.objects.filter(pk=first.pk).update(next_attempt_at=Now() - timedelta(seconds=5))
    holding, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT id FROM workflows_task WHERE id = %s FOR UPDATE",
                               [first.pk])
            holding.set()
            release.wait(30)
        connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30)
        claimed = any_store.claim_next(worker="q", lease=LEASE)
        assert claimed is not None and claimed.task.pk == second.pk  # not blocked: skipped
    finally:
        release.set()
        holder.join(30)
    assert any_store.claim_next(worker="q", lease=LEASE).task.pk == first.pk


def test_a_success_claims_the_next_due_task_in_the_same_write(any_store, owner):
    held = any_store.claim(make_task(owner, key="done-now").pk, worker="w", lease=LEASE)
    following = make_task(owner, key="next", payload={"nested": {"n": [1, 2]}})
    fact = any_store.transition(
        held.task, "succeed", at=held.db_now, actor="worker:w", result=1, now=held.db_now,
        steps=[rows.succeeded(0, "s", 1, held.db_now, compensable=False)],
        then_claim_for=("w", LEASE))
    claimed = fact.following
    assert fields(held.task.pk)["state"] == S.SUCCEEDED
    # The facts the engine announces: the success, and the claim the same write made.
    assert (fact.task_id, fact.transition, fact.from_state, fact.to_state, fact.actor,
            fact.delivery) == (held.task.pk, "succeed", S.RUNNING, S.SUCCEEDED, "worker:w", None)
    assert claimed is not None and claimed.moved is not None
    assert (claimed.moved.task_id, claimed.moved.transition, claimed.moved.from_state,
            claimed.moved.to_state, claimed.moved.attempt, claimed.moved.actor) == (
        following.pk, "claim", S.PENDING, S.RUNNING, 1, "worker:w")
    assert claimed is not None and claimed.task.pk == following.pk and claimed.worker == "w"
    assert (claimed.task.state, claimed.task.lease_token, claimed.task.attempts) == (
        S.RUNNING, 1, 1)
    # The claimed task is whole, as the ORM would read it (JSON as objects, times aware).
    stored = Task.objects.get(pk=following.pk)
    assert {f.attname: getattr(claimed.task, f.attname) for f in Task._meta.concrete_fields} \
        == {f.attname: getattr(stored, f.attname) for f in Task._meta.concrete_fields}
    assert claimed.task.payload == {"nested": {"n": [1, 2]}}
    assert fields(following.pk)["lease_owner"] == "w"
    assert history(following.pk)[-1][:4] == ("claim", "pending", "running", "worker:w")
    # Nothing due: the success alone.
    last = any_store.claim_next(worker="w", lease=LEASE)
    assert last is None
    assert any_store.transition(
        claimed.task, "succeed", at=claimed.db_now, actor="worker:w", result=2,
        now=claimed.db_now,
        steps=[rows.succeeded(0, "s", 2, claimed.db_now, compensable=False)],
        then_claim_for=("w", LEASE)).following is None
    assert fields(following.pk)["state"] == S.SUCCEEDED


def test_a_refused_success_claims_nothing(any_store, owner):
    held = any_store.claim(make_task(owner, key="mine").pk, worker="w", lease=LEASE)
    stale = Task.objects.get(pk=held.task.pk)
    any_store.transition(held.task, "schedule_retry", at=held.db_now, actor="w", error="e",
                         error_type="E", next_attempt_at=held.db_now)
    waiting = make_task(owner, key="waiting")
    with pytest.raises(ConcurrentTransition):
        any_store.transition(stale, "succeed", at=held.db_now, actor="w", result=1,
                             now=held.db_now,
                             steps=[rows.succeeded(0, "s", 1, held.db_now, compensable=False)],
                             then_claim_for=("w", LEASE))
    assert fields(waiting.pk)["state"] == S.PENDING


@pytest.mark.postgres
def test_no_hot_statement_reads_a_whole_table(owner):
    """Each hot statement reaches its rows through a key, also in the generic plan
    a prepared statement settles on: one step write planned as a hash anti-join
    read every checkpoint at every step boundary (PILOT end to end fell to a
    quarter of its rate in make bench, and no test noticed). Checked with
    EXPLAIN on a store holding thousands of rows, the planner's statistics fresh."""
    import json
    import re

    from django.db import connection

    from workflows.engine.store.postgres import QUERIES, _numbered
    from workflows.engine.store.sql import transition_statement
    from workflows.rules.fingerprint import fingerprint

    now = timezone.now()
    tasks = Task.objects.bulk_create(
        Task(owner=owner, idempotency_key=f"bulk-{i}", workflow="demo.echo", payload={},
             fingerprint=fingerprint("demo.echo", {}), max_attempts=3, created_at=now,
             updated_at=now, next_attempt_at=now, lease_token=1)
        for i in range(1500))
    StepCheckpoint.objects.bulk_create(
        StepCheckpoint(task_id=t.pk, index=i, name=f"s{i}", state="succeeded")
        for t in tasks for i in range(3))
    TaskReplay.objects.bulk_create(TaskReplay(task_id=t.pk, workflow="demo.echo", count=1,
                                              at=now) for t in tasks for _ in range(2))
    task = tasks[0]
    steps = json.dumps([{"index": 3, "name": "s3", "state": "running", "output": None,
                         "attempts": 1, "compensable": False, "compensation_attempts": 0,
                         "error": "", "started_at": None, "finished_at": None}])
    common = {"task_id": task.pk, "token": 1, "steps": steps, "lease_seconds": 60,
              "transition": "succeed", "from_state": "running", "to_state": "succeeded",
              "actor": "a", "reason": "", "at": now, "deliver": False, "restarts": 0,
              "callback_url": "", "give_up_seconds": 60, "v0": now, "owner_id": owner.pk,
              "key": "bulk-1", "fingerprint": task.fingerprint, "id": uuid.uuid4(),
              "workflow": "demo.echo", "payload": "{}", "max_attempts": 3, "source": "api",
              "trace_id": "", "traceparent": "", "idempotency_ttl": timedelta(days=1),
              "progress": "1", "index": 0, "priority": 0, "version": 1, "parent_id": None,
              "parent_step": "", "parent_index": None}
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workflows_task, workflows_stepcheckpoint, "
                       "workflows_taskreplay, workflows_tasktransition")
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            sets = '"updated_at" = %(v0)s'
            for name, sql in (
                    *((n, QUERIES[n]) for n in ("write_steps", "write_steps_renew",
                                                "save_progress", "create_or_replay", "renew",
                                                "check")),
                    ("transition", transition_statement(sets, with_steps=False,
                                                        then_claim=False)),
                    ("transition_with_steps", transition_statement(sets, with_steps=True,
                                                                   then_claim=False))):
                key, text, names = _numbered(sql)
                cursor.execute(f"PREPARE plan_{key} AS {text}")
                cursor.execute(f"EXPLAIN EXECUTE plan_{key}({', '.join(['%s'] * len(names))})",
                               [common[n] for n in names])
                plan = "\n".join(row[0] for row in cursor.fetchall())
                cursor.execute(f"DEALLOCATE plan_{key}")
                for table in ("workflows_task", "workflows_stepcheckpoint",
                              "workflows_taskreplay"):
                    assert not re.search(rf"Seq Scan on {table}\b(?!_|replay)", plan), (
                        name, plan)
        finally:
            cursor.execute("RESET plan_cache_mode")


@pytest.mark.postgres
def test_the_claim_reads_the_queue_in_claim_order_whatever_the_history(owner):
    """claim_next walks pilot_task_claim_idx (priority DESC, next_attempt_at) and
    stops at the first due row: it never sorts the due set nor reads the
    history. Beside a history of finished tasks the planner, multiplying the
    selectivity of the state by that of next_attempt_at, expected one due row
    and sorted every due task read from pilot_task_due_idx instead: O(backlog)
    per claim (issue 34, bench/results.md section 12). Generic plans, as the
    prepared statement settles on; without and with caps."""
    from django.db import connection

    from workflows.engine.store.postgres import QUERIES, _numbered

    pending = make_task(owner, key="due")
    key, text, names = _numbered(QUERIES["claim_next"])
    plans = []
    with connection.cursor() as cursor:
        # Copies of it: 100 due at three priorities, 20 000 succeeded.
        cursor.execute("""
            INSERT INTO workflows_task
            SELECT r.*
              FROM workflows_task AS t, generate_series(1, 20100) AS g,
                   jsonb_populate_record(NULL::workflows_task, to_jsonb(t) || CASE
                       WHEN g <= 100 THEN jsonb_build_object('priority', g %% 3)
                       ELSE jsonb_build_object('state', 'succeeded', 'next_attempt_at', NULL,
                                               'finished_at', t.created_at) END
                       || jsonb_build_object('id', gen_random_uuid(), 'idempotency_key',
                                             'copy-' || g)) AS r
             WHERE t.id = %s""",
                       [pending.pk])
        cursor.execute("ANALYZE workflows_task")
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute(f"PREPARE plan_{key} AS {text}")
            for caps in (None, '{"client": 2, "own": {}, "total": {}}'):
                params = {"caps": caps, "task_id": None, "worker": "w", "lease_seconds": 60,
                          "actor": "worker:w"}
                cursor.execute(f"EXPLAIN EXECUTE plan_{key}({', '.join(['%s'] * len(names))})",
                               [params[n] for n in names])
                plans.append("\n".join(row[0] for row in cursor.fetchall()))
            cursor.execute(f"DEALLOCATE plan_{key}")
        finally:
            cursor.execute("RESET plan_cache_mode")
    for plan in plans:
        candidates = plan[plan.index("CTE prior"):plan.index("CTE claimed")]
        assert "Index Scan using pilot_task_claim_idx on workflows_task c" in candidates, plan
        assert "Sort" not in candidates and "Seq Scan on workflows_task" not in plan, plan


# --- the replay log --------------------------------------------------------------------------

def test_fold_replays_keeps_the_newest_row_of_each_task_hour_with_the_sum(any_store, owner):
    """Both stores fold the same log to the same rows: per (task, UTC hour) with
    more than one row, the newest row (ties: the highest id) kept with the summed
    count, the others gone; a lone row, another hour, a row before `since` and the
    batch limit respected; the report counts groups folded, rows removed, groups
    found."""
    from datetime import UTC, datetime

    one, two = make_task(owner), make_task(owner)
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)

    def at(hours, minute):
        return hour + timedelta(hours=hours, minutes=minute)

    def entry(task, when, count=1):
        return TaskReplay.objects.create(task=task, workflow=task.workflow, count=count,
                                         at=when).pk

    entry(one, at(0, 5), 2)
    tie_low = entry(one, at(0, 40))
    tie_high = entry(one, at(0, 40), 3)      # same `at`: the higher id is kept
    entry(one, at(-5, 1)), entry(one, at(-5, 2))  # before `since`: left alone
    lone = entry(one, at(1, 0))               # its hour has one row
    entry(two, at(2, 10)), entry(two, at(2, 59, ), 4)
    newest_two = entry(two, at(2, 59) + timedelta(seconds=30))

    def log():
        return sorted(TaskReplay.objects.filter(at__gte=hour).values_list("task_id", "at",
                                                                           "count", "id"))

    # One group per call: (task, hour) order, then nothing found beyond the batch.
    assert any_store.fold_replays(since=hour, batch=1)[2] == 1
    assert any_store.fold_replays(since=hour, batch=5) == (1, 2, 1)
    assert any_store.fold_replays(since=hour, batch=5) == (0, 0, 0)
    assert log() == sorted([(one.pk, at(0, 40), 6, tie_high), (one.pk, at(1, 0), 1, lone),
                            (two.pk, at(2, 59) + timedelta(seconds=30), 6, newest_two)])
    assert not TaskReplay.objects.filter(pk=tie_low).exists()
    assert TaskReplay.objects.filter(at__lt=hour).count() == 2
    assert any_store.fold_replays(since=None, batch=5) == (1, 1, 1)
    assert TaskReplay.objects.filter(at__lt=hour).values_list("count", flat=True).get() == 2
