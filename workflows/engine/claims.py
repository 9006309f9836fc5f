"""Claiming a task for execution (SPEC §7, STYLE practice 3).

The claim is one short transaction that does nothing but claim: lock the task
row (a plain select_for_update on its id — not SKIP LOCKED, which on a single
id would silently drop a delivery whenever a trigger holds the row for a
moment), re-check that it is claimable, apply `claim` (attempts + 1, a new
lease token, lease owner and expiry) and audit it.

A duplicate delivery, a redelivery by django-q2, or a second worker finds the
task running (or finished) and gets None: no effect.

One more case is claimed here: a `cancelling` task that no live worker holds
(its worker died, or it was cancelled while waiting with steps to compensate).
The worker takes over its lease — no state change — to run compensations and
finish the cancel.
"""

from __future__ import annotations

import dataclasses

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from workflows.engine.audit import transition_apply
from workflows.engine.leases import Lease, lease_expiry
from workflows.models import StepCheckpoint, Task
from workflows.observability.events import emit_on_commit
from workflows.states import TaskState

RUN, COMPENSATE = "run", "compensate"


@dataclasses.dataclass
class Claim:
    mode: str  # RUN: execute steps; COMPENSATE: finish a cancel
    task: Task
    lease: Lease
    checkpoints: dict[int, StepCheckpoint]


def task_claim(*, task_id, worker: str) -> Claim | None:
    """Claim `task_id` for `worker`, or return None if there is nothing to claim
    (missing, running under a live lease, finished, or a retry not yet due)."""
    now = timezone.now()
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        if task is None:
            return None
        enqueued_at = task.enqueued_at
        if task.state == TaskState.CANCELLING:
            if task.lease_expires_at is not None and task.lease_expires_at >= now:
                return None  # its worker is alive and will finish the cancel
            mode = COMPENSATE
            Task.objects.filter(pk=task.pk).update(
                lease_token=F("lease_token") + 1, lease_owner=worker[:200],
                lease_expires_at=lease_expiry(now), enqueued_at=None, updated_at=now)
            task.refresh_from_db(fields=["lease_token", "lease_owner", "lease_expires_at"])
        elif task.is_due(now) and task.attempts < task.max_attempts:
            mode = RUN
            transition_apply(task, "claim", actor=f"worker:{worker}",
                             reason=f"attempt {task.attempts + 1} of {task.max_attempts}",
                             worker=worker, lease_expires_at=lease_expiry(now), now=now)
        else:
            return None
        # A task claimed for the first time has no checkpoints: skip the read.
        first_run = mode == RUN and task.attempts == 1
        checkpoints = {} if first_run else {
            cp.index: cp for cp in StepCheckpoint.objects.filter(task_id=task.pk)}
    lag = (now - enqueued_at).total_seconds() if enqueued_at else None
    emit_on_commit("task_claimed", task_id=str(task.pk), workflow=task.workflow,
                   attempt=task.attempts, mode=mode, queue_lag_seconds=lag, worker=worker,
                   trace_id=task.trace_id or None)
    return Claim(mode, task, Lease(task.pk, task.lease_token, worker), checkpoints)
