"""Deleting finished tasks with their steps and history."""

from __future__ import annotations

from workflows.models import StepCheckpoint, Task, TaskReplay, TaskTransition


def tasks_delete(task_ids: list) -> int:
    """Delete the tasks and everything hanging off them, children first, in the
    caller's transaction. Returns the number of tasks deleted. The caller
    decides which ids are safe to delete (finished ones, under a lock)."""
    if not task_ids:
        return 0
    StepCheckpoint.objects.filter(task_id__in=task_ids)._raw_delete(StepCheckpoint.objects.db)
    TaskTransition.objects.filter(task_id__in=task_ids)._raw_delete(TaskTransition.objects.db)
    TaskReplay.objects.filter(task_id__in=task_ids)._raw_delete(TaskReplay.objects.db)
    return Task.objects.filter(pk__in=task_ids)._raw_delete(Task.objects.db)
