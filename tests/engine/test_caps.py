"""Fair shares of the workers (docs/design.md, "Fairness").

The rules run on both stores (SQLite in the SQLite pass, PostgreSQL in the
other). The races are PostgreSQL's: each racing claim runs on its own
connection, and the window where two claims compete for a client's last slot
is held open deterministically (one claim's transaction stays open while the
other is shown to wait on the client's lock)."""

import random
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from tests.support.helpers import pop_queued, run_at_once
from workflows.engine import caps
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.run import task_run
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.django_db(transaction=True)]

LEASE = timedelta(seconds=60)


def trigger(owner, workflow="demo.echo", n=1):
    return [task_trigger(owner=owner, workflow=workflow, payload={"i": i},
                         key=uuid.uuid4().hex).task for i in range(n)]


def running_of(owner):
    return Task.objects.filter(owner=owner, state=S.RUNNING).count()


def finish(claimed):
    """The claimed task's success (its slot frees)."""
    now = store().db_now()
    store().transition(claimed.task, "succeed", at=now, actor="test", result={}, now=now)


def in_thread(fn):
    box, done = {}, threading.Event()

    def body():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc
        finally:
            connections.close_all()
            done.set()

    threading.Thread(target=body, daemon=True).start()
    return box, done


def advisory_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                       "AND NOT granted")
        return cursor.fetchone()[0]


def wait_for(condition, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_a_client_at_its_cap_waits_while_another_client_runs(owner, other_owner):
    mine = trigger(owner, n=3)
    theirs = trigger(other_owner)
    first = store().claim_next(worker="w1", lease=LEASE)
    second = store().claim_next(worker="w2", lease=LEASE)
    assert (first.task.pk, second.task.pk) == (mine[0].pk, theirs[0].pk)
    assert store().claim_next(worker="w3", lease=LEASE) is None  # owner is at 1 of 1
    assert store().claim(mine[1].pk, worker="w3", lease=LEASE) is None
    finish(first)
    assert store().claim_next(worker="w3", lease=LEASE).task.pk == mine[1].pk


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_a_refused_message_is_owed_and_sent_once_when_the_slot_frees(owner):
    tasks = trigger(owner, n=4)
    pop_queued()
    held = store().claim(tasks[0].pk, worker="w1", lease=LEASE)
    for task in tasks[1:]:  # each message arrives while the owner is at its cap
        assert store().claim(task.pk, worker="w2", lease=LEASE) is None
    assert list(Task.objects.filter(pk__in=[t.pk for t in tasks[1:]])
                .values_list("enqueued_at", flat=True)) == [None] * 3
    for _ in range(3):  # no message while no slot is free: no loop of refusals
        assert dispatch_once().owed_enqueued == 0
    assert pop_queued() == []
    finish(held)
    assert dispatch_once().owed_enqueued == 1
    assert pop_queued() == [str(tasks[1].pk)]  # the oldest, and only one: one slot
    assert dispatch_once().owed_enqueued == 0  # its message is outstanding now


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_the_finishing_run_hands_its_slot_to_the_clients_next_task(owner):
    tasks = trigger(owner, n=2)
    claimed = store().claim_next(worker="w1", lease=LEASE)
    now = store().db_now()
    following = store().transition(claimed.task, "succeed", at=now, actor="test",
                                   steps=[], result={}, now=now,
                                   then_claim_for=("w1", LEASE)).following
    assert following is not None and following.task.pk == tasks[1].pk


def test_max_running_and_concurrency_are_caps_of_their_own(owner, other_owner,
                                                           temp_workflow):
    slow = temp_workflow("fair.batch", max_running=1, concurrency=2)
    slow.add_step("s", lambda ctx: None)
    with override_settings(PILOT_MAX_RUNNING_PER_CLIENT=5):
        batches = trigger(owner, slow.name, 2) + trigger(other_owner, slow.name, 2)
        echoes = trigger(owner, n=2)
        claimed = [store().claim_next(worker=f"w{i}", lease=LEASE) for i in range(6)]
        names = sorted(c.task.pk for c in claimed if c is not None)
    # one batch per client (max_running=1), two over all (concurrency=2); the
    # client's echoes count apart from its batches
    assert names == sorted([batches[0].pk, batches[2].pk, echoes[0].pk, echoes[1].pk])
    assert caps.caps()["own"] == {"fair.batch": 1}


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["claim", "claim_next"])
@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_two_claims_for_the_last_slot_are_decided_one_after_the_other(owner, how):
    """The window: claim 1 has counted the owner's running tasks and claimed, but
    not committed. Claim 2 must wait for it (the owner's lock) and then see it;
    counting on its own snapshot, it would take a second slot."""
    tasks = trigger(owner, n=2)
    release, first_claimed = threading.Event(), threading.Event()

    def first():
        with transaction.atomic():
            claimed = store().claim(tasks[0].pk, worker="w1", lease=LEASE)
            first_claimed.set()
            release.wait(10)
            return claimed

    def second():
        if how == "claim":
            return store().claim(tasks[1].pk, worker="w2", lease=LEASE)
        return store().claim_next(worker="w2", lease=LEASE)

    box1, done1 = in_thread(first)
    assert first_claimed.wait(10)
    box2, done2 = in_thread(second)
    wait_for(lambda: advisory_waiters() == 1, "the second claim to wait on the owner's lock")
    assert not done2.is_set()
    release.set()
    assert done1.wait(10) and done2.wait(10)
    assert box1.get("value") is not None and "error" not in box1
    assert "error" not in box2 and box2["value"] is None
    assert running_of(owner) == 1


@pytest.mark.postgres
@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=2)
def test_many_workers_claiming_and_finishing_never_exceed_a_cap(owner, other_owner,
                                                               temp_workflow):
    """Eight workers claim (by id, from the queue, and chained on a success) and
    finish as fast as they can while a monitor reads the running tasks on its
    own connection: no snapshot ever shows a client above its cap or a
    workflow above its concurrency."""
    limited = temp_workflow("fair.limited", concurrency=3)
    limited.add_step("s", lambda ctx: None)
    tasks = (trigger(owner, n=40) + trigger(other_owner, n=40)
             + trigger(owner, limited.name, 20) + trigger(other_owner, limited.name, 20))
    ids = [t.pk for t in tasks]
    stop, seen, violations = threading.Event(), [], []

    def monitor():
        try:
            while not stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT owner_id, workflow = %s, count(*) FROM workflows_task "
                                   "WHERE state = 'running' GROUP BY 1, 2", [limited.name])
                    rows = cursor.fetchall()
                per_owner, per_limited = {}, 0
                for owner_id, is_limited, n in rows:
                    per_owner[owner_id] = per_owner.get(owner_id, 0) + n
                    per_limited += n if is_limited else 0
                seen.append(max(per_owner.values(), default=0))
                if max(per_owner.values(), default=0) > 2 or per_limited > 3:
                    violations.append(rows)
        finally:
            connections.close_all()

    def work(i):
        rng = random.Random(i)
        claimed = None
        while not stop.is_set():
            if claimed is None:
                claimed = (store().claim(rng.choice(ids), worker=f"w{i}", lease=LEASE)
                           if rng.random() < 0.3 else
                           store().claim_next(worker=f"w{i}", lease=LEASE))
                if claimed is None:
                    if not Task.objects.filter(state=S.PENDING).exists():
                        return
                    continue
            now = store().db_now()
            claimed = store().transition(claimed.task, "succeed", at=now, actor=f"w{i}",
                                         result={}, now=now,
                                         then_claim_for=(f"w{i}", LEASE)
                                         if rng.random() < 0.5 else None).following

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    try:
        results = run_at_once(8, work, timeout=120)
    finally:
        stop.set()
        watcher.join(10)
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert violations == []
    assert max(seen) == 2  # the caps were reached, not merely never approached
    assert Task.objects.filter(pk__in=ids, state=S.SUCCEEDED).count() == len(ids)


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=0)
def test_zero_means_no_cap(owner):
    trigger(owner, n=3)
    assert caps.caps() is None
    assert all(store().claim_next(worker=f"w{i}", lease=LEASE) for i in range(3))


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_a_worker_drains_other_clients_work_past_a_capped_clients_backlog(owner, other_owner):
    mine = trigger(owner, n=5)
    theirs = trigger(other_owner, n=2)
    held = store().claim(mine[0].pk, worker="w1", lease=LEASE)
    assert held is not None
    report = task_run(task_id=str(mine[1].pk), worker="w2", drain_seconds=5)
    assert report.outcome == "skipped"  # its message refused: the owner is at its cap
    assert {t.state for t in Task.objects.filter(pk__in=[t.pk for t in theirs])} == {
        S.SUCCEEDED}
    assert Task.objects.filter(owner=owner, state=S.PENDING).count() == 4


@pytest.mark.parametrize("option", ["max_running", "concurrency"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2", 1_000_001])
def test_a_cap_that_is_not_a_positive_integer_is_refused_at_definition(option, value):
    from django.core.exceptions import ImproperlyConfigured

    from workflows.registry import Workflow

    with pytest.raises(ImproperlyConfigured, match=f"{option} must be None or an integer"):
        Workflow("fair.bad", **{option: value})


@pytest.mark.parametrize("value", [-1, "2", 1.5, None])
def test_a_bad_client_cap_stops_the_check(value):
    from workflows.checks import pilot_execution_settings

    with override_settings(PILOT_MAX_RUNNING_PER_CLIENT=value):
        ids = [e.id for e in pilot_execution_settings(None)]
    assert "pilot.E009" in ids


def test_the_workflows_caps_are_in_its_description(temp_workflow):
    workflow = temp_workflow("fair.described", max_running=2, concurrency=7)
    assert (workflow.describe()["max_running"], workflow.describe()["concurrency"]) == (2, 7)


@pytest.mark.postgres
@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=2)
def test_the_caps_hold_while_runs_fail_retry_compensate_and_are_cancelled(
        owner, other_owner, temp_workflow):
    """The real runner on six worker threads (each message drains the queue), a
    dispatcher thread, and an operator cancelling at random; steps fail and are
    retried, failures and cancels compensate. A monitor on its own connection
    never sees a client holding more than 2 tasks (running, or compensating and
    cancelling under a live lease) or the limited workflow above 3,
    and every task ends with each step's effect recorded at most once per
    attempt."""
    from workflows.engine.operations import task_cancel
    from workflows.rules.errors import PilotError, RetryableError

    effects, lock = [], threading.Lock()

    def flaky(ctx):
        with lock:
            effects.append((ctx.task_id, ctx.attempt))
        time.sleep(random.random() / 200)
        if random.random() < 0.3:
            raise RetryableError("flaky")
        return ctx.attempt

    workflows = []
    for name, options in (("fair.flaky", {}), ("fair.limited2", {"concurrency": 3})):
        wf = temp_workflow(name, max_attempts=3, backoff_initial=0, backoff_max=0, **options)
        wf.add_step("a", lambda ctx: 1, compensation=lambda ctx: None)
        wf.add_step("b", flaky)
        workflows.append(wf)
    tasks = [t for o in (owner, other_owner) for wf in workflows
             for t in trigger(o, wf.name, 15)]
    ids = [t.pk for t in tasks]
    stop, violations, seen = threading.Event(), [], []

    def monitor():
        try:
            while not stop.is_set():
                with connection.cursor() as cursor:  # every task a worker holds
                    cursor.execute("SELECT owner_id, workflow, count(*) FROM workflows_task "
                                   "WHERE state = 'running' OR (state IN ('compensating', "
                                   "'cancelling') AND lease_expires_at > now()) GROUP BY 1, 2")
                    rows = cursor.fetchall()
                by_owner, limited = {}, 0
                for owner_id, workflow, n in rows:
                    by_owner[owner_id] = by_owner.get(owner_id, 0) + n
                    limited += n if workflow == "fair.limited2" else 0
                seen.append(max(by_owner.values(), default=0))
                if max(by_owner.values(), default=0) > 2 or limited > 3:
                    violations.append(rows)
        finally:
            connections.close_all()

    def background(fn):
        def loop():
            try:
                while not stop.is_set():
                    fn()
                    time.sleep(0.02)
            finally:
                connections.close_all()
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    rng = random.Random(7)

    def cancel_one():
        if rng.random() < 0.2:
            try:
                task_cancel(task_id=rng.choice(ids), user=owner, owner_may=False)
            except PilotError:
                pass  # finished already, or not cancellable now

    threads = [threading.Thread(target=monitor, daemon=True)]
    threads[0].start()
    threads += [background(dispatch_once), background(cancel_one)]

    def work(i):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not Task.objects.filter(pk__in=ids).exclude(
                    state__in=[S.SUCCEEDED, S.FAILED, S.CANCELLED]).exists():
                return
            task_run(task_id=str(random.choice(ids)), worker=f"w{i}", drain_seconds=0.3)
            time.sleep(0.005)
        raise AssertionError("the tasks did not all end within 60 s")

    try:
        results = run_at_once(6, work, timeout=90)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert violations == []
    assert max(seen) == 2
    ended = dict(Task.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert set(ended.values()) <= {S.SUCCEEDED, S.FAILED, S.CANCELLED}
    assert S.SUCCEEDED in set(ended.values()) and effects  # the steps really ran
    assert len({(str(t), a) for t, a in effects}) == len(effects)  # once per attempt


# --- undo work counts too (review turn 3, security N5) --------------------------------

def _undoable(temp_workflow):
    wf = temp_workflow("fair.undoable", max_attempts=1)
    wf.add_step("a", lambda ctx: 1, compensation=lambda ctx: None)
    wf.add_step("b", lambda ctx: 2)
    return wf


def _compensating(owner, *, held: bool):
    """A task of `owner` in its compensation phase, its step `a` to undo: held by
    a worker (`held`, as the failing worker keeps its lease), or waiting for one
    (as the dispatcher leaves a poison task)."""
    from workflows.engine.store import rows

    [task] = trigger(owner, "fair.undoable")
    with override_settings(PILOT_MAX_RUNNING_PER_CLIENT=0):  # set-up: beside anything held
        claimed = store().claim(task.pk, worker="failing", lease=LEASE)
    now = store().db_now()
    store().write_steps(claimed.lease, [rows.succeeded(0, "a", 1, now, compensable=True)])
    store().transition(claimed.task, "compensate", at=now, actor="test", error="boom",
                       error_type="Boom", worker="failing" if held else "",
                       now=now if held else None, lease=LEASE if held else None)
    return claimed.task


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_a_held_compensation_phase_takes_its_clients_slot(owner, other_owner, temp_workflow):
    _undoable(temp_workflow)
    _compensating(owner, held=True)
    mine, theirs = trigger(owner), trigger(other_owner)
    assert store().claim(mine[0].pk, worker="w", lease=LEASE) is None  # 1 of 1: the undo
    assert store().claim_next(worker="w", lease=LEASE).task.pk == theirs[0].pk


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_a_cancelled_running_task_keeps_its_slot_while_its_worker_still_runs(owner):
    """The cancel of a running task used to free its slot at once, while its
    worker was still in the step: the client briefly held cap + 1 workers."""
    from workflows.engine.operations import task_cancel

    first, second = trigger(owner, n=2)
    assert store().claim(first.pk, worker="w1", lease=LEASE) is not None
    assert task_cancel(task_id=first.pk, user=owner).state == S.CANCELLING
    assert store().claim(second.pk, worker="w2", lease=LEASE) is None
    assert store().claim_next(worker="w2", lease=LEASE) is None


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_undo_work_waiting_for_a_worker_goes_before_the_clients_new_runs(owner,
                                                                         temp_workflow):
    _undoable(temp_workflow)
    undo = _compensating(owner, held=False)
    [new] = trigger(owner)
    assert store().claim(new.pk, worker="w", lease=LEASE) is None  # the slot is the undo's
    assert store().claim_next(worker="w", lease=LEASE) is None
    taken = store().resume(undo.pk, worker="w", lease=LEASE)
    assert taken is not None
    now = store().db_now()
    store().transition(taken.task, "fail", at=now, actor="test", error="boom",
                       error_type="Boom", now=now)
    assert store().claim(new.pk, worker="w", lease=LEASE) is not None  # now the new run


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_a_take_over_refused_at_the_cap_is_owed_and_sent_when_the_slot_frees(
        owner, temp_workflow):
    _undoable(temp_workflow)
    [running] = trigger(owner)
    held = store().claim(running.pk, worker="w1", lease=LEASE)
    undo = _compensating(owner, held=False)
    pop_queued()
    Task.objects.filter(pk=undo.pk).update(enqueued_at=store().db_now())  # a message on its way
    assert store().resume(undo.pk, worker="w2", lease=LEASE) is None  # 1 of 1 held
    undo.refresh_from_db()
    assert (undo.state, undo.enqueued_at, undo.lease_owner) == (S.COMPENSATING, None, "")
    for _ in range(3):  # no message while no slot is free: no loop of refusals
        assert dispatch_once().compensations_enqueued == 0
    assert pop_queued() == []
    finish(held)
    assert dispatch_once().compensations_enqueued == 1
    assert pop_queued() == [str(undo.pk)]
    assert store().resume(undo.pk, worker="w2", lease=LEASE) is not None


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=1)
def test_the_worker_whose_own_attempt_was_cancelled_takes_its_phase_over_at_the_cap(
        owner, temp_workflow):
    from workflows.engine.operations import task_cancel

    _undoable(temp_workflow)
    [task] = trigger(owner, "fair.undoable")
    claimed = store().claim(task.pk, worker="w1", lease=LEASE)
    task_cancel(task_id=task.pk, user=owner)
    assert store().resume(task.pk, worker="w1", lease=LEASE,
                          after_cancel_of=claimed.lease.token) is not None


@pytest.mark.postgres
def test_two_claims_for_a_workflows_last_concurrency_slot_are_decided_one_after_the_other(
        owner, other_owner, temp_workflow):
    """Mutant M6 of review turn 3 (the claim's count without the workflow's
    lock): claim 1 of a `concurrency=1` workflow has counted and claimed, not
    committed; claim 2, another client's, must wait for it at the workflow's
    lock and then see it. Without the lock both ran."""
    limited = temp_workflow("fair.one_at_a_time", concurrency=1)
    limited.add_step("s", lambda ctx: None)
    [mine], [theirs] = trigger(owner, limited.name), trigger(other_owner, limited.name)
    release, first_claimed = threading.Event(), threading.Event()

    def first():
        with transaction.atomic():
            claimed = store().claim(mine.pk, worker="w1", lease=LEASE)
            first_claimed.set()
            release.wait(10)
            return claimed

    box1, done1 = in_thread(first)
    assert first_claimed.wait(10)
    box2, done2 = in_thread(lambda: store().claim(theirs.pk, worker="w2", lease=LEASE))
    wait_for(lambda: advisory_waiters() == 1, "the second claim to wait on the workflow's lock")
    assert not done2.is_set()
    release.set()
    assert done1.wait(10) and done2.wait(10)
    assert box1.get("value") is not None and "error" not in box1
    assert "error" not in box2 and box2["value"] is None
    assert Task.objects.filter(workflow=limited.name, state=S.RUNNING).count() == 1
