"""Signals: what a waiting task waits for, sent by a partner, an operator or a
command (docs/waiting.md). The API, the console and `signal_task` all come here.

One short transaction on the task's locked row — the row a wait's decision
holds too (run/waiting.py), so the two serialize:

    authorise (the task's owner, or anyone who may see every task; both need
      `workflows.signal_task`) — a caller that may not even see the task gets
      TaskNotFound
    the key already used on this task: the same name and payload → the stored
      signal again (a replay, even once the task finished); another → refused
    a finished task → TaskFinished: nothing will ever wait for it
    store the signal (a mailbox: kept until a wait of its name consumes it)
    the task waits for this very name → `wake` (→ pending, enqueued on commit)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import transaction

from workflows.engine import faults
from workflows.engine.announce import announce, move
from workflows.engine.audit import actor_for
from workflows.engine.enqueue import enqueue_on_commit
from workflows.engine.store import store
from workflows.engine.triggers import payload_validate
from workflows.models import Task, TaskSignal
from workflows.observability.events import Event, emit_on_commit
from workflows.registry import STEP_NAME_RE
from workflows.rules.errors import (
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    PermissionDenied,
    TaskFinished,
    TaskNotFound,
    ValidationFailed,
)
from workflows.rules.fingerprint import canonical_json, fingerprint_of
from workflows.rules.keys import normalize_key
from workflows.rules.states import TaskState
from workflows.selectors import can_view_all

SIGNAL_PERMISSION = "workflows.signal_task"


@dataclasses.dataclass(frozen=True)
class SignalOutcome:
    signal: TaskSignal
    task: Task
    replayed: bool
    woke: bool = False

    @property
    def http_status(self) -> int:
        return 200 if self.replayed else 202


def signal_name_validate(name: Any) -> str:
    if not isinstance(name, str) or not STEP_NAME_RE.match(name):
        raise ValidationFailed("The signal name must be 1-100 letters, digits, '_' or '-' "
                               "(starting with a letter or '_')",
                               errors={"name": ["1-100 of A-Z a-z 0-9 _ -, not starting "
                                                "with a digit or '-'."]})
    return name


def _authorise(user: Any, task: Task) -> None:
    if not (task.owner_id == user.pk or can_view_all(user)):
        raise TaskNotFound("No such task")
    if not user.has_perm(SIGNAL_PERMISSION):
        raise PermissionDenied("You may not signal this task")


def task_signal(*, task_id: Any, name: str, payload: Any = None, key: Any, user: Any,
                actor: str | None = None) -> SignalOutcome:
    """Send signal `name` with `payload` (default {}) to the task, idempotently
    under `key`, as `actor` (its audit name; default: `user`'s). `user` is
    authorised as above; None is a trusted caller in this process (the
    `signal_task` command run by whoever runs the machine, an author's tests).
    Raises ValidationFailed, IdempotencyKeyMissing/Invalid, PayloadTooLarge,
    TaskNotFound, PermissionDenied, IdempotencyKeyReused, TaskFinished."""
    name = signal_name_validate(name)
    actor = actor or actor_for(user)
    payload = {} if payload is None else payload
    if key is None:
        raise IdempotencyKeyMissing("A signal needs an Idempotency-Key")
    key = normalize_key(key)
    payload_validate(payload)
    fingerprint = fingerprint_of(canonical_json({"signal": name, "payload": payload}))
    with transaction.atomic():
        task = store().lock_task_in_tx(task_id)
        if task is None:
            raise TaskNotFound("No such task")
        if user is not None:
            _authorise(user, task)
        sent = store().signals.by_key_in_tx(task.pk, key)
        if sent is not None:
            if sent.fingerprint != fingerprint:
                raise IdempotencyKeyReused(
                    "This Idempotency-Key was used on this task for another signal")
            return SignalOutcome(sent, task, replayed=True)
        if task.is_finished:
            raise TaskFinished(f"The task is {task.state}: nothing will wait for a signal")
        now = task.pilot_db_now
        signal = store().signals.insert_in_tx(task_id=task.pk, name=name, key=key,
                                              fingerprint=fingerprint, payload=payload,
                                              actor=actor, at=now)
        awaited = task.waits_for or {}
        woke = awaited.get("kind") == "signal" and awaited.get("name") == name
        if woke:
            move(task, "wake", at=now, actor=actor, reason=f"signal {name!r} received",
                 now=now, set_fields={"enqueued_at": now})
            enqueue_on_commit([task.pk])
            emit_on_commit(Event.TASK_WOKEN, task_id=str(task.pk), workflow=task.workflow,
                           attempt=task.attempts, kind="signal", actor=actor,
                           trace_id=task.trace_id or None)
        emit_on_commit(Event.SIGNAL_RECEIVED, task_id=str(task.pk), workflow=task.workflow,
                       attempt=task.attempts, name=name, actor=actor, woke=woke,
                       trace_id=task.trace_id or None)
    return SignalOutcome(signal, task, replayed=False, woke=woke)


def tasks_wake_due(tasks: list[Task], *, now: Any, actor: str) -> None:
    """Wake `tasks` — waiting, each timer or timeout due at `now` (a database
    time), locked by the caller (the dispatcher) — in one write for the batch
    (store.transition_locked_in_tx), and enqueue them in one message push on
    commit: 10 000 timers due in one second cost a statement or two per batch."""
    for task in tasks:
        assert task.state == TaskState.WAITING
    kinds = {task.pk: (task.waiting_for or {}).get("kind", "timer") for task in tasks}
    reasons = {kind: "its timer is due" if kind == "timer" else "its wait timed out"
               for kind in set(kinds.values())}
    for reason in reasons.values():
        group = [task for task in tasks if reasons[kinds[task.pk]] == reason]
        for fact in store().transition_locked_in_tx(
                group, "wake", at=now, actor=actor, reason=reason, now=now,
                set_fields={"enqueued_at": now}):
            announce(fact)
    faults.fault_point("before_wake")
    enqueue_on_commit([task.pk for task in tasks])
    for task in tasks:
        emit_on_commit(Event.TASK_WOKEN, task_id=str(task.pk), workflow=task.workflow,
                       attempt=task.attempts, kind=kinds[task.pk], actor=actor,
                       trace_id=task.trace_id or None)


__all__ = ["SIGNAL_PERMISSION", "SignalOutcome", "signal_name_validate", "task_signal",
           "tasks_wake_due"]
