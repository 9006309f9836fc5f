"""Operator and owner actions on one task: cancel and retry (SPEC §5, §7).

Each call is one short transaction on one locked row: authorise, check the
edge is legal, apply the transition, audit, enqueue if there is work to do.
The API, the admin (one call per task in a bulk action) and commands all come
here.

Authorisation: the transition's permission (`workflows.cancel_task`,
`workflows.retry_task`) always suffices; the task's owner may act on their own
task when `owner_may` is true (the API) — the admin passes False, so only
operators holding the permission see and use the actions there. A caller that
may not even see the task gets TaskNotFound, never a hint that it exists.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django_fsm import can_proceed

from workflows.engine.audit import actor_for, transition_apply
from workflows.engine.compensation import needs_compensation
from workflows.engine.enqueue import enqueue_on_commit
from workflows.errors import InvalidTransition, PermissionDenied, TaskNotFound, UnknownWorkflow
from workflows.models import StepCheckpoint, Task
from workflows.observability.events import emit_on_commit
from workflows.registry import DEFAULT_IDEMPOTENCY_TTL, registry
from workflows.selectors import can_view_all
from workflows.states import StepState, TaskState


def transition_permission(name: str) -> str:
    """The permission declared on Task's `name` transition (one source of truth)."""
    meta = getattr(Task, name)._django_fsm
    return next(iter(meta.transitions.values())).permission


def _lock_for(user, task_id, *, owner_may: bool, action: str) -> Task:
    """Lock the task and authorise `user` for `action`, or raise."""
    task = Task.objects.select_for_update().filter(pk=task_id).first()
    is_owner = task is not None and user is not None and task.owner_id == user.pk
    if task is None or not (is_owner or can_view_all(user)):
        raise TaskNotFound("No such task")
    permitted = user is not None and user.has_perm(transition_permission(action))
    if not ((owner_may and is_owner) or permitted):
        raise PermissionDenied(f"You may not {action} this task")
    return task


def task_cancel(*, task_id, user, reason: str = "", owner_may: bool = True) -> Task:
    """Cancel a task (SPEC §7). pending/retrying with nothing to compensate →
    `cancelled` at once; running → `cancelling` (its worker stops at the next
    step boundary or heartbeat, compensates and finishes the cancel);
    pending/retrying with succeeded steps to compensate → `cancelling` and
    enqueued so a worker runs the compensations.

    Raises TaskNotFound, PermissionDenied, InvalidTransition (already finished
    or cancelling). A second cancel is therefore an InvalidTransition."""
    now = timezone.now()
    with transaction.atomic():
        task = _lock_for(user, task_id, owner_may=owner_may, action="cancel")
        if not can_proceed(task.cancel):
            raise InvalidTransition(f"A {task.state} task cannot be cancelled")
        workflow = registry.find(task.workflow)
        plan = workflow.steps_for(task.payload) if workflow else []
        compensate = task.state != TaskState.RUNNING and needs_compensation(task, plan)
        enqueue = compensate
        transition_apply(task, "cancel", actor=actor_for(user), reason=reason,
                         needs_compensation=compensate, now=now,
                         ttl=workflow.idempotency_ttl if workflow else DEFAULT_IDEMPOTENCY_TTL,
                         set_fields={"enqueued_at": now} if enqueue else None)
        if enqueue:
            enqueue_on_commit([task.pk])
        emit_on_commit("task_cancel_requested", task_id=str(task.pk), workflow=task.workflow,
                       attempt=task.attempts, to_state=task.state, actor=actor_for(user),
                       trace_id=task.trace_id or None)
    return task


def task_retry(*, task_id, user, from_start: bool = False, reason: str = "",
               owner_may: bool = True) -> Task:
    """Send a failed or cancelled task back to `pending` with a fresh budget of
    attempts and enqueue it. It resumes from its checkpoints, or with
    `from_start` every step runs again (checkpoints reset to pending).

    Raises TaskNotFound, PermissionDenied, InvalidTransition (not failed or
    cancelled, or its workflow is no longer registered)."""
    now = timezone.now()
    with transaction.atomic():
        task = _lock_for(user, task_id, owner_may=owner_may, action="retry")
        if not can_proceed(task.retry):
            raise InvalidTransition(f"A {task.state} task cannot be retried; only failed and "
                                    "cancelled tasks can")
        try:
            workflow = registry.get(task.workflow)
        except UnknownWorkflow:
            raise InvalidTransition(
                f"Workflow {task.workflow!r} is no longer registered; the task cannot run"
            ) from None
        if from_start:
            StepCheckpoint.objects.filter(task_id=task.pk).update(
                state=StepState.PENDING, output=None, progress=None, error="",
                started_at=None, finished_at=None)
        transition_apply(task, "retry", actor=actor_for(user),
                         reason=reason or ("retry from the first step" if from_start
                                           else "retry from the last checkpoint"),
                         budget=workflow.max_attempts, set_fields={"enqueued_at": now})
        enqueue_on_commit([task.pk])
    return task
