"""Test helpers that read the real broker and database (no mocks)."""

from __future__ import annotations

from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from workflows.engine.enqueue import broker, uses_orm_broker


def _raw_packages() -> list:
    if uses_orm_broker():
        return list(OrmQ.objects.using(Conf.ORM).filter(key=broker().list_key)
                    .order_by("id").values_list("payload", flat=True))
    return broker().connection.lrange(broker().list_key, 0, -1)


def queued_task_ids() -> list[str]:
    """The PILOT task id of every message waiting in the broker, in queue order."""
    return [SignedPackage.loads(p)["args"][0] for p in _raw_packages()]


def queued_messages() -> list[tuple[str, str]]:
    """(function, argument) of every message waiting in the broker, in queue
    order: ("workflows.worker.run_task", task id) or
    ("workflows.worker.deliver_webhook", webhook id)."""
    return [(m["func"], m["args"][0]) for m in map(SignedPackage.loads, _raw_packages())]


def queued_webhooks() -> list[str]:
    """The webhook ids of the delivery messages waiting in the broker."""
    return [arg for func, arg in queued_messages() if func.endswith("deliver_webhook")]


def purge_queue() -> None:
    if uses_orm_broker():
        OrmQ.objects.using(Conf.ORM).filter(key=broker().list_key).delete()
    else:
        broker().connection.delete(broker().list_key)


def run_at_once(n: int, fn, *, timeout: float = 120.0) -> list:
    """Run `fn(i)` in `n` threads released together by a barrier, each on its own
    database connection. Returns, per thread, its return value or the exception
    it raised."""
    import threading

    from django.db import connections

    barrier = threading.Barrier(n)
    results: list = [None] * n

    def body(i):
        try:
            # Connect before the barrier so the race is between statements, not
            # between connection handshakes.
            connections["default"].ensure_connection()
            barrier.wait(timeout=timeout)
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return results


def pop_queued() -> list[str]:
    """Take every waiting message off the broker (as a worker would) and return
    the task ids, in order (webhook messages: their webhook ids)."""
    return [arg for _, arg in pop_queued_messages()]


def pop_queued_messages() -> list[tuple[str, str]]:
    """Take every waiting message off the broker; (function, argument) each."""
    if uses_orm_broker():
        rows = list(OrmQ.objects.using(Conf.ORM).filter(key=broker().list_key).order_by("id"))
        OrmQ.objects.using(Conf.ORM).filter(pk__in=[r.pk for r in rows]).delete()
        packages = [r.payload for r in rows]
    else:
        conn, key = broker().connection, broker().list_key
        packages = []
        while (item := conn.lpop(key)) is not None:
            packages.append(item)
    return [(m["func"], m["args"][0]) for m in map(SignedPackage.loads, packages)]


def drain(until=None, *, timeout: float = 15.0, dispatch: bool = True,
          resend_ok: bool = False) -> None:
    """Play worker and dispatcher in this process: run every queued message
    through the real worker entry point, run a dispatcher pass, repeat until
    `until()` holds (or, without `until`, until nothing is queued or due).

    A dispatcher pass that had to send a pending task's message again (its
    message was lost, PILOT_REENQUEUE_SECONDS) fails the drain unless the test
    lost it on purpose (`resend_ok`): otherwise the 10 s safety net would hide
    a broken enqueue behind a slower pass."""
    import time

    from workflows.engine.dispatcher import dispatch_once
    from workflows.models import Task
    from workflows.rules.states import TaskState
    from workflows.worker import deliver_webhook, run_task

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        messages = pop_queued_messages()
        ids = [arg for _, arg in messages]
        for func, arg in messages:
            (deliver_webhook if func.endswith("deliver_webhook") else run_task)(arg)
        report = dispatch_once() if dispatch else None
        if report is not None and report.reenqueued and not resend_ok:
            raise AssertionError(f"the dispatcher re-sent {report.reenqueued} lost task "
                                 "message(s) during drain(): an enqueue is broken")
        if until is not None:
            if until():
                return
        elif not ids and not (report and report.actions) and not Task.objects.filter(
                state__in=[TaskState.RETRYING, TaskState.PENDING]).exists():
            return
        time.sleep(0.01)
    raise AssertionError("drain() timed out")


def expire_lease(task_id) -> None:
    """Let a lease run out (as if its worker stopped heartbeating long ago)."""
    from datetime import timedelta

    from django.utils import timezone

    from workflows.models import Task

    Task.objects.filter(pk=task_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))


def wait_for(condition, *, timeout: float = 10.0, interval: float = 0.02, what: str = ""):
    """Poll `condition()` until it is truthy; fail after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(interval)


def in_thread(fn, *, timeout: float = 60.0):
    """Run `fn()` on another thread — so on another database connection — wait
    for it, and return its value (or raise its exception)."""
    import threading

    from django.db import connections

    box: dict = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the other connection's work hung"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def rewind(task_id, seconds: float) -> None:
    """Advance the clock by `seconds` for one task, the way the database sees it:
    every time on its row moves that far into the past (its lease, its backoff,
    its outstanding message)."""
    from datetime import timedelta

    from django.db.models import F

    from workflows.models import Task

    delta = timedelta(seconds=seconds)
    for field in ("lease_expires_at", "next_attempt_at", "enqueued_at"):
        Task.objects.filter(pk=task_id, **{f"{field}__isnull": False}).update(
            **{field: F(field) - delta})


def ledger(task_id) -> list[str]:
    """The DemoLedger actions of one task, in the order they were written."""
    from workflows.models import DemoLedger

    return list(DemoLedger.objects.filter(task=task_id).order_by("id")
                .values_list("action", flat=True))


def audit(task_id) -> list[tuple[str, str, str]]:
    """(transition, from, to) of one task's history, oldest first."""
    from workflows.models import TaskTransition

    return list(TaskTransition.objects.filter(task_id=task_id).order_by("id")
                .values_list("transition", "from_state", "to_state"))


class Background:
    """`fn()` running on another thread — so on its own database connection —
    started at once; `done` is set when it returned, `result()` waits for it
    and returns its value (or raises its exception)."""

    def __init__(self, fn):
        import threading

        from django.db import connections

        self.box: dict = {}
        self.done = threading.Event()

        def body():
            try:
                self.box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to result()
                self.box["error"] = exc
            finally:
                connections.close_all()
                self.done.set()

        threading.Thread(target=body, daemon=True).start()

    def result(self, timeout: float = 30.0):
        assert self.done.wait(timeout), "the other connection's work hung"
        if "error" in self.box:
            raise self.box["error"]
        return self.box.get("value")


def background(fn) -> Background:
    return Background(fn)


def lock_waiters(*kinds: str) -> int:
    """PostgreSQL: how many sessions of this test's database wait for a lock
    of one of these kinds (pg_locks.locktype) right now. A row lock is waited
    for as a 'transactionid' (or 'tuple') lock, an advisory one as 'advisory'."""
    from django.db import connection

    with connection.cursor() as cursor:
        # Inside a transaction (a hook run mid-write) pg_stat_activity is read
        # once and cached: without this, a session that began waiting after the
        # first look would never be seen.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(DISTINCT l.pid) FROM pg_locks AS l "
                       "JOIN pg_stat_activity AS a ON a.pid = l.pid "
                       "WHERE NOT l.granted AND a.datname = current_database() "
                       "AND l.locktype = ANY(%s)", [list(kinds)])
        return cursor.fetchone()[0]


def row_lock_waiters() -> int:
    return lock_waiters("transactionid", "tuple")


def task_claim(*, task_id, worker: str):
    """A worker's claim of `task_id` (the store's, with the configured lease),
    as a test plays a worker that claims and then does something else."""
    from workflows.engine.leases import lease_length
    from workflows.engine.store import store

    return store().claim(task_id, worker=worker, lease=lease_length())


def task_resume(*, task_id, worker: str):
    """A worker's take-over of a compensation phase, likewise."""
    from workflows.engine.leases import lease_length
    from workflows.engine.store import store

    return store().resume(task_id, worker=worker, lease=lease_length())


def versioned_v2():
    """Version 2 of demo.versioned as SPEC'd for the demo (a, gate, c, b), not
    registered: what a deployment adds (the caller registers and removes it)."""
    from workflows.demo.workflows import _ran
    from workflows.registry import Workflow

    wf = Workflow("demo.versioned", version=2)
    wf.add_step("a", _ran("a"))
    wf.wait_for_signal("gate", signal="go")
    wf.add_step("c", _ran("c"))
    wf.add_step("b", _ran("b", 2))
    return wf
