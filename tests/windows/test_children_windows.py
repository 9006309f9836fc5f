"""The hard windows of child tasks (docs/writing-workflows.md, "Children"),
each opened at its exact point, on PostgreSQL with separate connections: a
crash after the children started and before the step's checkpoint, a crash
with half of them started, a child ending while its parent parks, the last two
children ending at once, a child ending while the parent is cancelled, the
parent's compensation while children run, and more parents than workers."""

import threading
import uuid

import pytest

from tests.support.helpers import (
    audit,
    background,
    drain,
    expire_lease,
    pop_queued,
    row_lock_waiters,
    run_at_once,
    wait_for,
)
from workflows.engine import faults, task_cancel
from workflows.engine.announce import parent_settle
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def trigger(owner, workflow, payload):
    return task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                        payload=payload).task


def kids(parent):
    return list(Task.objects.filter(parent_id=parent.pk).order_by("parent_index"))


def transitions(task):
    return [t for t, _, _ in audit(task.pk)]


def test_a_crash_after_the_children_started_and_before_the_checkpoint_starts_no_child_twice(
        owner):
    parent = trigger(owner, "demo.fanout", {"children": 4})
    [message] = pop_queued()
    with faults.armed("after_step_body"), pytest.raises(faults.SimulatedCrash):
        run_task(message)
    first = kids(parent)
    assert len(first) == 4  # committed before the crash; the step's checkpoint is not
    expire_lease(parent.pk)
    drain(lambda: Task.objects.get(pk=parent.pk).is_finished, resend_ok=True)
    parent.refresh_from_db()
    assert parent.state == S.SUCCEEDED and parent.children_count == 4
    assert [k.pk for k in kids(parent)] == [k.pk for k in first]  # the same four, once each
    assert {k.state for k in kids(parent)} == {S.SUCCEEDED}
    assert parent.steps.get(name="spawn").attempts == 2


def test_a_crash_with_half_of_the_children_started_starts_each_child_once(owner, temp_workflow):
    wf = temp_workflow("t.halves")

    @wf.step
    def spawn(ctx):
        first = ctx.start_children("demo.echo", [{"n": i} for i in range(3)])
        return first + ctx.start_children("demo.echo", [{"n": i} for i in range(3, 6)])

    wf.wait_for_children("gather")
    parent = trigger(owner, "t.halves", {})
    [message] = pop_queued()
    # The first batch committed, the second not yet sent: the worker dies.
    with faults.armed("child_batch_started"), pytest.raises(faults.SimulatedCrash):
        run_task(message)
    assert [k.payload for k in kids(parent)] == [{"n": 0}, {"n": 1}, {"n": 2}]
    expire_lease(parent.pk)
    drain(lambda: Task.objects.get(pk=parent.pk).is_finished, resend_ok=True)
    parent.refresh_from_db()
    assert parent.state == S.SUCCEEDED, parent.error
    assert [k.payload for k in kids(parent)] == [{"n": i} for i in range(6)]
    assert [k.parent_index for k in kids(parent)] == list(range(6))
    assert parent.children_count == 6
    assert parent.result == [{"echo": {"n": i}} for i in range(6)]


def test_a_child_ending_while_its_parent_parks_waits_for_the_park_and_wakes_it(owner):
    parent = trigger(owner, "demo.fanout", {"children": 1})
    [message] = pop_queued()
    child_run = {}

    def child_ends_now():
        [child] = kids(parent)
        # The look saw the child open. The child now runs to its end in another
        # connection; its settle waits for the parent's row, which the park's
        # transaction holds.
        child_run["bg"] = background(lambda: run_task(str(child.pk)))
        wait_for(lambda: row_lock_waiters() >= 1,
                 what="the ended child's settle to wait for the parent's row")
        assert Task.objects.get(pk=child.pk).state == S.SUCCEEDED

    with faults.on("before_park", child_ends_now) as hits:
        run_task(message)
    assert hits.fired == 1
    child_run["bg"].result()
    parent.refresh_from_db()
    assert parent.state == S.PENDING  # parked, then woken by the settle that waited
    assert transitions(parent) == ["claim", "park", "wake"]
    drain(lambda: Task.objects.get(pk=parent.pk).is_finished)
    assert Task.objects.get(pk=parent.pk).state == S.SUCCEEDED


def test_the_last_two_children_ending_at_once_wake_their_parent_once(owner, temp_workflow):
    parent = trigger(owner, "demo.fanout", {"children": 2})
    run_task(pop_queued()[0])
    parent.refresh_from_db()
    assert parent.state == S.WAITING
    children = kids(parent)
    pop_queued()  # the children's messages: each is run by its own thread below
    results = run_at_once(2, lambda i: run_task(str(children[i].pk)))
    assert all(not isinstance(r, BaseException) for r in results), results
    parent.refresh_from_db()
    assert parent.state == S.PENDING
    assert transitions(parent).count("wake") == 1
    drain(lambda: Task.objects.get(pk=parent.pk).is_finished)
    assert Task.objects.get(pk=parent.pk).state == S.SUCCEEDED


def test_three_settles_of_a_parent_whose_children_ended_at_once_wake_it_once(
        owner, monkeypatch):
    from workflows.engine import announce

    parent = trigger(owner, "demo.fanout", {"children": 2})
    run_task(pop_queued()[0])
    monkeypatch.setattr(announce, "settle_on_commit", lambda parent_id, actor, step=None: None)
    for child in kids(parent):
        run_task(str(child.pk))
    pop_queued()
    assert Task.objects.get(pk=parent.pk).state == S.WAITING  # no settle ran
    results = run_at_once(3, lambda i: parent_settle(parent.pk, actor=f"test:{i}"))
    assert sorted(results) == [False, False, True], results
    assert transitions(parent).count("wake") == 1


def test_a_child_ending_while_its_parent_is_cancelled_leaves_the_parent_cancelled(owner):
    parent = trigger(owner, "demo.fanout", {"children": 1})
    run_task(pop_queued()[0])
    [child] = kids(parent)
    pop_queued()
    cancelled = threading.Event()

    def race(i):
        if i == 0:
            return run_task(str(child.pk))
        task_cancel(task_id=parent.pk, user=owner, reason="racing")
        cancelled.set()
        return "cancelled"

    results = run_at_once(2, race)
    assert all(not isinstance(r, BaseException) for r in results), results
    assert cancelled.is_set()
    parent.refresh_from_db()
    child.refresh_from_db()
    # The cancel came first (parent cancelled, child cancelled or ended) or
    # the settle did (parent woken, then cancelled from pending): cancelled
    # either way, never run on.
    assert parent.state == S.CANCELLED
    assert child.is_finished
    drain(dispatch=True)
    assert Task.objects.get(pk=parent.pk).state == S.CANCELLED
    assert "succeed" not in transitions(parent)


def test_the_parents_compensation_runs_while_its_children_still_run(owner, temp_workflow):
    undone = []
    wf = temp_workflow("t.spawn_then_fail", max_attempts=1)

    def unspawn(ctx):
        undone.append(ctx.output)

    @wf.step(compensation=unspawn)
    def spawn(ctx):
        return ctx.start_children("demo.slow", [{"steps": 1, "seconds": 0}] * 2)

    @wf.step
    def boom(ctx):
        raise ValueError("broken after spawning")

    parent = trigger(owner, "t.spawn_then_fail", {})
    [message] = pop_queued()
    run_task(message)  # spawn, boom fails, compensation runs — children untouched
    parent.refresh_from_db()
    assert parent.state == S.FAILED
    assert undone == [[str(k.pk) for k in kids(parent)]]
    assert {k.state for k in kids(parent)} == {S.PENDING}
    drain(lambda: all(Task.objects.get(pk=k.pk).is_finished for k in kids(parent)))
    assert {Task.objects.get(pk=k.pk).state for k in kids(parent)} == {S.SUCCEEDED}
    assert Task.objects.get(pk=parent.pk).state == S.FAILED  # a child's ending never wakes it
    assert "wake" not in transitions(parent)


def test_a_stale_worker_cannot_start_children_after_its_lease_was_lost(owner, temp_workflow):
    wf = temp_workflow("t.stale_spawn")
    seen = {}

    @wf.step
    def spawn(ctx):
        # The lease is lost (recovered by the dispatcher) before the children go.
        expire_lease(ctx.task_id)
        dispatch_once()
        seen["state"] = Task.objects.get(pk=ctx.task_id).state
        return ctx.start_children("demo.echo", [{}])

    parent = trigger(owner, "t.stale_spawn", {})
    [message] = pop_queued()
    run_task(message)
    assert seen["state"] == S.RETRYING
    assert kids(parent) == []  # refused by the fence: nothing started
    assert Task.objects.get(pk=parent.pk).children_count == 0


def test_more_parents_than_workers_all_finish_for_waiting_parents_hold_no_worker(
        owner, settings):
    """Two workers, one client capped at two running tasks, four parents of
    two children each: a waiting parent holds neither a worker nor a slot, so
    its children run and every task ends."""
    from django.db import connections

    settings.PILOT_MAX_RUNNING_PER_CLIENT = 2
    parents = [trigger(owner, "demo.fanout", {"children": 2, "child_seconds": 0.05})
               for _ in range(4)]
    inbox, lock, stop = [], threading.Lock(), threading.Event()
    ran = [0, 0]

    def worker(i):
        try:
            while not stop.is_set():
                with lock:
                    if not inbox:
                        inbox.extend(pop_queued())
                    message = inbox.pop(0) if inbox else None
                if message is None:
                    stop.wait(0.01)
                    continue
                run_task(message)
                ran[i] += 1
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: (dispatch_once(), all(
            Task.objects.get(pk=p.pk).is_finished for p in parents))[1], timeout=60,
            interval=0.05, what="every parent to finish")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert {Task.objects.get(pk=p.pk).state for p in parents} == {S.SUCCEEDED}
    children = Task.objects.filter(parent_id__in=[p.pk for p in parents])
    assert children.filter(state=S.SUCCEEDED).count() == 8
    assert all(ran)  # both workers ran tasks


def test_a_thousand_children_start_in_a_few_statements_and_wake_their_parent_once(
        owner, temp_workflow):
    """One batch of 1 000 children is the batch trigger's path — a handful of
    statements, not one per child — and their endings wake the parent once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    wf = temp_workflow("t.thousand")
    counted = {}

    @wf.step
    def spawn(ctx):
        with CaptureQueriesContext(connection) as queries:
            ids = ctx.start_children("demo.echo", [{"i": i} for i in range(1000)])
        counted["statements"] = len(queries.captured_queries)
        return len(ids)

    wf.wait_for_children("gather", output=len)
    parent = trigger(owner, "t.thousand", {})
    run_task(pop_queued()[0])
    assert counted["statements"] <= 16, counted  # 14 today: constant, whatever the count
    assert Task.objects.filter(parent_id=parent.pk).count() == 1000
    assert Task.objects.get(pk=parent.pk).state == S.WAITING
    drain(lambda: Task.objects.get(pk=parent.pk).is_finished, timeout=300)
    parent.refresh_from_db()
    assert (parent.state, parent.result, parent.children_count) == (S.SUCCEEDED, 1000, 1000)
    assert transitions(parent) == ["claim", "park", "wake", "claim", "succeed"]
