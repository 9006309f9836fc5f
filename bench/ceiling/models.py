"""Rows the baselines write, shaped like the PILOT rows they stand for."""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


class BareTask(models.Model):
    """What the ceiling endpoint inserts: one row like a Task (UUID key, owner,
    idempotency key unique per owner, workflow, JSON payload, timestamps)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="+", db_index=False)
    idempotency_key = models.CharField(max_length=255)
    workflow = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=20, default="pending")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # The same arbiter as task_owner_key_uniq: the insert pays for it too.
            models.UniqueConstraint(fields=["owner", "idempotency_key"],
                                    name="baretask_owner_key_uniq"),
        ]


class BareStep(models.Model):
    """What the raw django-q2 task writes, three per run: one row like a
    StepCheckpoint per step."""

    run = models.CharField(max_length=64)
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=100)
    state = models.CharField(max_length=20)
    output = models.JSONField(null=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="barestep_run_index_uniq"),
        ]
