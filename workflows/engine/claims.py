"""Claiming a task for execution (SPEC §7).

A claim reads the task, re-checks that it is claimable (`pending`, or
`retrying` and due, with attempts left) and applies `claim` (attempts + 1, a
new lease token, lease owner and expiry) as a compare-and-set on the state
and lease token it read — SPEC §7's "conditional update" — together with its
audit row and the first step's "running" checkpoint, in one statement on
PostgreSQL. Of two workers (or a duplicate delivery, or a django-q2
redelivery) racing for one task, exactly one compare-and-set matches; the
others get None: no effect. Unlike a SKIP LOCKED scan, nothing is dropped: a
claim that loses to a replay's momentary row lock simply waits for it, and
only a real change of state or token makes it step back.

One more case is claimed here: a `cancelling` task that no live worker holds
(its worker died, or it was cancelled while waiting with steps to compensate).
The worker takes over its lease — no state change — to run compensations and
finish the cancel.
"""

from __future__ import annotations

import dataclasses

from django.db.models import F, Q
from django.utils import timezone
from django_fsm import ConcurrentTransition

from workflows.engine import checkpoints as cps
from workflows.engine.audit import transition_apply
from workflows.engine.leases import Lease, lease_expiry
from workflows.models import StepCheckpoint, Task
from workflows.observability.events import emit_on_commit
from workflows.registry import registry
from workflows.states import StepState, TaskState

RUN, COMPENSATE = "run", "compensate"


@dataclasses.dataclass
class Claim:
    mode: str  # RUN: execute steps; COMPENSATE: finish a cancel
    task: Task
    lease: Lease
    checkpoints: dict[int, StepCheckpoint]
    started: int | None = None  # the step the claim already marked running


def task_claim(*, task_id, worker: str) -> Claim | None:
    """Claim `task_id` for `worker`, or return None if there is nothing to claim
    (missing, running under a live lease, finished, a retry not yet due, or
    another worker's claim won)."""
    now = timezone.now()
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        return None
    enqueued_at = task.enqueued_at
    if task.state == TaskState.CANCELLING:
        claim = _take_over_cancel(task, worker, now)
    elif task.is_due(now) and task.attempts < task.max_attempts:
        claim = _claim_to_run(task, worker, now)
    else:
        return None
    if claim is None:
        return None
    lag = (now - enqueued_at).total_seconds() if enqueued_at else None
    emit_on_commit("task_claimed", task_id=str(task.pk), workflow=task.workflow,
                   attempt=task.attempts, mode=claim.mode, queue_lag_seconds=lag,
                   worker=worker, trace_id=task.trace_id or None)
    return claim


def _checkpoints(task: Task) -> dict[int, StepCheckpoint]:
    # A task never claimed before has no checkpoints: skip the read.
    if task.attempts == 0:
        return {}
    return {cp.index: cp for cp in StepCheckpoint.objects.filter(task_id=task.pk)}


def _first_step(task: Task, checkpoints: dict) -> list[cps.StepRow]:
    """The "running" row of the step this run will start with (written with the
    claim), or nothing when the plan cannot be read here — the runner then
    fails the task with the reason."""
    workflow = registry.find(task.workflow)
    try:
        plan = workflow.steps_for(task.payload) if workflow else []
    except Exception:  # noqa: BLE001 - reported by the runner, which reads the plan too
        return []
    for index, step in enumerate(plan):
        cp = checkpoints.get(index)
        if cp is not None and cp.name != step.name:
            return []  # the workflow changed: the runner stops with WorkflowChanged
        if cp is None or cp.state != StepState.SUCCEEDED:
            attempts = (cp.attempts if cp else 0) + 1
            return [cps.started(index, step.name, attempts, timezone.now())]
    return []


def _claim_to_run(task: Task, worker: str, now) -> Claim | None:
    read_token = task.lease_token
    checkpoints = _checkpoints(task)
    first = _first_step(task, checkpoints)
    try:
        transition_apply(task, "claim", actor=f"worker:{worker}",
                         reason=f"attempt {task.attempts + 1} of {task.max_attempts}",
                         fence_token=read_token, steps=first,
                         worker=worker, lease_expires_at=lease_expiry(now), now=now)
    except ConcurrentTransition:
        return None  # another worker (or a cancel) changed it since we read it
    return Claim(RUN, task, Lease(task.pk, task.lease_token, worker), checkpoints,
                 started=first[0].index if first else None)


def _take_over_cancel(task: Task, worker: str, now) -> Claim | None:
    if task.lease_expires_at is not None and task.lease_expires_at >= now:
        return None  # its worker is alive and will finish the cancel
    taken = Task.objects.filter(
        Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now),
        pk=task.pk, state=TaskState.CANCELLING, lease_token=task.lease_token,
    ).update(lease_token=F("lease_token") + 1, lease_owner=worker[:200],
             lease_expires_at=lease_expiry(now), enqueued_at=None, updated_at=now)
    if not taken:
        return None
    task.refresh_from_db(fields=["lease_token", "lease_owner", "lease_expires_at"])
    return Claim(COMPENSATE, task, Lease(task.pk, task.lease_token, worker),
                 _checkpoints(task))
