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
from datetime import UTC, datetime, timedelta

from workflows.engine.store import store
from workflows.observability.events import Event, emit

FOLD_SECONDS = 60.0
HOUR = timedelta(hours=1)


@dataclasses.dataclass
class FoldReport:
    groups: int = 0     # (task, hour) groups folded
    removed: int = 0    # rows removed: their counts now live in the kept rows
    full: bool = False  # the batch limit was reached: fold again


def replays_fold(*, since: datetime | None = None, batch: int | None = None) -> FoldReport:
    """Fold up to `batch` (task, UTC hour) groups of more than one row each
    (None: the store's `fold_batch`), among rows at or after `since` (None: the
    whole log). `since` must be an hour boundary, so that a group is wholly
    inside or outside. The store does it (`fold_replays`): on PostgreSQL a
    batch is one statement, elsewhere one transaction per group."""
    if since is not None and since != fold_since(since, hours_back=0):
        raise ValueError(f"since must be a UTC hour boundary, not {since.isoformat()}")
    folder = store()
    batch = folder.fold_batch if batch is None else batch
    folded, removed, found = folder.fold_replays(since=since, batch=batch)
    return FoldReport(groups=folded, removed=removed, full=found == batch)


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
            emit(Event.DISPATCHER_ERROR, level=logging.ERROR,
                 error=f"replay fold: {type(exc).__name__}: {exc}"[:300])
            return None
        if report.full:
            self.next_at = 0.0  # the rest at the next pass
        else:
            self.since = fold_since(db_now)
        if report.removed:
            emit(Event.DISPATCHER_ACTION, action="replays_folded", count=report.removed)
        return report


def fold_since(now: datetime, *, hours_back: int = 1) -> datetime:
    """The hour boundary `hours_back` hours before the start of `now`'s UTC hour:
    where the next fold may start once a fold covered everything before `now`
    (a replay's `at` is its statement's start, so a row committed late is
    still inside the window)."""
    start = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return start - hours_back * HOUR
