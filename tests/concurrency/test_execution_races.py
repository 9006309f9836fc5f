"""Execution races on PostgreSQL, each actor on its own connection."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from tests.support import helpers as claims
from tests.support.helpers import drain, expire_lease, pop_queued, queued_task_ids, run_at_once
from workflows.engine.dispatcher import RESENDS_PER_PASS, dispatch_once
from workflows.engine.leases import Refused
from workflows.engine.operations import task_cancel
from workflows.engine.run import task_run
from workflows.engine.store import rows, store
from workflows.engine.triggers import TriggerRequest, task_trigger, task_trigger_many
from workflows.models import DemoOrder, Task, TaskTransition
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def in_thread(fn):
    """Run fn on another thread (so on another database connection) and wait."""
    box = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc
        finally:
            connections.close_all()

    t = threading.Thread(target=body)
    t.start()
    t.join(60)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_many_workers_claiming_one_task_yield_one_claim(owner, enough_connections):
    for _ in range(10):
        task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.echo",
                            payload={}).task
        results = run_at_once(20, lambda i, pk=task.pk: claims.task_claim(task_id=pk,
                                                                           worker=f"w{i}"))
        assert [type(r) for r in results if isinstance(r, BaseException)] == []
        assert sum(1 for r in results if r is not None) == 1
        task.refresh_from_db()
        assert (task.state, task.attempts, task.lease_token) == (S.RUNNING, 1, 1)


def test_two_dispatchers_never_double_recover_or_double_enqueue(owner, enough_connections):
    for _ in range(10):
        Task.objects.all().delete()
        pop_queued()
        results = task_trigger_many(owner=owner, requests=[
            TriggerRequest("demo.echo", {"n": i}, f"k{i}") for i in range(60)])
        ids = [r.task.pk for r in results]
        pop_queued()
        for pk in ids[:20]:  # 20 dead workers
            claims.task_claim(task_id=pk, worker="dead")
            expire_lease(pk)
        stale = timezone.now() - timedelta(seconds=60)
        # 20 lost messages, and nobody has claimed anything for a minute.
        Task.objects.filter(pk__in=ids[20:40]).update(enqueued_at=stale, next_attempt_at=stale)
        TaskTransition.objects.filter(transition="claim").update(at=stale)
        reports = run_at_once(8, lambda i: dispatch_once())
        assert [r for r in reports if isinstance(r, BaseException)] == []
        assert sum(r.recovered for r in reports) == 20
        # Each pass re-sends a few of the oldest lost messages, never one twice.
        assert RESENDS_PER_PASS <= sum(r.reenqueued for r in reports) <= 20
        recovers = TaskTransition.objects.filter(transition="recover")
        assert recovers.count() == 20 and len(set(recovers.values_list("task_id", flat=True))) == 20
        queued = queued_task_ids()
        assert len(queued) == len(set(queued))  # nothing enqueued twice


def test_the_dispatcher_skips_a_row_another_connection_holds(owner):
    task = task_trigger(owner=owner, key="held", workflow="demo.echo", payload={}).task
    pop_queued()
    claims.task_claim(task_id=task.pk, worker="dead")
    expire_lease(task.pk)
    holding, release = threading.Event(), threading.Event()

    def hold_lock():
        with transaction.atomic():
            Task.objects.select_for_update().get(pk=task.pk)
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=lambda: (hold_lock(), connections.close_all()))
    holder.start()
    holding.wait(10)
    try:
        assert dispatch_once().recovered == 0  # SKIP LOCKED: not blocked, not recovered
    finally:
        release.set()
        holder.join(10)
    assert dispatch_once().recovered == 1


def test_a_zombie_worker_cannot_commit_its_atomic_step_after_a_takeover(owner, temp_workflow):
    wf = temp_workflow("test.zombie", max_attempts=3, backoff_initial=0, backoff_max=0)
    paused_once = []

    @wf.step(atomic=True)
    def write(ctx):
        DemoOrder.objects.bulk_create([DemoOrder(batch="zombie", n=n) for n in range(10)])
        if not paused_once:
            paused_once.append(ctx.task_id)
            # This worker stalls past its lease; meanwhile, on other connections,
            # the dispatcher recovers the task and a second worker runs it.
            def takeover():
                expire_lease(ctx.task_id)
                dispatch_once()
                return task_run(task_id=ctx.task_id, worker="second").outcome

            assert in_thread(takeover) == "succeeded"
        return {"rows": 10}

    task = task_trigger(owner=owner, key="z", workflow="test.zombie", payload={}).task
    pop_queued()
    report = task_run(task_id=task.pk, worker="first")
    assert report.outcome == "lease_lost"
    task.refresh_from_db()
    # claim (1), recover (2), claim (3), succeed (4): every transition a new version.
    assert (task.state, task.lease_token, task.result) == (S.SUCCEEDED, 4, {"rows": 10})
    assert DemoOrder.objects.filter(batch="zombie").count() == 10  # the zombie's rolled back
    assert list(TaskTransition.objects.filter(task_id=task.pk).order_by("id")
                .values_list("transition", "actor")) == [
        ("claim", "worker:first"), ("recover", TaskTransition.objects.filter(
            task_id=task.pk, transition="recover").get().actor),
        ("claim", "worker:second"), ("succeed", "worker:second")]


def test_a_stale_token_is_refused_while_the_new_holder_writes(owner):
    """A worker two token changes behind (recover, a new claim) is refused on a step
    write and a fence check, while the new holder's write goes through. Every
    kind of write after every kind of token change: tests/windows/test_fencing.py."""
    task = task_trigger(owner=owner, key="stale", workflow="demo.echo", payload={}).task
    pop_queued()
    first = claims.task_claim(task_id=task.pk, worker="first")
    expire_lease(task.pk)
    dispatch_once()
    Task.objects.filter(pk=task.pk).update(next_attempt_at=timezone.now())
    second = claims.task_claim(task_id=task.pk, worker="second")
    assert second.lease.token == first.lease.token + 2  # recover, then the new claim
    with pytest.raises(Refused):
        store().write_steps(first.lease, [rows.started(0, "echo", 1, timezone.now())])
    with pytest.raises(Refused):
        store().check(first.lease)
    store().write_steps(second.lease, [rows.started(0, "echo", 1, timezone.now())])


def test_a_cancel_racing_an_atomic_step_leaves_no_effect_behind(owner, temp_workflow):
    wf = temp_workflow("test.racecancel", max_attempts=1)
    started, proceed = threading.Event(), threading.Event()

    @wf.step(atomic=True)
    def write(ctx):
        DemoOrder.objects.bulk_create([DemoOrder(batch="raced", n=n) for n in range(5)])
        started.set()
        proceed.wait(30)  # the operator's cancel commits now, on another connection
        return "written"

    task = task_trigger(owner=owner, key="rc", workflow="test.racecancel", payload={}).task
    pop_queued()
    worker = threading.Thread(target=lambda: (task_run(task_id=task.pk, worker="w"),
                                              connections.close_all()))
    worker.start()
    assert started.wait(30)
    assert task_cancel(task_id=task.pk, user=owner).state == S.CANCELLING
    proceed.set()
    worker.join(30)
    task.refresh_from_db()
    assert task.state == S.CANCELLED
    assert DemoOrder.objects.filter(batch="raced").count() == 0
    assert task.result is None


def test_drain_still_finishes_everything_after_the_races(owner):
    task_trigger_many(owner=owner, requests=[
        TriggerRequest("demo.sync_orders", {"batch": f"r{i}", "count": 3}, f"r{i}")
        for i in range(10)])
    drain()
    assert set(Task.objects.values_list("state", flat=True)) == {S.SUCCEEDED}
    assert DemoOrder.objects.count() == 30
