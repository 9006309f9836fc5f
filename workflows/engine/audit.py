"""Apply a transition to a locked task: transition, save, audit — one step.

The caller holds the row lock (select_for_update) inside transaction.atomic();
`transition_apply` never opens its own transaction, so the change and its
TaskTransition row commit or roll back together.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from workflows.models import Task, TaskTransition
from workflows.observability.events import emit_on_commit

# Attribute names of the task's columns; `updated_at` is saved every time,
# everything else only when the transition changed it.
_CONCRETE = None


def _fields():
    global _CONCRETE
    if _CONCRETE is None:
        _CONCRETE = [f.attname for f in Task._meta.concrete_fields if not f.primary_key]
    return _CONCRETE


def actor_for(user: AbstractBaseUser | None) -> str:
    """How a user appears in the audit trail."""
    if user is None or not getattr(user, "is_authenticated", False):
        return "system"
    return f"user:{user.get_username()}"


def transition_apply(task: Task, name: str, *, actor: str, reason: str = "",
                     set_fields: dict | None = None, fence_token: int | None = None,
                     **kwargs) -> TaskTransition:
    """Run transition `name` with `kwargs` on the locked `task` (after assigning
    `set_fields`, non-state bookkeeping that belongs to the same change), save
    the fields that changed and record the edge. Raises
    django_fsm.TransitionNotAllowed if the edge is not legal from the current
    state, ConcurrentTransition if the row's state changed since it was read
    (only possible without the lock).

    With `fence_token` the task need not be locked first: the save is a
    compare-and-set on (state as read, lease_token = fence_token), and
    ConcurrentTransition means the worker no longer owns the task."""
    before = {attname: task.__dict__.get(attname) for attname in _fields()}
    from_state = task.state
    for attname, value in (set_fields or {}).items():
        setattr(task, attname, value)
    getattr(task, name)(**kwargs)
    task.updated_at = timezone.now()
    changed = [a for a in _fields() if task.__dict__.get(a) != before[a] or a == "updated_at"]
    task._fence_token = fence_token
    try:
        task.save(update_fields=changed)
    finally:
        task._fence_token = None
    record = TaskTransition.objects.create(
        task=task, transition=name, from_state=from_state, to_state=task.state,
        actor=actor[:200], reason=reason, at=task.updated_at,
    )
    emit_on_commit("task_transitioned", task_id=str(task.pk), workflow=task.workflow,
                   transition=name, from_state=from_state, to_state=task.state,
                   attempt=task.attempts, actor=actor, trace_id=task.trace_id or None)
    return record
