"""TaskTransition: the audit trail, one row per state change (docs/design.md,
"Data model").

Written in the same transaction as the change it records, so the history can
never claim a change that rolled back, nor miss one that committed.
"""

from django.db import models
from django.utils import timezone


class TaskTransition(models.Model):
    # Indexed through pilot_transition_task_at_idx.
    task = models.ForeignKey("workflows.Task", on_delete=models.CASCADE,
                             related_name="transitions", db_index=False)
    transition = models.CharField(max_length=30)
    from_state = models.CharField(max_length=20)
    to_state = models.CharField(max_length=20)
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["task", "at", "id"]
        indexes = [
            # A task's history, oldest first (admin inline, API).
            models.Index(fields=["task", "at"], name="pilot_transition_task_at_idx"),
            # Dashboard: transitions per hour over the last 24 hours.
            models.Index(fields=["at"], name="pilot_transition_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.transition}: {self.from_state} -> {self.to_state} by {self.actor}"
