"""The store's verbs for signals (docs/design.md, "The store"; docs/waiting.md).

A signal is written under its task's row lock, which the sender takes
(`OrmStore.lock_task_in_tx`) and a wait's decision holds too (its fence): the
two serialize on the task, so a signal either lands before the wait looks —
and is consumed — or after the park committed — and wakes it. Nothing here
emits an event: the callers do, on commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from workflows.database import in_callers_transaction
from workflows.models import TaskSignal


class SignalStore:
    @in_callers_transaction
    def by_key_in_tx(self, task_id: Any, key: str) -> TaskSignal | None:
        """The task's signal sent with `key`, if any (the caller holds the task)."""
        return TaskSignal.objects.filter(task_id=task_id, idempotency_key=key).first()

    @in_callers_transaction
    def insert_in_tx(self, *, task_id: Any, name: str, key: str, fingerprint: str,
                     payload: Any, actor: str, at: datetime) -> TaskSignal:
        """Store a signal, unconsumed, received at `at` (a database time); the
        caller holds the task's row lock and checked the key is new."""
        return TaskSignal.objects.create(task_id=task_id, name=name, idempotency_key=key,
                                         fingerprint=fingerprint, payload=payload,
                                         actor=actor[:200], received_at=at)

    @in_callers_transaction
    def consume_in_tx(self, task_id: Any, name: str, *, step: int,
                      at: datetime) -> TaskSignal | None:
        """Mark the task's oldest unconsumed signal called `name` consumed by
        wait step `step` at `at`, and return it; None when the mailbox holds
        none. The caller holds the task's row under its fence, in the
        transaction that records the step."""
        signal = (TaskSignal.objects.filter(task_id=task_id, name=name, consumed_at__isnull=True)
                  .order_by("id").first())
        if signal is None:
            return None
        TaskSignal.objects.filter(pk=signal.pk, consumed_at__isnull=True).update(
            consumed_at=at, consumed_step=step)
        signal.consumed_at, signal.consumed_step = at, step
        return signal

    @staticmethod
    def of_task(task_id: Any) -> list[TaskSignal]:
        """The task's signals, oldest first (reads only)."""
        return list(TaskSignal.objects.filter(task_id=task_id).order_by("id"))
