"""The tables of the demo workflows (docs/design.md, "Demo workflows").

Deliberately without unique constraints: a double effect (a step or a
compensation that ran twice) is visible as an extra row, which is how the
tests prove exactly-once.
"""

from django.db import models
from django.utils import timezone


class DemoOrder(models.Model):
    """The rows `demo.sync_orders` writes: (batch, n) for n < count."""

    batch = models.CharField(max_length=100)
    n = models.IntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # Counting a batch's rows: WHERE batch = ?.
            models.Index(fields=["batch"], name="pilot_demoorder_batch_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.batch}#{self.n}"


class DemoLedger(models.Model):
    """One row per effect of `demo.saga` and `demo.crash`: the action (reserve,
    charge, confirm, release, refund, prepare, unprepare) and the task it
    belongs to."""

    task = models.UUIDField()
    action = models.CharField(max_length=30)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # A task's effects: WHERE task = ?; cleanup deletes them with the task.
            models.Index(fields=["task"], name="pilot_demoledger_task_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task}:{self.action}"
