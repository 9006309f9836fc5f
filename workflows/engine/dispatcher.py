"""The dispatcher: the loop that keeps every task moving (SPEC §7).

One pass (`dispatch_once`) does four things, each as short transactions that
scan with SELECT … FOR UPDATE SKIP LOCKED, so any number of dispatchers on any
number of machines can run at once without doing anything twice:

1. recover expired leases: a `running` task whose worker stopped heartbeating
   goes `retrying` through `recover` (the lost attempt counts), or `failed`
   when it has no attempts left — so a task that kills its worker every time
   ends failed instead of looping;
2. enqueue due retries (`retrying` with next_attempt_at passed and no message
   sent since the retry was scheduled);
3. finish `cancelling` tasks nobody holds: enqueue them for a worker to run
   their compensations, or, with nothing to compensate, finish the cancel here;
4. re-enqueue `pending` tasks left unclaimed for PILOT_REENQUEUE_SECONDS (their
   message may be lost; if it was only slow, the duplicate is a no-op).

Its messages go to the front of a Redis queue: work already under way should
not wait behind a backlog of new triggers.

`enqueued_at` is when the task's outstanding message was sent, NULL when none
is outstanding (a claim consumes it; schedule_retry and recover clear it), so
"needs a message" is `enqueued_at IS NULL OR enqueued_at < now - 10 s` for
every scan, whatever the clocks of the machines that wrote it.

It never runs workflow code. Each scan uses a partial index over unfinished
tasks only, so an idle pass costs five index probes however many finished
tasks the table holds.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Min, Q
from django.utils import timezone

from workflows.backoff import backoff_delay
from workflows.engine.audit import transition_apply
from workflows.engine.compensation import needs_compensation
from workflows.engine.enqueue import enqueue_on_commit
from workflows.engine.leases import worker_id
from workflows.models import Task
from workflows.observability.events import emit, emit_on_commit
from workflows.registry import DEFAULT_IDEMPOTENCY_TTL, registry
from workflows.states import TaskState

BATCH = 200


@dataclasses.dataclass
class DispatchReport:
    recovered: int = 0
    failed: int = 0
    retries_enqueued: int = 0
    cancels_enqueued: int = 0
    cancels_finished: int = 0
    reenqueued: int = 0
    next_due: datetime | None = None
    full: bool = False  # some scan hit its batch limit: run again at once

    @property
    def actions(self) -> int:
        return (self.recovered + self.failed + self.retries_enqueued + self.cancels_enqueued
                + self.cancels_finished + self.reenqueued)

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("next_due", "full")}


def dispatch_once(*, now: datetime | None = None, batch: int = BATCH,
                  actor: str | None = None) -> DispatchReport:
    """One pass of the four scans above; returns what it did."""
    now = now or timezone.now()
    actor = actor or f"dispatcher:{worker_id()}"
    report = DispatchReport()
    _recover_expired_leases(now, batch, actor, report)
    _enqueue_due_retries(now, batch, report)
    _settle_orphaned_cancels(now, batch, actor, report)
    _reenqueue_lost(now, batch, report)
    report.next_due = (Task.objects.filter(state=TaskState.RETRYING, next_attempt_at__gt=now)
                       .aggregate(m=Min("next_attempt_at"))["m"])
    for action, count in report.as_dict().items():
        if count:
            emit("dispatcher_action", action=action, count=count)
    return report


def _locked(qs, batch: int, report: DispatchReport) -> list[Task]:
    rows = list(qs.select_for_update(skip_locked=True).order_by()[:batch])
    report.full = report.full or len(rows) == batch
    return rows


def _recover_expired_leases(now, batch, actor, report) -> None:
    with transaction.atomic():
        for task in _locked(Task.objects.filter(state=TaskState.RUNNING,
                                                lease_expires_at__lt=now), batch, report):
            workflow = registry.find(task.workflow)
            reason = f"lease held by {task.lease_owner or '?'} expired at " \
                     f"{task.lease_expires_at.isoformat()}"
            if task.attempts < task.max_attempts and workflow is not None:
                delay = backoff_delay(workflow.policy, task.attempts)
                transition_apply(task, "recover", actor=actor, reason=reason,
                                 next_attempt_at=now + timedelta(seconds=delay))
                emit_on_commit("task_recovered", task_id=str(task.pk), workflow=task.workflow,
                               attempt=task.attempts, to_state=task.state,
                               trace_id=task.trace_id or None)
                report.recovered += 1
                continue
            plan = workflow.steps_for(task.payload) if workflow else []
            unfinished = (" Compensations were not run (the worker died on every attempt): "
                          "undo the succeeded steps by hand or retry the task."
                          if needs_compensation(task, plan) else "")
            transition_apply(
                task, "fail", actor=actor, reason=reason,
                error=f"worker lost on attempt {task.attempts} of {task.max_attempts}: lease "
                      f"expired with no attempts left.{unfinished}",
                error_type="LeaseExpired", now=now,
                ttl=workflow.idempotency_ttl if workflow else DEFAULT_IDEMPOTENCY_TTL)
            emit_on_commit("task_recovered", task_id=str(task.pk), workflow=task.workflow,
                           attempt=task.attempts, to_state=task.state,
                           trace_id=task.trace_id or None)
            report.failed += 1


def _stale(now) -> datetime:
    return now - timedelta(seconds=settings.PILOT_REENQUEUE_SECONDS)


def _enqueue_due_retries(now, batch, report) -> None:
    with transaction.atomic():
        due = Task.objects.due_retries(now).filter(
            Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=_stale(now)))
        ids = [t.pk for t in _locked(due.only("pk"), batch, report)]
        if ids:
            Task.objects.filter(pk__in=ids).update(enqueued_at=now)
            enqueue_on_commit(ids, front=True)
    report.retries_enqueued += len(ids)


def _settle_orphaned_cancels(now, batch, actor, report) -> None:
    with transaction.atomic():
        orphaned = Task.objects.filter(
            Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now),
            state=TaskState.CANCELLING,
        ).filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=_stale(now)))
        to_enqueue = []
        for task in _locked(orphaned, batch, report):
            workflow = registry.find(task.workflow)
            plan = workflow.steps_for(task.payload) if workflow else []
            if needs_compensation(task, plan):
                to_enqueue.append(task.pk)
                continue
            transition_apply(task, "finish_cancel", actor=actor,
                             reason="its worker is gone and nothing needs compensating",
                             now=now, ttl=workflow.idempotency_ttl if workflow
                             else DEFAULT_IDEMPOTENCY_TTL)
            report.cancels_finished += 1
        if to_enqueue:
            Task.objects.filter(pk__in=to_enqueue).update(enqueued_at=now)
            enqueue_on_commit(to_enqueue, front=True)
    report.cancels_enqueued += len(to_enqueue)


def _reenqueue_lost(now, batch, report) -> None:
    with transaction.atomic():
        ids = [t.pk for t in _locked(Task.objects.unclaimed_since(_stale(now)).only("pk"),
                                     batch, report)]
        if ids:
            Task.objects.filter(pk__in=ids).update(enqueued_at=now)
            enqueue_on_commit(ids, front=True)
    report.reenqueued += len(ids)
