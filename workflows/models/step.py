"""StepCheckpoint: the durable record of one step of one task (SPEC §4, §7).

Written only by the runner, under the task's fence (the worker's lease token),
so a worker that lost its lease can never record a step. A `succeeded` row is
the memo a resumed run skips and whose `output` later steps read.
"""

from django.db import models

from workflows.states import StepState


class StepCheckpoint(models.Model):
    # Indexed through step_task_index_uniq (task_id is its first column).
    task = models.ForeignKey("workflows.Task", on_delete=models.CASCADE, related_name="steps",
                             db_index=False)
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=100)
    state = models.CharField(max_length=20, choices=StepState.choices,
                             default=StepState.PENDING)
    output = models.JSONField(null=True, blank=True)
    # What a step saved about itself mid-way (a cursor); a resumed attempt reads it.
    progress = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["task", "index"]
        constraints = [
            # One checkpoint per step position; the runner upserts on it.
            models.UniqueConstraint(fields=["task", "index"], name="step_task_index_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.index}:{self.name} ({self.state})"
