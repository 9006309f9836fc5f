"""Reads for the dashboard (docs/design.md, "Layers and doors": selectors read).
A handful of aggregate queries, each served by an index named beside it; nothing here writes.

Every function sees all tasks: the dashboard is for holders of
`workflows.view_all_tasks`, which its view checks.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncHour

from workflows.models import ActivityMinute, Task, TaskReplay, TaskTransition
from workflows.models.activity import RETRY_TRANSITIONS
from workflows.rules.states import TaskState

FIELDS = ("triggers", "replays", "successes", "failures", "retries")


@dataclasses.dataclass
class ActivityBucket:
    start: datetime
    triggers: int = 0
    replays: int = 0
    successes: int = 0
    failures: int = 0
    retries: int = 0


def activity_per_hour(now: datetime, *, hours: int = 24) -> list[ActivityBucket]:
    """Triggers (tasks created), replays (duplicate triggers absorbed), successes,
    failures and retries per UTC hour, oldest first, the last bucket being the
    current hour. The minutes the dispatcher has folded are summed from
    ActivityMinute (its unique index on minute); only the minutes after its
    last mark — a few, while a dispatcher runs — are counted from history, in
    three queries on pilot_task_created_idx, pilot_replay_at_idx and
    pilot_transition_at_idx."""
    current = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    first = current - timedelta(hours=hours - 1)
    end = current + timedelta(hours=1)
    buckets = {first + timedelta(hours=i): ActivityBucket(first + timedelta(hours=i))
               for i in range(hours)}
    last_mark = (ActivityMinute.objects.filter(workflow="", minute__lt=end)
                 .order_by("-minute").values_list("minute", flat=True).first())
    live_from = first
    if last_mark is not None and last_mark >= first:
        live_from = last_mark + timedelta(minutes=1)
        folded = (ActivityMinute.objects.filter(minute__gte=first, minute__lt=live_from)
                  .exclude(workflow="").annotate(hour=TruncHour("minute", tzinfo=UTC))
                  .order_by().values("hour")
                  .annotate(**{f: Sum(f) for f in FIELDS}))
        for row in folded:
            bucket = buckets[row["hour"]]
            for field in FIELDS:
                setattr(bucket, field, getattr(bucket, field) + (row[field] or 0))  # type: ignore[literal-required]

    # Bounded on both sides: a row written after `now` was read — in the next
    # hour when `now` is just before one, or by a database whose clock runs
    # ahead of this process's — belongs to no bucket here.
    def hourly(queryset, field, **aggregates):
        return (queryset.filter(**{f"{field}__gte": live_from, f"{field}__lt": end})
                .annotate(hour=TruncHour(field, tzinfo=UTC))
                .order_by().values("hour").annotate(**aggregates))

    for row in hourly(Task.objects, "created_at", n=Count("*")):
        buckets[row["hour"]].triggers += row["n"]
    for row in hourly(TaskReplay.objects, "at", n=Sum("count")):
        buckets[row["hour"]].replays += row["n"] or 0
    for row in hourly(TaskTransition.objects, "at",
                      ok=Count("pk", filter=Q(to_state=TaskState.SUCCEEDED)),
                      bad=Count("pk", filter=Q(to_state=TaskState.FAILED)),
                      again=Count("pk", filter=Q(transition__in=RETRY_TRANSITIONS))):
        bucket = buckets[row["hour"]]
        bucket.successes += row["ok"]
        bucket.failures += row["bad"]
        bucket.retries += row["again"]
    return list(buckets.values())


def tasks_oldest_pending(*, limit: int = 10) -> list[Task]:
    """Pending tasks, oldest first: a long wait here means no worker is taking
    work. Index: pilot_task_state_created_idx."""
    return list(Task.objects.filter(state=TaskState.PENDING).select_related("owner")
                .defer("payload", "result", "error").order_by("created_at")[:limit])


def tasks_waiting_for_a_person(*, limit: int = 10) -> list[Task]:
    """Tasks parked on a signal — an approval, a partner's answer — longest
    waiting first (a park is the last change of a waiting task: updated_at).
    Index: task_state_created_idx narrows to the waiting ones."""
    return list(Task.objects.filter(state=TaskState.WAITING, waiting_for__kind="signal")
                .select_related("owner").defer("payload", "result", "error")
                .order_by("updated_at")[:limit])


def workflows_top_failing(now: datetime, *, since: timedelta = timedelta(hours=24),
                          limit: int = 10) -> list[dict]:
    """Workflows with the most failures (transitions to `failed`) in the window,
    with the newest failed task of each and its error. The failures per
    workflow are summed from the minutes the dispatcher has folded
    (ActivityMinute) and counted from history only after its last mark (on
    pilot_transition_at_idx); then, per workflow shown, its newest failed task
    (pilot_task_state_created_idx, newest first: stops at the first of that
    workflow). Never an aggregate over the day's failed tasks (5.6 s at 10 M)."""
    start = now - since
    last_mark = (ActivityMinute.objects.filter(workflow="", minute__lt=now)
                 .order_by("-minute").values_list("minute", flat=True).first())
    live_from = start
    failures: dict[str, int] = {}
    if last_mark is not None and last_mark >= start:
        live_from = last_mark + timedelta(minutes=1)
        for workflow, n in (ActivityMinute.objects
                            .filter(minute__gte=start, minute__lt=live_from, failures__gt=0)
                            .exclude(workflow="").order_by().values("workflow")
                            .annotate(n=Sum("failures")).values_list("workflow", "n")):
            failures[workflow] = failures.get(workflow, 0) + n
    for workflow, n in (TaskTransition.objects
                        .filter(at__gte=live_from, at__lt=now, to_state=TaskState.FAILED)
                        .order_by().values("task__workflow").annotate(n=Count("pk"))
                        .values_list("task__workflow", "n")):
        failures[workflow] = failures.get(workflow, 0) + n
    top = sorted(failures.items(), key=lambda item: (-item[1], item[0]))[:limit]
    rows = []
    for workflow, n in top:
        latest = (Task.objects.filter(state=TaskState.FAILED, workflow=workflow)
                  .order_by("-created_at")
                  .values("pk", "finished_at", "error", "error_type").first())
        if latest is None:
            continue  # failed, then retried (or cleaned up) since
        rows.append({"workflow": workflow, "failures": n, "latest_id": latest["pk"],
                     "latest_at": latest["finished_at"], "latest_error": latest["error"],
                     "latest_error_type": latest["error_type"]})
    return rows
