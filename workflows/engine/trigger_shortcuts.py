"""PostgreSQL's shortcut for the two common single triggers — a new key and a
plain replay — decided by the database in one or two statements. Anything else
(expired key, failed task to restart, cancelled, a different request, a row
another transaction is still inserting) returns None and goes through the
general path in triggers.py, which locks the row and applies the whole
decision table.

- the insert: INSERT … ON CONFLICT (owner, key) DO NOTHING RETURNING id. A
  row back means this call created the task; the unique constraint arbitrates
  exactly as in the general path.
- the replay, only when the key was taken: one data-modifying CTE that does
  UPDATE … SET replays + 1 where the task has the same fingerprint, a
  replayable state and an unexpired key — UPDATE takes the row lock and
  re-checks its WHERE under it (READ COMMITTED), so this is the locked
  decision of SPEC §6 —, inserts the TaskReplay row, and returns the task
  with its step checkpoints (as JSON), so the response needs no other query.
"""

from __future__ import annotations

import json

from django.db import connection
from django.utils.dateparse import parse_datetime

from workflows.models import StepCheckpoint, Task, TaskReplay
from workflows.states import TaskState

_TASK = Task._meta.db_table
_REPLAY = TaskReplay._meta.db_table
_STEP = StepCheckpoint._meta.db_table
_FIELDS = Task._meta.concrete_fields
_COLUMNS = ", ".join(f'"{f.column}"' for f in _FIELDS)
_STEP_JSON = ", ".join(f"'{name}', s.\"{name}\"" for name in (
    "index", "name", "state", "attempts", "output", "error", "started_at", "finished_at"))

CREATED, REPLAYED = "created", "replayed"


def available() -> bool:
    return connection.vendor == "postgresql"


def task_create_or_replay(task: Task, *, now) -> tuple[str, Task] | None:
    """("created", task) if `task` was inserted, ("replayed", stored task with
    its steps) if the same request was replayed, None for the general path.
    Two statements at most: the insert, and the replay only when the key was
    taken (new keys, the common case, pay one)."""
    if _insert(task):
        return CREATED, task
    replayed = _replay(task, now)
    return (REPLAYED, replayed) if replayed is not None else None


def _insert(task: Task) -> bool:
    marks = ", ".join(["%s"] * len(_FIELDS))
    sql = (f"INSERT INTO {_TASK} ({_COLUMNS}) VALUES ({marks}) "
           f'ON CONFLICT ("owner_id", "idempotency_key") DO NOTHING RETURNING "id"')
    params = [f.get_db_prep_save(getattr(task, f.attname), connection) for f in _FIELDS]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None


def _replay(task: Task, now) -> Task | None:
    sql = f"""
        WITH rep AS (
            UPDATE {_TASK} SET "replays" = "replays" + 1, "last_replayed_at" = %s
            WHERE "owner_id" = %s AND "idempotency_key" = %s AND "fingerprint" = %s
              AND ("state" IN (%s, %s, %s)
                   OR ("state" = %s AND ("expires_at" IS NULL OR "expires_at" > %s)))
            RETURNING *
        ), logged AS (
            INSERT INTO {_REPLAY} ("task_id", "workflow", "count", "at")
            SELECT "id", "workflow", 1, %s FROM rep
        )
        SELECT {", ".join(f'rep."{f.column}"' for f in _FIELDS)},
               (SELECT json_agg(json_build_object({_STEP_JSON}) ORDER BY s."index")
                FROM {_STEP} s WHERE s."task_id" = rep."id") AS pilot_steps
        FROM rep"""
    params = [now, task.owner_id, task.idempotency_key, task.fingerprint,
              TaskState.PENDING, TaskState.RUNNING, TaskState.RETRYING,
              TaskState.SUCCEEDED, now, now]
    rows = list(Task.objects.raw(sql, params))
    if not rows:
        return None
    row = rows[0]
    row._prefetched_objects_cache = {"steps": _steps(row.pk, row.pilot_steps)}
    return row


def _steps(task_id, raw) -> list[StepCheckpoint]:
    if raw is None:
        return []
    items = json.loads(raw) if isinstance(raw, str) else raw
    return [StepCheckpoint(task_id=task_id, index=i["index"], name=i["name"], state=i["state"],
                           attempts=i["attempts"], output=i["output"], error=i["error"],
                           started_at=i["started_at"] and parse_datetime(i["started_at"]),
                           finished_at=i["finished_at"] and parse_datetime(i["finished_at"]))
            for i in items]
