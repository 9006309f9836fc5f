"""Step checkpoints, written only under the worker's fence (SPEC §7).

Each function renews the fence first (the task row stays locked until the
surrounding transaction commits, task before step), then upserts the step's
row on its (task, index) unique constraint. A worker that lost its lease gets
LeaseLost/CancelRequested and writes nothing.

`step_succeeded` joins the caller's transaction when there is one: an atomic
step calls it inside the transaction that holds the step's own database
writes, so body, fence re-check and checkpoint commit together — exactly once.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from workflows.engine.leases import Lease, fence_renew
from workflows.models import StepCheckpoint
from workflows.states import StepState, TaskState


def step_record(task_id, index: int, name: str, **values) -> None:
    """Upsert step `index`'s row. Only for a caller that already holds the fence
    (the task row locked through fence_lock/fence_renew in this transaction)."""
    StepCheckpoint.objects.bulk_create(
        [StepCheckpoint(task_id=task_id, index=index, name=name, **values)],
        update_conflicts=True, unique_fields=["task", "index"],
        update_fields=["name", *values])


def step_started(lease: Lease, *, index: int, name: str, attempts: int) -> None:
    """Mark step `index` running (attempt number `attempts` of that step)."""
    with transaction.atomic(savepoint=False):
        fence_renew(lease)
        step_record(lease.task_id, index, name, state=StepState.RUNNING, attempts=attempts,
                started_at=timezone.now(), finished_at=None, error="")


def step_succeeded(lease: Lease, *, index: int, name: str, output,
                   next_step: tuple[int, str, int] | None = None,
                   states=(TaskState.RUNNING,)) -> None:
    """Record step `index` succeeded with `output` (the memo later steps and
    resumed runs read) and, in the same transaction, mark `next_step`
    (index, name, attempts) running — one commit per step boundary."""
    with transaction.atomic(savepoint=False):
        fence_renew(lease, states=states)
        now = timezone.now()
        step_record(lease.task_id, index, name, state=StepState.SUCCEEDED, output=output,
                finished_at=now, error="")
        if next_step is not None:
            next_index, next_name, attempts = next_step
            step_record(lease.task_id, next_index, next_name, state=StepState.RUNNING,
                    attempts=attempts, started_at=now, finished_at=None, error="")


def step_failed(lease: Lease, *, index: int, name: str, error: str,
                states=(TaskState.RUNNING,)) -> None:
    with transaction.atomic(savepoint=False):
        fence_renew(lease, states=states)
        step_record(lease.task_id, index, name, state=StepState.FAILED, error=error[:4000],
                finished_at=timezone.now())


def step_progress_save(lease: Lease, *, index: int, name: str, progress) -> None:
    """Save a step's in-flight progress (a cursor) for a resumed attempt."""
    with transaction.atomic(savepoint=False):
        fence_renew(lease)
        step_record(lease.task_id, index, name, progress=progress)


def step_compensated(lease: Lease, *, index: int, name: str, states) -> None:
    with transaction.atomic(savepoint=False):
        fence_renew(lease, states=states)
        step_record(lease.task_id, index, name, state=StepState.COMPENSATED,
                finished_at=timezone.now())


def step_compensation_failed(lease: Lease, *, index: int, name: str, error: str,
                             states) -> None:
    """The step stays `succeeded` (its effect is still in place); the error says
    the compensation failed, for the operator."""
    with transaction.atomic(savepoint=False):
        fence_renew(lease, states=states)
        step_record(lease.task_id, index, name, error=f"compensation failed: {error}"[:4000])
