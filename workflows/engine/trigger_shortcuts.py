"""PostgreSQL shortcuts for the two common single triggers: a new key, and a
plain replay. Each is one statement that the database decides atomically;
anything else (expired key, failed task to restart, cancelled, different
request) returns None and goes through the general path in triggers.py, which
locks the row and applies the whole decision table.

- `task_insert_returning`: INSERT … ON CONFLICT (owner, key) DO NOTHING
  RETURNING id. A row back means this call created the task; the unique
  constraint arbitrates exactly as in the general path.
- `task_replay_returning`: a conditional UPDATE (replays + 1) that only
  matches a same-fingerprint task in a replayable state whose key has not
  expired, with its TaskReplay row inserted in the same statement. UPDATE
  takes the row lock and re-checks its WHERE under it (READ COMMITTED), so this
  is the locked decision of SPEC §6, in one round trip.
"""

from __future__ import annotations

from django.db import connection

from workflows.models import Task, TaskReplay
from workflows.states import TaskState

_TASK = Task._meta.db_table
_REPLAY = TaskReplay._meta.db_table
_FIELDS = Task._meta.concrete_fields
_COLUMNS = ", ".join(f'"{f.column}"' for f in _FIELDS)


def available() -> bool:
    return connection.vendor == "postgresql"


def task_insert_returning(task: Task) -> bool:
    """Insert `task` unless its (owner, key) exists; True if this call inserted it."""
    marks = ", ".join(["%s"] * len(_FIELDS))
    sql = (f"INSERT INTO {_TASK} ({_COLUMNS}) VALUES ({marks}) "
           f'ON CONFLICT ("owner_id", "idempotency_key") DO NOTHING RETURNING "id"')
    params = [f.get_db_prep_save(getattr(task, f.attname), connection) for f in _FIELDS]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None


def task_replay_returning(*, owner_id, key: str, fingerprint: str, now) -> Task | None:
    """Count a replay of the same request and return the task, or None when the
    (owner, key) task is missing, different, expired, failed or cancelled."""
    sql = f"""
        WITH replayed AS (
            UPDATE {_TASK} SET "replays" = "replays" + 1, "last_replayed_at" = %s
            WHERE "owner_id" = %s AND "idempotency_key" = %s AND "fingerprint" = %s
              AND ("state" IN (%s, %s, %s)
                   OR ("state" = %s AND ("expires_at" IS NULL OR "expires_at" > %s)))
            RETURNING *
        ), logged AS (
            INSERT INTO {_REPLAY} ("task_id", "workflow", "count", "at")
            SELECT "id", "workflow", 1, %s FROM replayed
        )
        SELECT {_COLUMNS} FROM replayed"""
    params = [now, owner_id, key, fingerprint, TaskState.PENDING, TaskState.RUNNING,
              TaskState.RETRYING, TaskState.SUCCEEDED, now, now]
    rows = list(Task.objects.raw(sql, params))
    return rows[0] if rows else None
