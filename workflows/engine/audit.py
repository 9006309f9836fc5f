"""Apply a transition: transition, save, audit — one step.

`transition_apply` runs a django-fsm transition on the task (the transition
alone decides the new field values), then persists the fields it changed as a
compare-and-set — the UPDATE names the state the task had when it was read,
and with `fence_token` the lease token too — together with the TaskTransition
row and, optionally, step checkpoint rows. Either all of it is written or
none of it: ConcurrentTransition means someone else changed the task first.

On PostgreSQL that is one statement (a data-modifying CTE), so a caller that
did not lock the row needs no transaction of its own; elsewhere it is the ORM
save, the audit insert and the step upsert, inside the caller's transaction.
A caller that holds the row lock (select_for_update) gets the same result;
the compare-and-set then simply always matches.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.utils import timezone
from django_fsm import ConcurrentTransition

from workflows.engine import checkpoints
from workflows.models import Task, TaskTransition
from workflows.observability.events import emit_on_commit

_FIELDS = {f.attname: f for f in Task._meta.concrete_fields if not f.primary_key}
_AUDIT_FIELDS = ("task_id", "transition", "from_state", "to_state", "actor", "reason", "at")


def actor_for(user: AbstractBaseUser | None) -> str:
    """How a user appears in the audit trail."""
    if user is None or not getattr(user, "is_authenticated", False):
        return "system"
    return f"user:{user.get_username()}"


def transition_apply(task: Task, name: str, *, actor: str, reason: str = "",
                     set_fields: dict | None = None, fence_token: int | None = None,
                     steps: list[checkpoints.StepRow] | None = None,
                     **kwargs) -> TaskTransition:
    """Run transition `name` with `kwargs` on `task` (after assigning
    `set_fields`, bookkeeping that belongs to the same change) and persist it
    with its audit row and `steps` (see the module docstring).

    Raises django_fsm.TransitionNotAllowed if the edge is not legal from the
    task's state, ConcurrentTransition if the stored task is no longer in the
    state it was read in (or, with `fence_token`, no longer holds that lease
    token)."""
    before = {attname: task.__dict__.get(attname) for attname in _FIELDS}
    from_state = task.state
    for attname, value in (set_fields or {}).items():
        setattr(task, attname, value)
    getattr(task, name)(**kwargs)
    task.updated_at = timezone.now()
    changed = [a for a in _FIELDS if task.__dict__.get(a) != before[a] or a == "updated_at"]
    record = TaskTransition(task=task, transition=name, from_state=from_state,
                            to_state=task.state, actor=actor[:200], reason=reason,
                            at=task.updated_at)
    if connection.vendor == "postgresql":
        record.pk = _persist_in_one_statement(task, changed, from_state, fence_token, record,
                                              steps or [])
        task._update_initial_state()
    else:
        with transaction.atomic(savepoint=False):  # joins the caller's, if any
            task._fence_token = fence_token
            try:
                task.save(update_fields=changed)
            finally:
                task._fence_token = None
            record.save()
            if steps:
                checkpoints.steps_upsert(task.pk, steps)
    emit_on_commit("task_transitioned", task_id=str(task.pk), workflow=task.workflow,
                   transition=name, from_state=from_state, to_state=task.state,
                   attempt=task.attempts, actor=actor, trace_id=task.trace_id or None)
    return record


def _persist_in_one_statement(task, changed, from_state, fence_token, record, steps) -> int:
    """UPDATE the changed columns where (id, state[, lease_token]) still match,
    INSERT the audit row and upsert the steps only if it did; the audit row's
    id, or ConcurrentTransition."""
    qn = connection.ops.quote_name
    sets = ", ".join(f"{qn(_FIELDS[a].column)} = %s" for a in changed)
    params = [_FIELDS[a].get_db_prep_save(task.__dict__[a], connection) for a in changed]
    where = f"{qn('id')} = %s AND {qn('state')} = %s"
    params += [task.pk, from_state]
    if fence_token is not None:
        where += f" AND {qn('lease_token')} = %s"
        params.append(fence_token)
    audit_fields = [TaskTransition._meta.get_field(f) for f in _AUDIT_FIELDS[1:]]
    sql = (f"WITH changed AS (UPDATE {qn(Task._meta.db_table)} SET {sets} WHERE {where} "
           f"RETURNING {qn('id')}), "
           f"audit AS (INSERT INTO {qn(TaskTransition._meta.db_table)} "
           f"({', '.join(qn(f) for f in _AUDIT_FIELDS)}) "
           f"SELECT {qn('id')}, {', '.join(['%s'] * len(audit_fields))} FROM changed "
           f"RETURNING {qn('id')})")
    params += [f.get_db_prep_save(getattr(record, f.attname), connection) for f in audit_fields]
    if steps:
        values, step_params = checkpoints.upsert_values(task.pk, steps)
        sql += (f", steps AS ({checkpoints.upsert_prefix()} SELECT v.* FROM (VALUES {values}) "
                f"AS v({checkpoints.COLUMNS}) WHERE EXISTS (SELECT FROM changed) "
                f"{checkpoints.ON_CONFLICT})")
        params += step_params
    sql += " SELECT id FROM audit"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        raise ConcurrentTransition(
            f"task {task.pk} is no longer {from_state}"
            + (f" under lease {fence_token}" if fence_token is not None else ""))
    return row[0]
