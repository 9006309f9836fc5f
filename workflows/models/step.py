"""StepCheckpoint: the durable record of one step of one task (docs/design.md).

Written only by the worker holding the task's current lease token (the store
fences every write on it), so a worker that lost the task can never record a
step. A `succeeded` row is the memo a resumed run skips and whose `output`
later steps read; it is never downgraded (states.STEP_OVERWRITES). Its
compensation moves it `succeeded → compensating → compensated |
compensation_failed`, each move recorded before the next, so a compensation
once recorded never runs again and one whose worker died is counted
(`compensation_attempts`) and capped.
"""

from django.db import models
from django.db.models import Q

from workflows.rules.states import StepState


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
    # Written with the step's success: does the plan name a compensation for it?
    # Lets the dispatcher, cancel and the console know what is left to undo
    # without running workflow code.
    compensable = models.BooleanField(default=False)
    # Times its compensation was started (counted before the body runs, so a
    # compensation that kills its worker is capped at the workflow's max_attempts).
    compensation_attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    # The failed attempts of this step, oldest first, the last FAILURES_KEPT:
    # [{"attempt", "at", "type", "message", "traceback"}], written with the
    # failure itself (engine/failures.py). NULL on rows the raw upsert made
    # before any failure: read it as [].
    failures = models.JSONField(null=True, blank=True, default=list)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["task", "index"]
        constraints = [
            # One checkpoint per step position; the runner upserts on it.
            models.UniqueConstraint(fields=["task", "index"], name="step_task_index_uniq"),
            models.CheckConstraint(condition=Q(state__in=StepState.values),
                                   name="step_state_valid_chk"),
        ]

    def __str__(self) -> str:
        return f"{self.index}:{self.name} ({self.state})"
