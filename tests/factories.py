"""Build tasks in any state the way the engine would: through transitions."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from workflows.engine.store import store
from workflows.models import Task
from workflows.rules.fingerprint import fingerprint
from workflows.rules.states import TaskState as S

TTL = timedelta(hours=24)

# How to reach each state from pending.
PATHS = {
    S.PENDING: [],
    S.RUNNING: ["claim"],
    S.RETRYING: ["claim", "schedule_retry"],
    S.SUCCEEDED: ["claim", "succeed"],
    S.FAILED: ["claim", "fail"],
    S.CANCELLING: ["claim", "cancel"],
    S.COMPENSATING: ["claim", "compensate"],
    S.CANCELLED: ["cancel"],
    S.WAITING: ["claim", "park"],
}


def transition_kwargs(name: str, task: Task | None = None) -> dict:
    now = timezone.now()
    return {
        "claim": {"worker": "test-worker", "now": now, "lease": timedelta(seconds=60)},
        "resume": {"worker": "test-worker", "now": now, "lease": timedelta(seconds=60)},
        "compensate": {"error": "boom", "error_type": "NonRetryableError"},
        "defer": {"next_attempt_at": now},
        "succeed": {"result": {"ok": True}, "now": now},
        "schedule_retry": {"error": "boom", "error_type": "RetryableError",
                           "next_attempt_at": now},
        "recover": {"next_attempt_at": now},
        "fail": {"error": "boom", "error_type": "NonRetryableError", "now": now},
        "cancel": {"needs_compensation": False, "now": now},
        "finish_cancel": {"now": now},
        "retry": {"budget": 3, "now": now},
        "park": {"waiting_for": {"kind": "signal", "step": 0, "name": "go", "until": None},
                 "until": None},
        "wake": {"now": now},
        "release": {"now": now},
    }[name]


def make_task(owner, *, state=S.PENDING, workflow="demo.echo", payload=None, key=None,
              max_attempts=3, callback_url="", ttl: timedelta = TTL) -> Task:
    payload = {"n": 1} if payload is None else payload
    now = timezone.now()
    with transaction.atomic():
        task = Task.objects.create(
            owner=owner, idempotency_key=key or uuid.uuid4().hex, workflow=workflow,
            payload=payload, fingerprint=fingerprint(workflow, payload),
            max_attempts=max_attempts, created_at=now, updated_at=now, enqueued_at=now,
            next_attempt_at=now, callback_url=callback_url, idempotency_ttl=ttl)
        for name in PATHS[state]:
            store().transition(task, name, at=now, actor="test", **transition_kwargs(name, task))
    assert task.state == state
    return task


ENDING = {S.SUCCEEDED: "succeed", S.FAILED: "fail", S.CANCELLED: "finish_cancel"}


def make_finished_tasks(owner, n: int, *, finished_ago: timedelta = timedelta(days=2),
                        ttl: timedelta = TTL, state=S.SUCCEEDED, workflow="demo.echo",
                        key_prefix: str = "old", batch: int = 2000) -> list:
    """Insert `n` finished tasks fast (bulk, as the engine would have left them:
    one succeeded step, its claim and finish transitions, a replay row) that
    finished `finished_ago` and expire `ttl` after that. Returns their ids.
    For cleanup tests and benchmarks, where going through transitions one task
    at a time would take minutes."""
    from workflows.models import StepCheckpoint, TaskReplay, TaskTransition
    from workflows.rules.states import StepState

    assert state in (S.SUCCEEDED, S.FAILED, S.CANCELLED)
    finished = timezone.now() - finished_ago
    payload = {"n": 1}
    fp = fingerprint(workflow, payload)
    ids = []
    for start in range(0, n, batch):
        tasks = [Task(owner=owner, idempotency_key=f"{key_prefix}-{i}", workflow=workflow,
                      payload=payload, fingerprint=fp, state=state, result={"ok": True},
                      attempts=1, max_attempts=3, lease_token=1, created_at=finished,
                      updated_at=finished, started_at=finished, finished_at=finished,
                      idempotency_ttl=ttl, expires_at=finished + ttl)
                 for i in range(start, min(n, start + batch))]
        Task.objects.bulk_create(tasks)
        StepCheckpoint.objects.bulk_create(
            [StepCheckpoint(task=t, index=0, name="echo", state=StepState.SUCCEEDED,
                            output={"ok": True}, attempts=1, started_at=finished,
                            finished_at=finished) for t in tasks])
        TaskTransition.objects.bulk_create(
            [TaskTransition(task=t, transition=name, from_state=a, to_state=b,
                            actor="factory", at=finished)
             for t in tasks for name, a, b in (("claim", S.PENDING, S.RUNNING),
                                               (ENDING[state], S.RUNNING, state))])
        TaskReplay.objects.bulk_create([TaskReplay(task=t, workflow=workflow, at=finished)
                                        for t in tasks])
        ids.extend(t.pk for t in tasks)
    return ids
