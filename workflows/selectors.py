"""Reads, scoped to the caller: the engine writes, selectors read
(docs/design.md, "Layers and doors")."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from workflows.models import Task
from workflows.rules.errors import IdempotencyKeyInvalid, TaskNotFound, ValidationFailed
from workflows.rules.keys import normalize_key
from workflows.rules.states import FINISHED_STATES, TaskState

LIST_FILTERS = ("state", "workflow", "idempotency_key", "created_after", "created_before",
                "parent")
LIST_CONTROLS = ("cursor", "page_size")


def can_view_all(user) -> bool:
    return bool(user and user.has_perm("workflows.view_all_tasks"))


def tasks_visible_to(user):
    """Every task `user` may see: their own, or all with view_all_tasks (with
    their replay counts)."""
    qs = Task.objects.with_replays()
    return qs if can_view_all(user) else qs.filter(owner=user)


def task_get_for(user, task_id) -> Task:
    """The task `task_id` if `user` may see it; TaskNotFound otherwise — the same
    answer for a malformed id, a missing task and another client's task, so ids
    cannot be probed."""
    try:
        pk = uuid.UUID(str(task_id))
    except (TypeError, ValueError, AttributeError):
        raise TaskNotFound("No such task") from None
    task = tasks_visible_to(user).filter(pk=pk).first()
    if task is None:
        raise TaskNotFound("No such task")
    return task


def task_with_attempts(task_id) -> tuple[Task, list] | None:
    """The task `task_id` and its attempts' transitions, oldest first — its
    claims and the failures that ended an attempt — or None for a malformed
    or unknown id. Not scoped to a user: for trusted server code (Django's
    task framework's `get_result`, workflows/django_tasks.py). Two queries."""
    from django.db.models import Q

    from workflows.models import TaskTransition

    try:
        pk = uuid.UUID(str(task_id))
    except (TypeError, ValueError, AttributeError):
        return None
    task = Task.objects.filter(pk=pk).first()
    if task is None:
        return None
    ended = Q(from_state=TaskState.RUNNING, transition__in=("schedule_retry", "fail", "compensate"))
    attempts = list(TaskTransition.objects.filter(ended | Q(transition="claim"), task_id=pk)
                    .order_by("at", "id"))
    return task, attempts


def _parse_time(name: str, raw: str) -> datetime:
    """`raw` as an aware datetime in UTC, or ValidationFailed. In UTC because
    ISO 8601 allows offsets up to ±23:59 and PostgreSQL refuses any beyond
    ±15:59 ("time zone displacement out of range"); converting first also
    refuses, as a 400, a date that only exists in its own offset (0001-01-01
    at +05:00 is before year 1 in UTC)."""
    invalid = ValidationFailed(f"{name} is not a valid ISO 8601 date-time",
                               errors={name: ["Use ISO 8601, e.g. 2026-11-29T10:00:00Z."]})
    try:
        # A '+' in a query string arrives as a space.
        value = parse_datetime(raw.strip().replace(" ", "+"))
    except ValueError:  # well-formed but impossible: February 30th, an offset of 99 h
        raise invalid from None
    if value is None:
        raise invalid
    try:
        if timezone.is_naive(value):
            return timezone.make_aware(value, UTC)
        return value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise invalid from None


def tasks_filtered_for(user, params):
    """The tasks `user` may see, filtered by the list API's query parameters
    (state — one or several, comma-separated —, workflow, idempotency_key,
    created_after, created_before). Unknown parameters and bad values raise
    ValidationFailed instead of being ignored, so a typo never returns
    everything."""
    unknown = sorted(set(params) - set(LIST_FILTERS) - set(LIST_CONTROLS))
    nul = sorted(name for name in set(params) & set(LIST_FILTERS) if "\x00" in params[name])
    if nul:
        raise ValidationFailed("Query parameters may not contain NUL characters",
                               errors={name: ["Contains a NUL character."] for name in nul})
    if unknown:
        raise ValidationFailed("Unknown query parameter(s): " + ", ".join(unknown),
                               errors={name: ["Unknown filter."] for name in unknown})
    qs = tasks_visible_to(user)
    if "state" in params:
        states = [s.strip() for s in params["state"].split(",")]
        bad = [s for s in states if s not in TaskState.values]
        if bad:
            raise ValidationFailed("Unknown state", errors={"state": [
                f"{', '.join(bad)} is not one of {', '.join(TaskState.values)}."]})
        qs = qs.filter(state__in=states)
    if "workflow" in params:
        qs = qs.filter(workflow=params["workflow"])
    if "idempotency_key" in params:
        try:
            qs = qs.filter(idempotency_key=normalize_key(params["idempotency_key"]))
        except IdempotencyKeyInvalid as exc:
            raise ValidationFailed(exc.detail, errors={"idempotency_key": [exc.detail]}) from None
    if "parent" in params:
        try:
            parent = uuid.UUID(params["parent"])
        except ValueError:
            raise ValidationFailed("parent must be a task id (a UUID)",
                                   errors={"parent": ["Must be a task id (a UUID)."]}) from None
        qs = qs.filter(parent_id=parent)
    if "created_after" in params:
        qs = qs.filter(created_at__gt=_parse_time("created_after", params["created_after"]))
    if "created_before" in params:
        qs = qs.filter(created_at__lt=_parse_time("created_before", params["created_before"]))
    return qs

def task_wait_finished(task_id, *, timeout: float, interval: float = 0.2) -> Task:
    """Re-read task `task_id` every `interval` seconds until it has finished or
    `timeout` seconds passed; returns the last version read (finished or not).
    Reads only, no lock held between reads."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        task = Task.objects.get(pk=task_id)
        if task.is_finished or time.monotonic() >= deadline:
            return task
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def children_of(parent_id, of_step: str | None = None):
    """The children of `parent_id` (of its step `of_step` only, if given), in
    the order they were started (pilot_task_parent_idx)."""
    children = Task.objects.filter(parent_id=parent_id)
    if of_step is not None:
        children = children.filter(parent_step=of_step)
    return children.order_by("parent_index")


def open_children_of(parent_id, of_step: str | None = None):
    """Those of them that have not ended (pilot_task_open_child_idx)."""
    return children_of(parent_id, of_step).exclude(state__in=FINISHED_STATES)


def children_by_state(parent_id) -> dict[str, int]:
    """{state: count} of a parent's children (the task page's summary): one
    GROUP BY on pilot_task_parent_idx."""
    from django.db.models import Count

    return dict(Task.objects.filter(parent_id=parent_id).order_by().values_list("state")
                .annotate(n=Count("*")))


EXACT_COUNT_UP_TO = 10_000


def count_or_estimate(queryset, *, exact_up_to: int = EXACT_COUNT_UP_TO) -> tuple[int, bool]:
    """(rows of `queryset`, whether that is exact). Counts at most
    `exact_up_to` + 1 rows (a COUNT over a LIMIT, in the queryset's own order so
    that it walks the index the page walks); beyond that, the planner's
    estimate (PostgreSQL, no row read) — a full COUNT(*) of 10 M tasks takes a
    second, and nobody pages through "about 8.6 M" rows. Without an estimate
    (SQLite) it counts them all."""
    return counts_or_estimates([queryset], exact_up_to=exact_up_to)[0]


def counts_or_estimates(querysets, *, exact_up_to: int = EXACT_COUNT_UP_TO
                        ) -> list[tuple[int, bool]]:
    """`count_or_estimate` of each queryset, the capped counts in one query."""
    from django.core.exceptions import EmptyResultSet
    from django.db import connection

    from workflows.database import estimated_rows

    parts: list[str] = []
    params: list = []
    for queryset in querysets:
        if queryset.query.is_empty():  # `.none()`, or a filter that can match nothing
            parts.append("0")
            continue
        ordering = queryset.query.order_by or queryset.model._meta.ordering or ["-pk"]
        # The ordering's own columns: an index-only scan where the index covers them.
        columns = [str(o).lstrip("-") for o in ordering]
        capped = queryset.order_by(*ordering).values(*columns)[:exact_up_to + 1]
        try:
            sql, sql_params = capped.query.sql_with_params()
        except EmptyResultSet:  # e.g. `pk__in=[]`: nothing to count
            parts.append("0")
            continue
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS capped_{len(parts)})")
        params.extend(sql_params)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(parts)}", params)
        capped_counts = cursor.fetchone()
    answers = []
    for queryset, capped in zip(querysets, capped_counts, strict=True):
        if capped <= exact_up_to:
            answers.append((capped, True))
            continue
        estimate = estimated_rows(queryset)
        answers.append((queryset.count(), True) if estimate is None
                       else (max(estimate, exact_up_to + 1), False))
    return answers


class StateCounts(dict):
    """{state: number of tasks}; `estimated` names the states whose number is
    the planner's estimate rather than a count."""

    estimated: frozenset[str] = frozenset()


def task_counts_by_state(*, timeout_ms: int | None = None,
                         exact_up_to: int = EXACT_COUNT_UP_TO) -> StateCounts:
    """{state: number of tasks} for every state (zeros included), read without
    touching history. The unfinished states are few whatever the retention:
    one GROUP BY over their range of pilot_task_state_created_idx, exact. Each
    finished state is counted up to `exact_up_to` on the same index and
    estimated beyond (`count_or_estimate`; named in `.estimated`) — a GROUP BY
    over 10 M tasks took 1.3 s of a 2 s scrape budget. The dashboard and the
    `pilot_tasks` metric both read it. With `timeout_ms`, PostgreSQL gives up
    after that long (raising DatabaseError)."""
    import contextlib

    from django.db.models import Count

    from workflows.database import statement_time_limit
    from workflows.rules.states import FINISHED_STATES

    counts = StateCounts(dict.fromkeys(TaskState.values, 0))
    estimated: set[str] = set()
    limit = statement_time_limit(timeout_ms) if timeout_ms is not None \
        else contextlib.nullcontext()
    with limit:
        unfinished = [s for s in TaskState.values if s not in FINISHED_STATES]
        counts.update(dict(Task.objects.filter(state__in=unfinished).order_by()
                           .values_list("state").annotate(n=Count("*"))))
        finished = counts_or_estimates(
            [Task.objects.filter(state=state).order_by("-created_at")
             for state in FINISHED_STATES], exact_up_to=exact_up_to)
        for state, (n, exact) in zip(FINISHED_STATES, finished, strict=True):
            counts[state] = n
            if not exact:
                estimated.add(state)
    counts.estimated = frozenset(estimated)
    return counts


def task_backlog() -> tuple[int, float | None]:
    """(tasks waiting for a worker, epoch seconds since when the longest-waiting
    one waits, or None): pending tasks (since their enqueue) and retrying tasks
    whose backoff is over (since it ended). Two aggregates over the partial
    indexes pilot_task_pending_enq_idx and task_retry_due_idx; on PostgreSQL it
    gives up after 2 s (DatabaseError) rather than hold a scrape."""
    from django.db.models import Count, Min
    from django.db.models.functions import Now

    from workflows.database import statement_time_limit
    from workflows.rules.states import TaskState

    with statement_time_limit(2000):
        pending = Task.objects.filter(state=TaskState.PENDING).aggregate(
            n=Count("pk"), oldest=Min("enqueued_at"))
        due = Task.objects.filter(state=TaskState.RETRYING, next_attempt_at__lte=Now()).aggregate(
            n=Count("pk"), oldest=Min("next_attempt_at"))
    oldest = [t for t in (pending["oldest"], due["oldest"]) if t is not None]
    return pending["n"] + due["n"], min(oldest).timestamp() if oldest else None


def tasks_in_flight(*, worker_ids):
    """The tasks a worker among `worker_ids` ("host:pid", as the lease records
    it) holds a lease on right now, oldest claim first, each annotated with
    `current_step`: the name of its step that is running (None between steps).
    Used to say what a stop waits for; reads only."""
    from django.db.models import OuterRef, Subquery

    from workflows.models import StepCheckpoint
    from workflows.rules.states import LEASED_STATES, StepState

    running_step = StepCheckpoint.objects.filter(
        task=OuterRef("pk"), state=StepState.RUNNING).order_by("-index").values("name")[:1]
    return (Task.objects.filter(state__in=LEASED_STATES, lease_owner__in=list(worker_ids))
            .annotate(current_step=Subquery(running_step)).order_by("started_at"))


def schedules_all():
    """Every schedule with its owner, by name (the command's --list, the admin)."""
    from workflows.models import PilotSchedule

    return PilotSchedule.objects.select_related("owner").order_by("name")


def schedule_find(name: str):
    """The schedule called `name`, or None."""
    return schedules_all().filter(name=name).first() if isinstance(name, str) else None
