"""Step checkpoints, written only under the worker's fence (SPEC §7).

Every write is conditional on the worker's lease token and the task's state:
the fence (an UPDATE of the task row that also extends the lease) and the
step upsert on (task, index) commit together or not at all, task row first.
A worker that lost its lease gets LeaseLost/CancelRequested and writes nothing.

The hot path — `steps_write`, used at every step boundary — is one statement
on PostgreSQL: a data-modifying CTE runs the fence and inserts the rows only
if it matched, in the caller's transaction or, outside one, as its own
autocommit statement. Elsewhere (SQLite) it is the fence then the upsert in a
transaction. Inside an atomic step's transaction it joins that transaction,
so the body, the fence re-check and the checkpoint commit together — exactly
once.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from workflows.engine.leases import (
    Lease,
    fence_lock,
    fence_renew,
    lease_expiry,
    raise_lease_refusal,
)
from workflows.models import StepCheckpoint, Task
from workflows.states import StepState, TaskState

_STEP_TABLE = StepCheckpoint._meta.db_table
_TASK_TABLE = Task._meta.db_table
COLUMNS = '"task_id", "index", "name", "state", "output", "attempts", "error", ' \
          '"started_at", "finished_at"'
# A re-written row keeps what the writer does not know: its first start time and
# its highest attempt count; `progress` is never touched here.
ON_CONFLICT = f"""
ON CONFLICT ("task_id", "index") DO UPDATE SET
    "name" = excluded."name", "state" = excluded."state", "output" = excluded."output",
    "attempts" = CASE WHEN excluded."attempts" > {_STEP_TABLE}."attempts"
                      THEN excluded."attempts" ELSE {_STEP_TABLE}."attempts" END,
    "error" = excluded."error",
    "started_at" = COALESCE(excluded."started_at", {_STEP_TABLE}."started_at"),
    "finished_at" = excluded."finished_at"
"""


@dataclasses.dataclass(frozen=True)
class StepRow:
    index: int
    name: str
    state: str
    output: object = None
    attempts: int = 0           # 0: keep the stored count
    error: str = ""
    started_at: datetime | None = None   # None: keep the stored start
    finished_at: datetime | None = None


def started(index: int, name: str, attempts: int, now: datetime) -> StepRow:
    return StepRow(index, name, StepState.RUNNING, attempts=attempts, started_at=now)


def succeeded(index: int, name: str, output, now: datetime) -> StepRow:
    return StepRow(index, name, StepState.SUCCEEDED, output=output, finished_at=now)


def _params(task_id, row: StepRow) -> list:
    ops = connection.ops
    return [Task._meta.pk.get_db_prep_value(task_id, connection), row.index, row.name,
            row.state, None if row.output is None else json.dumps(row.output), row.attempts,
            row.error[:4000],
            ops.adapt_datetimefield_value(row.started_at),
            ops.adapt_datetimefield_value(row.finished_at)]


def upsert_prefix() -> str:
    return f"INSERT INTO {_STEP_TABLE} ({COLUMNS})"


def upsert_values(task_id, rows: list[StepRow]) -> tuple[str, list]:
    """The VALUES rows (typed) and their parameters, for an upsert statement."""
    cast = _casts()
    return (", ".join([f"({cast})"] * len(rows)),
            [p for row in rows for p in _params(task_id, row)])


def steps_upsert(task_id, rows: list[StepRow]) -> None:
    """Upsert the rows, one statement. Only for a caller already holding the
    fence in this transaction (the task row updated or locked)."""
    values, params = upsert_values(task_id, rows)
    with connection.cursor() as cursor:
        cursor.execute(f"{upsert_prefix()} VALUES {values} {ON_CONFLICT}", params)


def _casts() -> str:
    if connection.vendor == "postgresql":
        return ("%s::uuid, %s::int, %s::text, %s::text, %s::jsonb, %s::int, %s::text, "
                "%s::timestamptz, %s::timestamptz")
    return ", ".join(["%s"] * 9)


def steps_write(lease: Lease, rows: list[StepRow], *, states=(TaskState.RUNNING,)) -> None:
    """Fence, then upsert `rows`; raise LeaseLost/CancelRequested (writing
    nothing) when the task is no longer ours in `states`. The fence extends the
    lease when it is due (lease.clock); otherwise it only holds the task row
    (FOR SHARE: a cancel waits until this write committed) without rewriting it."""
    renew = lease.clock.due()
    if connection.vendor != "postgresql":
        with transaction.atomic(savepoint=False):
            if renew:
                fence_renew(lease, states=states)
            else:
                fence_lock(lease, states=states)
            steps_upsert(lease.task_id, rows)
        return
    values, step_params = upsert_values(lease.task_id, rows)
    state_marks = ", ".join(["%s"] * len(states))
    if renew:
        fence = (f"UPDATE {_TASK_TABLE} SET lease_expires_at = %s WHERE id = %s "
                 f"AND lease_token = %s AND state IN ({state_marks}) RETURNING id")
        params = [lease_expiry(), lease.task_id, lease.token, *states]
    else:
        fence = (f"SELECT id FROM {_TASK_TABLE} WHERE id = %s AND lease_token = %s "
                 f"AND state IN ({state_marks}) FOR SHARE")
        params = [lease.task_id, lease.token, *states]
    sql = (f"WITH fence AS ({fence}) {upsert_prefix()} "
           f"SELECT v.* FROM (VALUES {values}) AS v({COLUMNS}) WHERE EXISTS (SELECT FROM fence) "
           f"{ON_CONFLICT} RETURNING 1")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *step_params])
        written = cursor.fetchall()
    if not written:
        raise_lease_refusal(lease)
    if renew:
        lease.clock.mark()


# --- the rarer writes, in plain ORM transactions ----------------------------------------------

def step_failed(lease: Lease, *, index: int, name: str, error: str,
                states=(TaskState.RUNNING,)) -> None:
    steps_write(lease, [StepRow(index, name, StepState.FAILED, error=error,
                                finished_at=timezone.now())], states=states)


def step_progress_save(lease: Lease, *, index: int, name: str, progress) -> None:
    """Save a step's in-flight progress (a cursor) for a resumed attempt."""
    with transaction.atomic(savepoint=False):
        fence_renew(lease)
        StepCheckpoint.objects.filter(task_id=lease.task_id, index=index).update(
            progress=progress)


def step_compensated(lease: Lease, *, index: int, name: str, states) -> None:
    with transaction.atomic(savepoint=False):
        fence_renew(lease, states=states)
        StepCheckpoint.objects.filter(task_id=lease.task_id, index=index).update(
            state=StepState.COMPENSATED, finished_at=timezone.now())


def step_compensation_failed(lease: Lease, *, index: int, name: str, error: str,
                             states) -> None:
    """The step stays `succeeded` (its effect is still in place); the error says
    the compensation failed, for the operator."""
    with transaction.atomic(savepoint=False):
        fence_renew(lease, states=states)
        StepCheckpoint.objects.filter(task_id=lease.task_id, index=index).update(
            error=f"compensation failed: {error}"[:4000])
