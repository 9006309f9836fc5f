"""The task and step states (docs/design.md, "State machine"). Pure: no database."""

from django.db import models


class TaskState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    RETRYING = "retrying", "Retrying"
    WAITING = "waiting", "Waiting"
    CANCELLING = "cancelling", "Cancelling"
    COMPENSATING = "compensating", "Compensating"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


# A task in one of these states has ended; only these ever get `expires_at`,
# and only these may be deleted by cleanup.
FINISHED_STATES = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)
# The compensation phase: a worker claims a task in one of these (under a new
# token) to run the compensations of its succeeded steps, then ends it
# (`fail` from compensating, `finish_cancel` from cancelling).
COMPENSATION_STATES = (TaskState.COMPENSATING, TaskState.CANCELLING)
# States in which a worker holds (or held) a lease that the dispatcher watches.
LEASED_STATES = (TaskState.RUNNING, *COMPENSATION_STATES)
# Parked on a durable timer, a signal or its children (docs/waiting.md): no
# worker and no lease hold it, and nothing claims it before `wake` (→ pending).
WAITING_STATES = (TaskState.WAITING,)
# A re-trigger with the same payload replays these without doing anything new.
REPLAYABLE_STATES = (
    TaskState.PENDING,
    TaskState.RUNNING,
    TaskState.RETRYING,
    TaskState.WAITING,
    TaskState.COMPENSATING,
    TaskState.SUCCEEDED,
)


class StepState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    COMPENSATING = "compensating", "Compensating"
    COMPENSATED = "compensated", "Compensated"
    COMPENSATION_FAILED = "compensation_failed", "Compensation failed"


# A step checkpoint may only move forward. For each state a write sets, the
# states it may overwrite (a missing row may always be written). Nothing a
# worker writes overwrites a `succeeded` step except its compensation, and
# nothing overwrites a finished compensation: a succeeded checkpoint is never
# downgraded (an ambiguous commit, a stale retry) and a compensation, once
# recorded, never runs again. Only `retry` resets steps, under the task's lock.
STEP_OVERWRITES: dict[str, tuple[str, ...]] = {
    StepState.RUNNING: (StepState.PENDING, StepState.RUNNING, StepState.FAILED),
    StepState.SUCCEEDED: (StepState.PENDING, StepState.RUNNING, StepState.FAILED),
    StepState.FAILED: (StepState.PENDING, StepState.RUNNING, StepState.FAILED),
    StepState.COMPENSATING: (StepState.SUCCEEDED, StepState.COMPENSATING),
    StepState.COMPENSATED: (StepState.SUCCEEDED, StepState.COMPENSATING),
    StepState.COMPENSATION_FAILED: (StepState.SUCCEEDED, StepState.COMPENSATING),
}
# Steps whose compensation is still owed (if the step has one).
TO_COMPENSATE = (StepState.SUCCEEDED, StepState.COMPENSATING)


class Source(models.TextChoices):
    API = "api", "API"
    BATCH = "batch", "Batch API"
    ADMIN = "admin", "Admin"
    CLI = "cli", "CLI"
    SCHEDULE = "schedule", "Schedule"
    TASKS = "tasks", "Django tasks"  # enqueued through workflows/django_tasks.py
    CHILD = "child", "Child"  # started by a parent's step (ctx.start_children)
