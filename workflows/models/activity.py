"""ActivityMinute: the dashboard's activity per minute and workflow, folded
from history by the dispatcher (workflows/engine/activity.py), so the
dashboard's 24 h chart reads ~7 200 small rows instead of a day of tasks and
transitions (20 s at 10 M retained tasks, issue 34).

A row is a recount, not an increment: folding a minute again writes the same
numbers (plus rows committed since), so two dispatchers folding the same
minute agree. The row with workflow "" marks a minute as folded, even one
without activity. Rows older than the dashboard's window are deleted by the
fold; cleanup deleting tasks never changes a folded minute.
"""

from django.db import models

# The transitions counted as retries (the dashboard's "retries").
RETRY_TRANSITIONS = ("schedule_retry", "recover")


class ActivityMinute(models.Model):  # noqa: DJ008 - counters, never shown one by one
    minute = models.DateTimeField()  # UTC, second 0
    workflow = models.CharField(max_length=100)  # "": the minute's folded mark
    triggers = models.PositiveIntegerField(default=0)   # tasks created
    replays = models.PositiveIntegerField(default=0)    # duplicate triggers absorbed
    successes = models.PositiveIntegerField(default=0)  # transitions to succeeded
    failures = models.PositiveIntegerField(default=0)   # transitions to failed
    retries = models.PositiveIntegerField(default=0)    # schedule_retry and recover

    class Meta:
        constraints = [
            # One row per minute and workflow; also serves the dashboard's range on minute.
            models.UniqueConstraint(fields=["minute", "workflow"],
                                    name="activity_minute_workflow_uniq"),
        ]
