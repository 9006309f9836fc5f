"""TaskReplay: when duplicate triggers were absorbed (for the dashboard).

This append-only log is the record of replays: `Task.replays` and
`Task.last_replayed_at` are read from it, and the operator console charts
duplicates absorbed per hour. One row per trigger call that replayed (a batch
that repeats a key n times writes one row with count n). Append-only, so a
replay storm on one key never writes the task row its worker fences on, and
concurrent replays never contend on a row; cleanup deletes the rows with their
task.
"""

from django.db import models
from django.utils import timezone


class TaskReplay(models.Model):  # noqa: DJ008 - log rows, never shown one by one
    # Indexed: cleanup deletes a task's rows by task_id.
    task = models.ForeignKey("workflows.Task", on_delete=models.CASCADE, related_name="+")
    workflow = models.CharField(max_length=100)
    count = models.PositiveIntegerField(default=1)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # Dashboard: duplicates absorbed per hour over the last 24 hours.
            models.Index(fields=["at"], name="pilot_replay_at_idx"),
        ]
