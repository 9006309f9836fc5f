"""Deleting finished tasks with their steps and history: `cleanup_tasks`
(docs/design.md, "Cleanup").

`tasks_cleanup` deletes in batches, each its own short transaction:

    SELECT id, state, expires_at, finished_at FROM task
     WHERE <finished and past the horizon> [AND workflow = …]
     LIMIT batch FOR UPDATE SKIP LOCKED
    -- re-check each locked row is still finished and past the horizon
    DELETE the ended webhook deliveries (a pending one outlives its task, its
      body fixed first: store/deliveries.py, `outlive`), steps, transitions,
      replays, then the tasks (the store's `delete_tasks`)
    COMMIT

and then removes, in batches too, the deliveries that outlived their task and
have ended since (`deliveries_prune`).

Why it is safe beside everything else that runs:
- a trigger deciding on an expired key holds that row FOR UPDATE: cleanup skips
  it (SKIP LOCKED) and the trigger deletes and recreates it itself; a trigger
  that arrives while cleanup holds the row waits for the short batch, finds
  the row gone and inserts a fresh task (triggers.py goes round again);
- two cleanups at once lock disjoint rows, so nothing is deleted twice and
  neither waits for the other;
- unfinished tasks never match, and the lock is taken on the current row
  version, so a task restarted (failed → pending) a moment earlier is not
  deleted: PostgreSQL re-evaluates the WHERE clause on the row it locks, and
  the Python re-check below says so explicitly;
- a kill between batches loses nothing: every committed batch is complete
  (children and task together), the rest are untouched and a later run
  carries on.

`q_results_prune` does the same for django-q2's own result rows (Success and
Failure), which no PILOT code reads.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from django_q.models import Task as QResult

from workflows.engine.store import store
from workflows.models import Task
from workflows.observability.events import Event, emit
from workflows.rules.states import FINISHED_STATES

DEFAULT_YIELD = 1.0  # the command's default: half the database's time at most
DEFAULT_BATCH = 1000
MAX_BATCH = 10000


@dataclasses.dataclass
class CleanupReport:
    dry_run: bool
    horizon: str  # what "old enough" meant, for the summary line
    tasks: int = 0  # deleted, or (dry run) that would be deleted
    batches: int = 0
    deliveries: int = 0  # webhook deliveries that outlived their task and have ended
    q_results: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class _Horizon:
    """Which finished tasks are old enough: expires_at <= now (the default), or
    finished_at < cutoff (--older-than)."""

    now: datetime
    cutoff: datetime | None
    workflow: str | None

    def queryset(self) -> QuerySet[Task]:
        qs = (Task.objects.expired(self.now) if self.cutoff is None
              else Task.objects.finished_before(self.cutoff))
        return qs.filter(workflow=self.workflow) if self.workflow else qs

    def holds(self, state: str, expires_at: datetime | None,
              finished_at: datetime | None) -> bool:
        if state not in FINISHED_STATES:
            return False
        if self.cutoff is None:
            return expires_at is not None and expires_at <= self.now
        return finished_at is not None and finished_at < self.cutoff

    def describe(self) -> str:
        what = (f"expires_at <= {self.now.isoformat()}" if self.cutoff is None
                else f"finished before {self.cutoff.isoformat()}")
        return what + (f", workflow {self.workflow}" if self.workflow else "")


def tasks_cleanup(*, older_than: timedelta | None = None, workflow: str | None = None,
                  batch_size: int = DEFAULT_BATCH, dry_run: bool = False,
                  now: datetime | None = None,
                  progress: Callable[[CleanupReport], None] | None = None,
                  yield_ratio: float = 0.0) -> CleanupReport:
    """Delete finished tasks past their expiry (or, with `older_than`, finished
    longer ago than that), optionally of one `workflow`, `batch_size` per
    transaction (module docstring). Never touches an unfinished task.

    Then deletes, `batch_size` per transaction, the webhook deliveries that
    outlived their task and have ended since (`report.deliveries`).

    `dry_run` counts what would go and changes nothing. `progress(report)` is
    called after every batch. `yield_ratio` R pauses R times as long as each
    batch took before the next one, so a cleanup takes at most 1/(1+R) of the
    database's time and triggers running beside it stay fast. Emits
    `cleanup_batch` per committed batch and `cleanup_finished` at the end. A
    second call at the same time deletes the rows the first has not locked; the
    two never delete the same row."""
    if not 1 <= batch_size <= MAX_BATCH:
        raise ValueError(f"batch_size must be 1..{MAX_BATCH}")
    # The database's clock decides "expired", as it does for the trigger: a
    # cleanup host whose clock runs ahead must not free a key a replay still
    # finds (docs/design.md, "Time").
    now = now or store().db_now()
    horizon = _Horizon(now, None if older_than is None else now - older_than, workflow)
    report = CleanupReport(dry_run=dry_run, horizon=horizon.describe())
    started = time.monotonic()
    if dry_run:
        report.tasks = horizon.queryset().count()
        report.batches = -(-report.tasks // batch_size)
        report.deliveries = deliveries_prune(dry_run=True)
    else:
        while True:
            batch_started = time.monotonic()
            deleted, locked = _delete_batch(horizon, batch_size)
            if locked == 0:
                break
            report.batches += 1
            report.tasks += deleted
            emit(Event.CLEANUP_BATCH, batch=report.batches, deleted=deleted,
                 total_deleted=report.tasks, workflow=workflow,
                 duration_ms=round((time.monotonic() - batch_started) * 1000, 3))
            report.seconds = round(time.monotonic() - started, 3)
            if progress is not None:
                progress(report)
            if locked < batch_size:
                break  # the rest, if any, is locked by someone else (another cleanup)
            if yield_ratio:
                time.sleep((time.monotonic() - batch_started) * yield_ratio)
        report.deliveries = deliveries_prune(batch_size=batch_size)
    report.seconds = round(time.monotonic() - started, 3)
    if not dry_run:
        emit(Event.CLEANUP_FINISHED, deleted=report.tasks, batches=report.batches,
             workflow=workflow, duration_ms=round(report.seconds * 1000, 3))
    return report


def _delete_batch(horizon: _Horizon, batch_size: int) -> tuple[int, int]:
    """One transaction: lock up to `batch_size` candidates (skipping rows others
    hold), re-check them, delete. Returns (deleted, locked)."""
    with transaction.atomic():
        rows = store().lock_free_in_tx(horizon.queryset().order_by()
                                 .values_list("pk", "state", "expires_at", "finished_at"),
                                 batch_size)
        ids = [pk for pk, state, expires_at, finished_at in rows
               if horizon.holds(state, expires_at, finished_at)]
        return store().delete_tasks_in_tx(ids), len(rows)


def deliveries_prune(*, batch_size: int = 1000, dry_run: bool = False) -> int:
    """Delete the deliveries that outlived their task and have ended since
    (delivered or failed), `batch_size` per transaction, skipping rows others
    hold (a sender recording, a second cleanup). Returns how many (would) go.
    A pending one is never touched: it is still owed."""
    rows = store().deliveries
    if dry_run:
        return rows.detached_ended().count()
    total = 0
    while True:
        with transaction.atomic():
            gone = rows.prune_detached_in_tx(batch_size)
        total += gone
        if gone < batch_size:
            break
    if total:
        emit(Event.WEBHOOK_DELIVERIES_PRUNED, deleted=total)
    return total


def q_results_prune(*, older_than: timedelta, batch_size: int = DEFAULT_BATCH,
                    dry_run: bool = False, now: datetime | None = None) -> int:
    """Delete django-q2's Success/Failure rows that stopped more than
    `older_than` ago, `batch_size` per transaction. Returns how many (would) go.
    Nothing in PILOT reads them (the Task table is the record); django-q2
    writes each row once, so no lock is needed beyond the DELETE's own."""
    cutoff = (now or timezone.now()) - older_than
    old = QResult.objects.filter(stopped__lt=cutoff)
    if dry_run:
        return old.count()
    total = 0
    while True:
        with transaction.atomic():
            ids = list(old.order_by().values_list("pk", flat=True)[:batch_size])
            if ids:
                store().delete_q_results(ids)
        total += len(ids)
        if len(ids) < batch_size:
            break
    if total:
        emit(Event.Q_RESULTS_PRUNED, deleted=total)
    return total
