"""Build tasks in any state the way the engine would: through transitions."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from workflows.engine.audit import transition_apply
from workflows.fingerprint import fingerprint
from workflows.models import Task
from workflows.states import TaskState as S

TTL = timedelta(hours=24)

# How to reach each state from pending.
PATHS = {
    S.PENDING: [],
    S.RUNNING: ["claim"],
    S.RETRYING: ["claim", "schedule_retry"],
    S.SUCCEEDED: ["claim", "succeed"],
    S.FAILED: ["claim", "fail"],
    S.CANCELLING: ["claim", "cancel"],
    S.CANCELLED: ["cancel"],
}


def transition_kwargs(name: str, task: Task | None = None) -> dict:
    now = timezone.now()
    return {
        "claim": {"worker": "test-worker", "lease_expires_at": now + timedelta(seconds=60),
                  "now": now},
        "succeed": {"result": {"ok": True}, "now": now, "ttl": TTL},
        "schedule_retry": {"error": "boom", "error_type": "RetryableError",
                           "next_attempt_at": now},
        "recover": {"next_attempt_at": now},
        "fail": {"error": "boom", "error_type": "NonRetryableError", "now": now, "ttl": TTL},
        "cancel": {"needs_compensation": False, "now": now, "ttl": TTL},
        "finish_cancel": {"now": now, "ttl": TTL},
        "retry": {"budget": 3},
    }[name]


def make_task(owner, *, state=S.PENDING, workflow="demo.echo", payload=None, key=None,
              max_attempts=3) -> Task:
    payload = {"n": 1} if payload is None else payload
    now = timezone.now()
    with transaction.atomic():
        task = Task.objects.create(
            owner=owner, idempotency_key=key or uuid.uuid4().hex, workflow=workflow,
            payload=payload, fingerprint=fingerprint(workflow, payload),
            max_attempts=max_attempts, created_at=now, updated_at=now, enqueued_at=now)
        for name in PATHS[state]:
            transition_apply(task, name, actor="test", **transition_kwargs(name, task))
    assert task.state == state
    return task
