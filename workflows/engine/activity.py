"""The dashboard's activity, folded by the dispatcher (docs/design.md,
"Dispatcher"; models/activity.py).

`activity_fold` recounts closed UTC minutes — tasks created, replays absorbed,
transitions to succeeded and failed, retries — per workflow, from history
through its time indexes (pilot_task_created_idx, pilot_replay_at_idx,
pilot_transition_at_idx: one minute of rows each), and writes them as
ActivityMinute rows, overwriting what an earlier fold wrote (INSERT … ON
CONFLICT DO UPDATE on both databases), plus the minute's folded mark. A
recount is idempotent, so concurrent dispatchers need no lock, and
`ActivityFolding` re-folds the last LATE_MINUTES minutes at every fold: a row's
time is its statement's start, so a transaction that commits late still lands
in its minute.

The dashboard (admin/stats.py) sums the folded minutes and counts only the
minutes after the last mark from history. With no dispatcher running it
counts everything from history, as before.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncMinute

from workflows.engine.store import store
from workflows.models import ActivityMinute, Task, TaskReplay, TaskTransition
from workflows.models.activity import RETRY_TRANSITIONS
from workflows.observability.events import Event, emit
from workflows.rules.states import TaskState

MINUTE = timedelta(minutes=1)
KEEP = timedelta(hours=25)        # the dashboard's 24 h window and its current hour
FOLD_SECONDS = 60.0              # each minute is recounted about three times
LATE_MINUTES = 2
MAX_MINUTES = 10                  # per fold: a first fold of a day takes 150 short passes
FIELDS = ("triggers", "replays", "successes", "failures", "retries")


def minute_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def activity_fold(*, since: datetime, until: datetime) -> int:
    """Recount the minutes from `since` up to (not including) `until`, both
    minute boundaries, into ActivityMinute; delete rows older than KEEP before
    `until`. Returns the rows written. Takes no lock."""
    if since != minute_of(since) or until != minute_of(until):
        raise ValueError("since and until must be UTC minute boundaries")
    counts: dict[tuple[datetime, str], dict[str, int]] = {}

    def add(queryset: Any, field: str, group: str, **aggregates: Any) -> None:
        rows = (queryset.filter(**{f"{field}__gte": since, f"{field}__lt": until})
                .annotate(m=TruncMinute(field, tzinfo=UTC)).order_by()
                .values("m", group).annotate(**aggregates))
        for row in rows:
            slot = counts.setdefault((row["m"], row[group]), dict.fromkeys(FIELDS, 0))
            for name in aggregates:
                slot[name] += row[name] or 0

    add(Task.objects, "created_at", "workflow", triggers=Count("*"))
    add(TaskReplay.objects, "at", "workflow", replays=Sum("count"))
    add(TaskTransition.objects, "at", "task__workflow",
        successes=Count("pk", filter=Q(to_state=TaskState.SUCCEEDED)),
        failures=Count("pk", filter=Q(to_state=TaskState.FAILED)),
        retries=Count("pk", filter=Q(transition__in=RETRY_TRANSITIONS)))
    rows = [ActivityMinute(minute=minute, workflow=workflow, **values)
            for (minute, workflow), values in counts.items()]
    marks = []
    minute = since
    while minute < until:
        marks.append(ActivityMinute(minute=minute, workflow=""))
        minute += MINUTE
    store().activity_write(rows + marks, fields=list(FIELDS), drop_before=until - KEEP)
    return len(rows) + len(marks)


def folded_until() -> datetime | None:
    """The end of the last folded minute, or None when nothing is folded."""
    last = (ActivityMinute.objects.filter(workflow="").order_by("-minute")
            .values_list("minute", flat=True).first())
    return None if last is None else last + MINUTE


class ActivityFolding:
    """The dispatcher loop's activity fold: at most every `every` seconds, the
    closed minutes since the last mark (less LATE_MINUTES; at most MAX_MINUTES
    a fold, the rest at the next pass); on a first fold, from KEEP ago."""

    def __init__(self, every: float = FOLD_SECONDS) -> None:
        self.every = every
        self.next_at = 0.0

    def __call__(self, db_now: datetime) -> int | None:
        """Fold if due; a fold that fails is logged and counted
        (`pilot_dispatcher_errors_total`), never stops the dispatcher."""
        if time.monotonic() < self.next_at:
            return None
        self.next_at = time.monotonic() + self.every
        until = minute_of(db_now)
        try:
            done = folded_until()
            if done is None:
                since = until - KEEP
            elif until - done > MAX_MINUTES * MINUTE:  # catching up: old minutes, none late
                since = max(until - KEEP, done)
            else:
                since = max(until - KEEP, done - LATE_MINUTES * MINUTE)
            if since + MAX_MINUTES * MINUTE < until:
                until, self.next_at = since + MAX_MINUTES * MINUTE, 0.0
            return activity_fold(since=since, until=until) if since < until else 0
        except Exception as exc:  # noqa: BLE001 - see above; the fold's transaction rolled back
            emit(Event.DISPATCHER_ERROR, level=logging.ERROR,
                 error=f"activity fold: {type(exc).__name__}: {exc}"[:300])
            return None
