"""The dispatcher: the loop that keeps every task moving (docs/design.md, "Dispatcher").

One pass (`dispatch_once`) reads the database's clock once and then:

0. with a `DatabaseWatch` (the dispatcher's loop has one), notices a database
   switch — the server's (system identifier, timeline) changed: a failover or
   a switchover to a promoted standby — and, a heartbeat's grace later,
   recovers the leases nobody renewed on the new primary (DatabaseWatch);
1. recovers expired leases of `running` tasks — the step that was running is
   recorded failed ("interrupted") — then `recover` (→ retrying, the lost
   attempt counts) while attempts remain; with none left — a poison task that
   kills its worker every time — `compensate` (→ compensating, for a worker to
   undo its succeeded steps) when something is owed, else `fail`;
   then wakes waiting tasks whose durable timer or signal timeout is due
   (→ pending, enqueued; docs/waiting.md), and parents whose children have
   all ended when the ending's own settle was lost (engine/children.py);
2. enqueues work that is due: retries whose backoff elapsed, and compensation
   phases (compensating / cancelling) nobody holds — orphaned by a dead
   worker, deferred by a compensation's backoff, or cancelled while waiting;
   a `cancelling` task with nothing to compensate is finished here;
3. sends the messages a cap held back: a pending task whose claim a cap refused
   gets one when its client (or workflow) has a free slot again (caps.py) —
   every client in turn, oldest owed task first, never the same first batch;
4. re-sends lost messages, task by task: the oldest due `pending` tasks whose
   message is older than PILOT_REENQUEUE_SECONDS (lost with a dead cluster's
   prefetch, a failed push, a Redis restart — or only slow) get one more, at
   most RESENDS_PER_PASS a pass (each client's oldest first, so no client
   waits behind another's pile) and one per task per PILOT_REENQUEUE_SECONDS.
   Whether other tasks are being claimed says nothing about this one (review
   turn 3, F1: a fleet busy with runs longer than PILOT_DRAIN_SECONDS never
   drained the table, and a lost task waited for the whole fleet's first lull);
5. enqueues the completion webhooks that are due: retries whose backoff
   elapsed, lost messages, attempts whose sender died (deliveries.py).

Each scan is one short transaction over SELECT … FOR UPDATE SKIP LOCKED, so
any number of dispatchers on any number of machines can run at once without
doing anything twice. Each row is handled in its own savepoint: a failure on
one task is logged, counted (`pilot_dispatcher_errors_total`) and skipped —
never a reason to stop scanning the others. It never runs workflow code: what
is owed is read from the checkpoints (`compensable`).

`enqueued_at` is when the task's outstanding message was sent (database
time), NULL when none is outstanding (a claim consumes it), so "needs a
message" is `enqueued_at IS NULL OR enqueued_at < now - 10 s`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, Min, Q, QuerySet

from workflows import database
from workflows.conf import pilot_settings
from workflows.engine.announce import move
from workflows.engine.caps import Slots, blocked_q, caps
from workflows.engine.children import parents_settle_due
from workflows.engine.deliveries import deliveries_enqueue_due
from workflows.engine.enqueue import enqueue_on_commit
from workflows.engine.leases import worker_id
from workflows.engine.plans import owed_compensations
from workflows.engine.signals import tasks_wake_due
from workflows.engine.store import store
from workflows.models import Task
from workflows.observability.events import Event, emit, emit_on_commit
from workflows.registry import registry
from workflows.rules.backoff import RetryPolicy, backoff_delay
from workflows.rules.durations import iso_z
from workflows.rules.states import COMPENSATION_STATES, TaskState

BATCH = 200
# Lost messages re-sent per pass, oldest due first. A re-sent task also wakes a
# worker that then drains the queue, so a few a pass make a fleet whose messages
# were all lost busy again; and while messages are merely slow (a backlog older
# than PILOT_REENQUEUE_SECONDS), the duplicates stay a handful a second — for the
# tasks at the head of the queue, which they only take a moment earlier.
RESENDS_PER_PASS = 4
_DEFAULT_POLICY = RetryPolicy(max_attempts=1, initial=1.0, factor=2.0, max_delay=300.0)


@dataclasses.dataclass
class DatabaseWatch:
    """What one dispatcher knows of the server it writes to, pass to pass.

    A lease is renewed by its owner's heartbeat (every PILOT_HEARTBEAT_SECONDS).
    When the server's identity changes between two passes, a standby was
    promoted: the pass that notices it reads, on the new primary, the lease of
    every running task (`suspects`: id → lease end). A live owner renews on the
    new primary within a heartbeat of reaching it; one whose writes ran out of
    patience during the outage (leases.Interrupted) has stopped for good, and
    its lease would block the task (and its client's slot) until it expired, up
    to PILOT_LEASE_SECONDS. So `grace_seconds` (a heartbeat and a second, by
    default) later, the pass recovers, as if expired, every suspect whose lease
    end is still the one read on the new primary: nobody renewed it there.
    Safe by the fence: the recovery is a transition, which moves the task's
    token on, so a late write from the old owner — alive after all, or
    slower than its heartbeat — is refused (LeaseLost) and it stops.

    Why not "renewed before the last pass on the old primary": writes committed
    on the old primary between that pass and its death reach the new one too
    (synchronous replication), and look like renewals — `make bench-failover`
    found most interrupted leases that way. A lease end unchanged across the
    grace, read twice on the new primary, is what no owner wrote there."""

    grace_seconds: float | None = None
    read_identity: Callable[[], tuple[str, int] | None] = database.server_identity
    identity: tuple[str, int] | None = None
    # A switch noticed: the running tasks' lease ends as the new primary had them,
    # to recover once the database's clock reaches `recover_at` if unchanged.
    suspects: dict[Any, datetime | None] = dataclasses.field(default_factory=dict)
    recover_at: datetime | None = None

    def observe(self, now: datetime) -> bool:
        """Read the server's identity (at `now`, the pass's database time): True
        when it changed since the last pass (a switch; then `suspect` the leases)."""
        identity = self.read_identity()
        if identity is None:
            return False
        previous, self.identity = self.identity, identity
        if previous is None or identity == previous:
            return False
        grace = (pilot_settings.PILOT_HEARTBEAT_SECONDS + 1.0 if self.grace_seconds is None
                 else self.grace_seconds)
        self.recover_at = now + timedelta(seconds=grace)
        emit(Event.DATABASE_SWITCHED, level=logging.WARNING,
             previous=f"{previous[0]}/timeline {previous[1]}",
             current=f"{identity[0]}/timeline {identity[1]}",
             recover_at=self.recover_at.isoformat())
        return True

    def suspect(self, leases: dict[Any, datetime | None]) -> None:
        self.suspects = leases

    def due(self, now: datetime) -> dict[Any, datetime | None]:
        """The suspects to recover in this pass (once), if their grace is over."""
        if self.recover_at is None or now < self.recover_at:
            return {}
        due, self.suspects, self.recover_at = self.suspects, {}, None
        return due


@dataclasses.dataclass
class DispatchReport:
    recovered: int = 0
    failed: int = 0
    compensations_started: int = 0
    woken: int = 0
    retries_enqueued: int = 0
    compensations_enqueued: int = 0
    cancels_finished: int = 0
    reenqueued: int = 0
    owed_enqueued: int = 0
    deliveries_enqueued: int = 0
    # Of `recovered` and `failed`: leases taken after a database switch (DatabaseWatch).
    after_switch: int = 0
    errors: int = 0
    db_now: datetime | None = None
    next_due: datetime | None = None
    full: bool = False  # some scan hit its batch limit: run again at once

    @property
    def actions(self) -> int:
        return (self.recovered + self.failed + self.compensations_started + self.woken
                + self.retries_enqueued + self.compensations_enqueued + self.cancels_finished
                + self.reenqueued + self.owed_enqueued + self.deliveries_enqueued)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("db_now", "next_due", "full")}


def dispatch_once(*, batch: int = BATCH, actor: str | None = None,
                  watch: DatabaseWatch | None = None) -> DispatchReport:
    """One pass of the scans above; returns what it did."""
    actor = actor or f"dispatcher:{worker_id()}"
    now = store().db_now()
    report = DispatchReport(db_now=now)
    if watch is not None:
        if watch.observe(now):
            watch.suspect(dict(Task.objects.filter(state=TaskState.RUNNING)
                               .values_list("pk", "lease_expires_at")))
        unrenewed = watch.due(now)
        if unrenewed:
            _recover_expired_leases(now, batch, actor, report, unrenewed=unrenewed)
    _recover_expired_leases(now, batch, actor, report)
    _wake_due(now, batch, actor, report)
    _settle_parents(batch, actor, report)
    _enqueue_due(now, batch, actor, report)
    _enqueue_owed(now, batch, report)
    _reenqueue_lost(now, report)
    report.deliveries_enqueued, full = deliveries_enqueue_due(now, batch=batch)
    report.full = report.full or full
    # (pending: a delayed start; waiting: a timer or a timeout)
    report.next_due = (Task.objects.filter(state__in=[TaskState.PENDING, TaskState.RETRYING,
                                                     TaskState.WAITING, *COMPENSATION_STATES],
                                           next_attempt_at__gt=now)
                       .aggregate(m=Min("next_attempt_at"))["m"])
    for action, count in report.as_dict().items():
        if count and action != "errors":
            emit(Event.DISPATCHER_ACTION, action=action, count=count)
    return report


def _locked(qs: QuerySet[Task], batch: int, report: DispatchReport | None) -> list[Task]:
    """Up to `batch` rows of `qs`, locked, skipping rows others hold; a full batch
    says (on `report`) that the loop should run again at once."""
    rows = store().lock_free_in_tx(qs, batch)
    if report is not None:
        report.full = report.full or len(rows) == batch
    return rows


def _each(tasks: list[Task], report: DispatchReport, handle: Callable[[Task], None]) -> None:
    """`handle(task)` per row, each in its own savepoint: one row's failure is
    logged, counted and rolled back alone."""
    for task in tasks:
        try:
            with transaction.atomic():
                handle(task)
        except Exception as exc:  # noqa: BLE001 - isolation: the next row still gets its turn
            report.errors += 1
            emit(Event.DISPATCHER_ERROR, level=logging.ERROR, task_id=str(task.pk),
                 workflow=task.workflow, error=f"{type(exc).__name__}: {exc}"[:300])


def _policy(task: Task) -> RetryPolicy:
    workflow = registry.for_task(task)
    return workflow.policy if workflow is not None else _DEFAULT_POLICY


def _recover_expired_leases(now: datetime, batch: int, actor: str, report: DispatchReport, *,
                            unrenewed: dict[Any, datetime | None] | None = None) -> None:
    """Running tasks whose lease expired — or, with `unrenewed` (after a
    database switch, DatabaseWatch: id → the lease end read then), those whose
    lease end is still that one — are recovered."""
    lost = Q(lease_expires_at__lt=now) if unrenewed is None else Q(pk__in=list(unrenewed))
    with transaction.atomic():
        tasks = _locked(Task.objects.filter(lost, state=TaskState.RUNNING), batch, report)
        if unrenewed is not None:
            tasks = [t for t in tasks if t.lease_expires_at == unrenewed[t.pk]]
        owed = owed_compensations([t.pk for t in tasks]) if tasks else {}

        def recover(task: Task) -> None:
            policy = _policy(task)
            expiry = iso_z(task.lease_expires_at)  # type: ignore[arg-type]  # held
            reason = (f"lease held by {task.lease_owner or '?'} expired at {expiry}"
                      if unrenewed is None else
                      f"lease held by {task.lease_owner or '?'} (until {expiry}) not renewed "
                      "since the database switched")
            if unrenewed is not None:
                report.after_switch += 1
            # No worker runs its step any more: say so (the next attempt rewrites it).
            store().interrupt_steps(task.pk, error=f"interrupted: its worker was lost ({reason})",
                                    at=now)
            if task.attempts < task.max_attempts:
                delay = backoff_delay(policy, task.attempts)
                move(task, "recover", at=now, actor=actor,
                     reason=f"{reason}; retry in {delay:.3f}s",
                     next_attempt_at=now + timedelta(seconds=delay))
                report.recovered += 1
            elif owed.get(task.pk):
                error = (f"worker lost on attempt {task.attempts} of {task.max_attempts}: lease "
                         "expired with no attempts left; compensating "
                         + ", ".join(owed[task.pk]))
                move(task, "compensate", at=now, actor=actor, reason=reason,
                     error=error, error_type="LeaseExpired",
                     set_fields={"enqueued_at": now})
                enqueue_on_commit([task.pk], front=True)
                report.compensations_started += 1
            else:
                move(
                    task, "fail", at=now, actor=actor, reason=reason,
                    error=f"worker lost on attempt {task.attempts} of {task.max_attempts}: "
                          "lease expired with no attempts left",
                    error_type="LeaseExpired", now=now)
                report.failed += 1
            emit_on_commit(Event.TASK_RECOVERED, task_id=str(task.pk), workflow=task.workflow,
                           attempt=task.attempts, to_state=task.state,
                           trace_id=task.trace_id or None)

        _each(tasks, report, recover)


def _wake_due(now: datetime, batch: int, actor: str, report: DispatchReport) -> None:
    """Waiting tasks whose timer or timeout is due by the database's clock →
    pending, enqueued (their due time keeps its place in the claim order): a
    batch in one write; should it fail, row by row, so one bad row costs only itself."""
    with transaction.atomic():
        tasks = _locked(Task.objects.filter(state=TaskState.WAITING, next_attempt_at__lte=now)
                        .order_by("next_attempt_at"), batch, report)
        if not tasks:
            return
        try:
            with transaction.atomic():
                tasks_wake_due(tasks, now=now, actor=actor)
            report.woken += len(tasks)
            return
        except Exception as exc:  # noqa: BLE001 - isolation: retried row by row below
            emit(Event.DISPATCHER_ERROR, level=logging.WARNING,
                 error=f"batch wake: {type(exc).__name__}: {exc}"[:300])
        # (read again: the rows are still ours, the savepoint undid their change)
        tasks = list(Task.objects.filter(pk__in=[t.pk for t in tasks], state=TaskState.WAITING)
                     .order_by("next_attempt_at"))

        def wake(task: Task) -> None:
            tasks_wake_due([task], now=now, actor=actor)
            report.woken += 1

        _each(tasks, report, wake)


def _settle_parents(batch: int, actor: str, report: DispatchReport) -> None:
    """Parents waiting for children that have all ended — their last child's
    settle was lost with its process (engine/children.py) — woken."""
    woken, full = parents_settle_due(batch=batch, actor=actor)
    report.woken += woken
    report.full = report.full or full


def _stale(now: datetime) -> datetime:
    return now - timedelta(seconds=pilot_settings.PILOT_REENQUEUE_SECONDS)


def _needs_message(now: datetime) -> Q:
    return Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=_stale(now))


def _enqueue_due(now: datetime, batch: int, actor: str, report: DispatchReport) -> None:
    # A retry whose client or workflow is at its cap waits for a free slot
    # (_enqueue_owed's rule), and so does undo work (caps.py: a take-over needs
    # a slot too): a message now would only be refused.
    slots = Slots.now(caps())
    due_retry = (Q(state=TaskState.RETRYING, next_attempt_at__lte=now) & ~blocked_q(slots))
    orphaned_phase = (Q(state__in=COMPENSATION_STATES)
                      & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
                      & (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
                      & ~blocked_q(slots, undo=True))
    with transaction.atomic():
        tasks = _locked(Task.objects.filter(due_retry | orphaned_phase)
                        .filter(_needs_message(now)), batch, report)
        cancelling = [t.pk for t in tasks if t.state == TaskState.CANCELLING]
        owed = owed_compensations(cancelling) if cancelling else {}
        to_enqueue: list[Any] = []

        def settle(task: Task) -> None:
            if task.state == TaskState.CANCELLING and not owed.get(task.pk):
                store().interrupt_steps(task.pk, at=now, error="interrupted: its worker was "
                                                               "lost during the cancel")
                move(task, "finish_cancel", at=now, actor=actor,
                     reason="its worker is gone and nothing needs compensating",
                     now=now)
                report.cancels_finished += 1
                return
            if task.state == TaskState.RETRYING:
                report.retries_enqueued += 1
            elif slots.take(task.owner_id, task.workflow, undo=True):
                report.compensations_enqueued += 1
            else:
                return  # its client's slots went to undo work earlier in this batch
            to_enqueue.append(task.pk)

        _each(tasks, report, settle)
        if to_enqueue:
            store().mark_sent(to_enqueue, now)
            enqueue_on_commit(to_enqueue, front=True)


def _enqueue_owed(now: datetime, batch: int, report: DispatchReport) -> None:
    """Send the messages a cap held back (docs/design.md, "Fairness").

    A claim refused by a cap consumed its message and left the pending task
    owed one (`enqueued_at` NULL). When its client has a free slot again, the
    oldest owed tasks get one message per free slot — never more, so a flood of
    one client does not turn into a loop of refused claims. The clients are
    chosen in SQL among those with a free slot, the one whose owed task waited
    longest first, `batch` of them a pass (a cut list makes the loop run again
    at once): clients at their cap never fill the list (review turn 3, F7).
    (Workers finishing a run usually claim the next one straight from the table
    first; a message that arrives after that finds it running and is skipped.)"""
    owed = Task.objects.filter(state=TaskState.PENDING, enqueued_at__isnull=True,
                               next_attempt_at__lte=now)
    if not owed.exists():
        return
    slots = Slots.now(caps())
    # A message already on its way (the trigger's, or one sent here) will try for
    # the slot first: count it as taken until it is REENQUEUE_SECONDS old.
    on_the_way = (Task.objects.filter(state=TaskState.PENDING, enqueued_at__gte=_stale(now))
                  .values_list("owner_id", "workflow").annotate(n=Count("pk")).order_by())
    for owner_id, workflow, n in on_the_way:
        slots.reserve(owner_id, workflow, n)
    free = owed.exclude(blocked_q(slots))
    owners = list(free.values("owner_id").annotate(first=Min("next_attempt_at"))
                  .order_by("first", "owner_id").values_list("owner_id", flat=True)[:batch])
    report.full = report.full or len(owners) == batch
    chosen = []
    for owner_id in owners:
        for pk, workflow in (free.filter(owner_id=owner_id).order_by("next_attempt_at")
                             .values_list("pk", "workflow")[:batch]):
            if slots.take(owner_id, workflow):
                chosen.append(pk)
    if not chosen:
        return
    with transaction.atomic():
        ids = [t.pk for t in _locked(owed.filter(pk__in=chosen).only("pk"), len(chosen), None)]
        if ids:
            store().mark_sent(ids, now)
            enqueue_on_commit(ids, front=True)
    report.owed_enqueued += len(ids)


def _reenqueue_lost(now: datetime, report: DispatchReport) -> None:
    """Re-send the messages that may be lost, task by task (module docstring, 4).

    A due pending task whose message is older than PILOT_REENQUEUE_SECONDS gets
    another, RESENDS_PER_PASS a pass: the oldest of each client first, the
    client whose task waited longest first, so that one client's pile of lost
    messages never keeps another client's waiting; then, with the rest of the
    pass's share, the oldest overall. A task whose client or workflow is at its
    cap gets none (it waits for a slot, not a worker: _enqueue_owed). Sending
    one stamps `enqueued_at`, so a task gets at most one message per
    PILOT_REENQUEUE_SECONDS however long it waits. A duplicate is harmless: the
    first message to arrive claims the task, the other finds it taken."""
    waiting = (Task.objects.filter(_needs_message(now), state=TaskState.PENDING,
                                   next_attempt_at__lt=_stale(now))
               .exclude(blocked_q(Slots.now(caps()))))
    owners = list(waiting.values("owner_id").annotate(first=Min("next_attempt_at"))
                  .order_by("first", "owner_id").values_list("owner_id", flat=True)
                  [:RESENDS_PER_PASS])
    if not owners:
        return
    chosen = [pk for owner_id in owners
              for pk in waiting.filter(owner_id=owner_id).order_by("next_attempt_at")
              .values_list("pk", flat=True)[:1]]
    if len(chosen) < RESENDS_PER_PASS:
        chosen += list(waiting.exclude(pk__in=chosen).order_by("next_attempt_at")
                       .values_list("pk", flat=True)[:RESENDS_PER_PASS - len(chosen)])
    with transaction.atomic():
        ids = [t.pk for t in _locked(waiting.filter(pk__in=chosen).order_by("next_attempt_at")
                                     .only("pk"), RESENDS_PER_PASS, None)]
        if ids:
            store().mark_sent(ids, now)
            enqueue_on_commit(ids, front=True)
    report.reenqueued += len(ids)
