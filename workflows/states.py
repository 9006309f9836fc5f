"""The task and step states (SPEC §5). Pure: no database."""

from django.db import models


class TaskState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    RETRYING = "retrying", "Retrying"
    CANCELLING = "cancelling", "Cancelling"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


# A task in one of these states has ended; only these ever get `expires_at`,
# and only these may be deleted by cleanup.
FINISHED_STATES = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)
# States in which a worker holds (or held) a lease that the dispatcher watches.
LEASED_STATES = (TaskState.RUNNING, TaskState.CANCELLING)
# A re-trigger with the same payload replays these without doing anything new.
REPLAYABLE_STATES = (
    TaskState.PENDING,
    TaskState.RUNNING,
    TaskState.RETRYING,
    TaskState.SUCCEEDED,
)


class StepState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    COMPENSATED = "compensated", "Compensated"


class Source(models.TextChoices):
    API = "api", "API"
    BATCH = "batch", "Batch API"
    ADMIN = "admin", "Admin"
    CLI = "cli", "CLI"
