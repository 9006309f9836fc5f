"""PilotSchedule: a periodic trigger of one workflow with one payload.

Each slot of `cron` (a fire time) triggers the workflow through the engine
with the key `schedule:<name>:<slot, ISO 8601 UTC>`, owned by `owner`, so
however many schedulers run, and however often they restart, a slot makes at
most one task. `next_slot_at` is the first slot not yet handled: the scheduler
scans `enabled AND next_slot_at <= now` and moves it past what it handled.
Written only by workflows.engine.schedule_definitions and
workflows.engine.schedules.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class MissedPolicy(models.TextChoices):
    SKIP = "skip", "skip: missed slots do not run"
    RUN_ONCE = "run_once", "run_once: one run for the latest missed slot"
    CATCH_UP = "catch_up", "catch_up: every missed slot runs (at most 100)"


class ScheduleOrigin(models.TextChoices):
    OPERATOR = "operator", "operator (admin or schedule_workflow)"
    CODE = "code", "code (define_workflow(schedule=...))"


class PilotSchedule(models.Model):
    name = models.CharField(max_length=100)
    workflow = models.CharField(max_length=100)
    payload = models.JSONField(default=dict, blank=True)
    cron = models.CharField(max_length=200)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="pilot_schedules")
    missed = models.CharField(max_length=10, choices=MissedPolicy.choices,
                              default=MissedPolicy.SKIP)
    enabled = models.BooleanField(default=True)
    origin = models.CharField(max_length=10, choices=ScheduleOrigin.choices,
                              default=ScheduleOrigin.OPERATOR)
    next_slot_at = models.DateTimeField(null=True, blank=True)
    last_fired_slot = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_task_id = models.UUIDField(null=True, blank=True)
    fired_count = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_error_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "schedule"
        # In the console, without it a schedule runs as the scheduler user and
        # one that runs as anybody else is read-only (docs/schedules.md,
        # "Owners"): its runs would be that client's own tasks, its webhooks
        # signed with that client's secret.
        permissions = [("schedule_as_owner",
                        "Can create or change a schedule that runs as another user")]
        ordering = ["name"]
        constraints = [
            # One schedule per name: the name is part of every key it fires.
            models.UniqueConstraint(fields=["name"], name="schedule_name_uniq"),
            models.CheckConstraint(condition=Q(missed__in=MissedPolicy.values),
                                   name="schedule_missed_valid_chk"),
            models.CheckConstraint(condition=Q(origin__in=ScheduleOrigin.values),
                                   name="schedule_origin_valid_chk"),
        ]
        indexes = [
            # The scheduler's scan: enabled AND next_slot_at <= now, oldest first;
            # and min(next_slot_at) for how long it may sleep.
            models.Index(fields=["next_slot_at"], name="pilot_schedule_due_idx",
                         condition=Q(enabled=True)),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.workflow}, {self.cron})"

    @property
    def declared_in_code(self) -> bool:
        return self.origin == ScheduleOrigin.CODE
