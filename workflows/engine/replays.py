"""The replay log, kept short (docs/design.md, "Dispatcher").

A replay appends a TaskReplay row, and a task's replay count is the sum of its
rows (models/replay.py): append-only, so duplicate triggers never write the
task row its worker fences on and never wait on each other. Left alone, a key
replayed a million times would sum a million rows on every replay (measured:
a replay took 124 ms at 1 000 000 rows, 26 ms at 100 000, 8 ms at none).

`replays_fold` folds each task's rows of one UTC hour into one row — the hour's
latest `at`, the sum of the counts — so everything read from the log answers
the same before and after: the task's `replays`, its `last_replayed_at` and
the console's replays per UTC hour (admin/stats.py buckets by UTC hour). The
dispatcher loop folds every FOLD_SECONDS, so a task's log stays about one row
per hour it was replayed in, plus the last minute's.

Exact under any concurrency. A folder takes the group's rows FOR UPDATE SKIP
LOCKED and folds only those: a row another folder holds is left to it, so no
count moves twice. It keeps one of the rows (an UPDATE, never an INSERT): a
cleanup deleting the task at the same moment waits for the fold's locks and
then deletes the kept row with the rest, where an inserted row — invisible to
the cleanup's snapshot — would fail the task's delete on its foreign key.
Replays appended meanwhile are not locked by anybody; the next fold takes them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import Count
from django.db.models.functions import TruncHour

from workflows.engine import faults
from workflows.models import TaskReplay
from workflows.observability.events import emit

FOLD_SECONDS = 60.0
HOUR = timedelta(hours=1)


@dataclasses.dataclass
class FoldReport:
    groups: int = 0     # (task, hour) groups folded
    removed: int = 0    # rows removed: their counts now live in the kept rows
    full: bool = False  # the batch limit was reached: fold again


def replays_fold(*, since: datetime | None = None, batch: int = 200) -> FoldReport:
    """Fold up to `batch` (task, UTC hour) groups of more than one row each,
    among rows at or after `since` (None: the whole log). `since` must be an
    hour boundary, so that a group is wholly inside or outside."""
    if since is not None and since != fold_since(since, hours_back=0):
        raise ValueError(f"since must be a UTC hour boundary, not {since.isoformat()}")
    rows = TaskReplay.objects.all() if since is None else TaskReplay.objects.filter(at__gte=since)
    groups = list(rows.annotate(hour=TruncHour("at", tzinfo=UTC)).order_by()
                  .values("task_id", "hour").annotate(n=Count("id")).filter(n__gt=1)[:batch])
    report = FoldReport(full=len(groups) == batch)
    for group in groups:
        removed = _fold_group(group["task_id"], group["hour"])
        report.groups += removed > 0
        report.removed += removed
    return report


def _fold_group(task_id: uuid.UUID, hour: datetime) -> int:
    """One group in one transaction: the rows this folder could lock, newest
    kept with their summed count, the others deleted. Returns rows removed."""
    with transaction.atomic():
        members = list(TaskReplay.objects.select_for_update(skip_locked=True)
                       .filter(task_id=task_id, at__gte=hour, at__lt=hour + HOUR)
                       .order_by("-at", "-id").values_list("id", "count"))
        if len(members) < 2:
            return 0
        (kept, _), others = members[0], [pk for pk, _ in members[1:]]
        TaskReplay.objects.filter(pk=kept).update(count=sum(n for _, n in members))
        TaskReplay.objects.filter(pk__in=others).delete()
        faults.fault_point("before_fold_commit")
    return len(others)


class Folding:
    """The dispatcher loop's folding: at most every `every` seconds, from where
    the last complete fold left off (the whole log on the first fold, so rows
    left while no dispatcher ran are folded too); again at the next pass when a
    fold stopped at its batch limit."""

    def __init__(self, every: float = FOLD_SECONDS) -> None:
        self.every = every
        self.since: datetime | None = None
        self.next_at = 0.0

    def __call__(self, db_now: datetime) -> FoldReport | None:
        """Fold if due; `db_now` is the database's time read before this fold.
        Housekeeping never stops the dispatcher's own work: a fold that fails is
        logged, counted (`pilot_dispatcher_errors_total`) and tried again a
        period later, not at every pass."""
        if time.monotonic() < self.next_at:
            return None
        self.next_at = time.monotonic() + self.every
        try:
            report = replays_fold(since=self.since)
        except Exception as exc:  # noqa: BLE001 - see above; each group's transaction rolled back
            emit("dispatcher_error", level=logging.ERROR,
                 error=f"replay fold: {type(exc).__name__}: {exc}"[:300])
            return None
        if report.full:
            self.next_at = 0.0  # the rest at the next pass
        else:
            self.since = fold_since(db_now)
        if report.removed:
            emit("dispatcher_action", action="replays_folded", count=report.removed)
        return report


def fold_since(now: datetime, *, hours_back: int = 1) -> datetime:
    """The hour boundary `hours_back` hours before the start of `now`'s UTC hour:
    where the next fold may start once a fold covered everything before `now`
    (a replay's `at` is its statement's start, so a row committed late is
    still inside the window)."""
    start = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return start - hours_back * HOUR
