"""Operator and owner actions on one task: cancel and retry (docs/design.md).

Each call is one short transaction on one locked row: authorise, decide with
the same plan the console shows as its dry run (`plans.cancel_plan`,
`plans.retry_plan`), apply the transition (which moves the task's token on,
fencing out whichever worker held it), audit, enqueue if there is work to do.
The API, the admin (one call per task in a bulk action) and commands all
come here.

Authorisation: the transition's permission (`workflows.cancel_task`,
`workflows.retry_task`) always suffices; the task's owner may act on their own
task when `owner_may` is true (the API) — the admin passes False, so only
operators holding the permission see and use the actions there. A caller that
may not even see the task gets TaskNotFound, never a hint that it exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction

from workflows.engine.announce import move
from workflows.engine.audit import actor_for
from workflows.engine.deliveries import deliveries_freeze
from workflows.engine.enqueue import enqueue_on_commit
from workflows.engine.plans import cancel_plan, owed_compensations, retry_plan
from workflows.engine.store import store
from workflows.models import StepCheckpoint, Task
from workflows.observability.events import Event, emit_on_commit
from workflows.rules.errors import (
    InvalidTransition,
    PermissionDenied,
    TaskNotFound,
    ValidationFailed,
)
from workflows.rules.states import FINISHED_STATES, TaskState
from workflows.selectors import can_view_all

# How deep a cancel follows children of children.
MAX_CANCEL_DEPTH = 20


def transition_permission(name: str) -> str:
    """The permission declared on Task's `name` transition (one source of truth)."""
    meta = getattr(Task, name)._django_fsm
    return next(iter(meta.transitions.values())).permission


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _lock_for(user: Any, task_id: Any, *, owner_may: bool, action: str) -> Task:
    """Lock the task (with the database's time) and authorise `user` for
    `action`, or raise."""
    task = store().lock_task_in_tx(task_id)
    is_owner = task is not None and user is not None and task.owner_id == user.pk
    if task is None or not (is_owner or can_view_all(user)):
        raise TaskNotFound("No such task")
    permitted = user is not None and user.has_perm(transition_permission(action))
    if not ((owner_may and is_owner) or permitted):
        raise PermissionDenied(f"You may not {action} this task")
    return task


def task_cancel(*, task_id: Any, user: Any, reason: str = "", owner_may: bool = True) -> Task:
    """Cancel a task. pending/retrying/waiting with nothing to compensate → `cancelled`
    at once; running → `cancelling` (its worker notices at its next write or
    heartbeat, takes the compensations over and finishes the cancel);
    pending/retrying with succeeded steps to compensate → `cancelling` and
    enqueued so a worker runs the compensations.

    Raises TaskNotFound, PermissionDenied, InvalidTransition (finished,
    cancelling, or compensating — already undoing its work). A second cancel
    is therefore an InvalidTransition."""
    with transaction.atomic():
        task = _lock_for(user, task_id, owner_may=owner_may, action="cancel")
        cancel_locked_in_tx(task, actor=actor_for(user), reason=reason)
        if task.children_count:
            children_cancel_in_tx([task.pk], actor=actor_for(user),
                                  reason=f"its parent {task.pk} was cancelled")
    return task


def cancel_locked_in_tx(task: Task, *, actor: str, reason: str) -> None:
    """Cancel `task`, which the caller holds locked and read with the
    database's time, by its cancel plan; InvalidTransition if it refuses."""
    now = task.pilot_db_now
    plan = cancel_plan(task, owed_compensations([task.pk]).get(task.pk, []))
    if not plan.allowed:
        raise InvalidTransition(_sentence(plan.summary))
    if task.state == TaskState.WAITING:  # its wait step ends here, unanswered
        store().interrupt_steps(task.pk, error="cancelled while waiting", at=now)
    move(task, "cancel", at=now, actor=actor, reason=reason,
         needs_compensation=plan.compensate, now=now,
         set_fields={"enqueued_at": now} if plan.enqueue else None)
    if plan.enqueue:
        enqueue_on_commit([task.pk])
    emit_on_commit(Event.TASK_CANCEL_REQUESTED, task_id=str(task.pk), workflow=task.workflow,
                   attempt=task.attempts, to_state=task.state, actor=actor,
                   trace_id=task.trace_id or None)


def children_cancel_in_tx(parents: Iterable[Any], *, actor: str, reason: str) -> int:
    """Cancel the children of `parents` that have not ended — and theirs, to
    MAX_CANCEL_DEPTH — in the caller's transaction, each by the cancel plan
    (nothing to undo → cancelled; work to undo → cancelling, enqueued; a
    running child → cancelling, its worker stops). Returns how many."""
    cancelled = 0
    level = list(parents)
    for _ in range(MAX_CANCEL_DEPTH):
        if not level:
            break
        children = store().lock_tasks_in_tx(
            Task.objects.filter(parent_id__in=level)
            .exclude(state__in=[*FINISHED_STATES, TaskState.CANCELLING, TaskState.COMPENSATING])
            .order_by("pk"))
        for child in children:
            cancel_locked_in_tx(child, actor=actor, reason=reason)
        cancelled += len(children)
        level = [child.pk for child in children]
    return cancelled


def task_retry(*, task_id: Any, user: Any, from_start: bool = False,
               from_step: str | None = None, reason: str = "",
               owner_may: bool = True) -> Task:
    """Send a failed or cancelled task back to `pending` with a fresh budget of
    attempts and enqueue it (`plans.retry_plan` says which steps run again:
    from its checkpoints, from the start, or from step `from_step`).

    Raises ValidationFailed (`from_step` with `from_start`, or not a step of
    the task's workflow), TaskNotFound, PermissionDenied, InvalidTransition
    (not failed or cancelled, or its workflow is no longer registered)."""
    if from_step is not None and from_start:
        raise ValidationFailed("from_step and from_start cannot be combined: from_start "
                               "runs every step again")
    with transaction.atomic():
        task = _lock_for(user, task_id, owner_may=owner_may, action="retry")
        task_restart(task, actor=actor_for(user), from_start=from_start, from_step=from_step,
                     reason=reason)
        enqueue_on_commit([task.pk])
    return task


def task_restart(task: Task, *, actor: str, from_start: bool = False,
                 from_step: str | None = None, reason: str = "") -> None:
    """Apply `retry` to `task`, which the caller holds locked (FOR UPDATE) and
    read with the database's time (`pilot_db_now`): reset the steps the plan
    names, fix the body of any webhook of its ending not yet sent, move the task
    back to pending (enqueued_at stamped; the caller enqueues it). Raises
    InvalidTransition when the plan refuses, ValidationFailed for a `from_step`
    the task's workflow does not have."""
    steps = list(StepCheckpoint.objects.filter(task_id=task.pk))
    plan = retry_plan(task, steps, from_start=from_start, from_step=from_step)
    if not plan.allowed:
        raise (ValidationFailed if plan.unknown_step else InvalidTransition)(
            _sentence(plan.summary))
    store().reset_steps_in_tx(task.pk, to_pending=list(plan.reset_to_pending),
                        as_done=list(plan.keep_as_done))
    now = task.pilot_db_now
    deliveries_freeze(task)  # the webhooks of the ending keep announcing the ending
    move(task, "retry", at=now, actor=actor,
         reason=reason or plan.summary, budget=plan.budget, now=now,
         set_fields={"enqueued_at": now})


def task_skip_backoff(*, task_id: Any) -> int:
    """For an author's tests (workflows.testing): what the task waits out a
    backoff for is due now, by the database's clock. Moves no state."""
    return store().skip_backoff(task_id)


def task_expire_lease(*, task_id: Any) -> int:
    """For an author's tests (workflows.testing): the task's lease ran out, as
    after its worker died; the dispatcher's next pass acts on it."""
    return store().expire_lease(task_id)


__all__ = ["task_cancel", "task_expire_lease", "task_restart", "task_retry",
           "task_skip_backoff", "transition_permission"]
