"""Reads, scoped to the caller (STYLE: services write, selectors read)."""

from __future__ import annotations

import uuid

from workflows.errors import TaskNotFound
from workflows.models import Task


def can_view_all(user) -> bool:
    return bool(user and user.has_perm("workflows.view_all_tasks"))


def tasks_visible_to(user):
    """Every task `user` may see: their own, or all with view_all_tasks."""
    qs = Task.objects.all()
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


def task_counts_by_state() -> dict[str, int]:
    """{state: number of tasks} for all seven states (zeros included): one
    GROUP BY over task_state_created_idx. On PostgreSQL it gives up after 2 s
    (raising DatabaseError) rather than hold a scrape on a huge table."""
    from django.db import connection, transaction
    from django.db.models import Count

    from workflows.states import TaskState

    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL statement_timeout = 2000")
        rows = Task.objects.order_by().values_list("state").annotate(n=Count("pk"))
        counts = {state: 0 for state in TaskState.values}
        counts.update(dict(rows))
    return counts
