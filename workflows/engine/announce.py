"""Acting on what the store did (docs/design.md, "The store"): a transition's
event, the webhook message its ending owes and — a child's ending — the
settle of its parent (engine/children.py), each once, on commit.

The store persists a transition and returns the fact (`Moved`; a claim's is
`Claimed.moved`); whoever asked for it announces it here — the held attempt,
the driver's claims, the dispatcher, the operators' verbs. On commit: a
transaction rolled back announces nothing, and nothing is sent about a change
the database does not have."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from workflows.engine.enqueue import deliveries_enqueue_on_commit, enqueue_on_commit
from workflows.engine.store import store
from workflows.engine.store.orm import Claimed, Moved
from workflows.models import Task
from workflows.observability.events import Event, emit, emit_on_commit
from workflows.rules.states import FINISHED_STATES
from workflows.selectors import open_children_of


def announce(fact: Moved | Claimed | None) -> None:
    """Emit `task_transitioned` for `fact` (a transition, or a claim's own),
    enqueue the delivery its ending owes and, for a child's ending, settle its
    parent (engine/children.py); then the same for the claim the same
    commit made (`following`). None (nothing happened, or a claim adopted after
    a lost reply, whose commit another process saw) does nothing."""
    move = fact.moved if isinstance(fact, Claimed) else fact
    if move is None:
        return
    if move.delivery is not None:
        deliveries_enqueue_on_commit([move.delivery])
    if move.parent_id is not None and move.to_state in FINISHED_STATES:
        settle_on_commit(move.parent_id, move.actor, step=move.parent_step)
    emit_on_commit(Event.TASK_TRANSITIONED, task_id=str(move.task_id), workflow=move.workflow,
                   transition=move.transition, from_state=move.from_state,
                   to_state=move.to_state, attempt=move.attempt, actor=move.actor,
                   trace_id=move.trace_id)
    announce(move.following)


def move(task: Task, name: str, **kwargs: Any) -> Moved:
    """The store's `transition` of `task` by `name` (its arguments as there),
    announced: for a caller that holds the task's row (the dispatcher, the
    operators' verbs). A worker's transitions go through its held attempt
    (run/held.py), which announces them the same way."""
    fact = store().transition(task, name, **kwargs)
    announce(fact)
    return fact


def settle_on_commit(parent_id: Any, actor: str, *, step: str | None = None) -> None:
    """After the current transaction commits, settle the parent of a child of
    its step `step` that ended (engine/children.py). A failure is logged, not
    raised — the child's ending stands — and the dispatcher's pass
    (children.parents_settle_due) wakes the parent instead."""

    def settle() -> None:
        try:
            parent_settle(parent_id, actor=actor, step=step)
        except Exception as exc:  # noqa: BLE001 - the dispatcher's pass is the fallback
            emit(Event.DISPATCHER_ERROR, level=logging.WARNING, task_id=str(parent_id),
                 error=f"settling a parent: {type(exc).__name__}: {exc}"[:300])

    transaction.on_commit(settle)


def parent_settle(parent_id: Any, *, actor: str, step: str | None = None) -> bool:
    """A child of `parent_id`'s step `step` ended (committed): wake the parent
    if that was the last one it waits for. Its own short transaction — but
    first, without a lock, one look at the child's siblings: one still open
    means this was not the last ending a wait could care for (whether the
    wait is for every child or for that step's), so nothing is locked. The
    sibling that ends last looks after every other ending committed — each
    looks after its own commit — and goes on to the locked check."""
    if step is not None and open_children_of(parent_id, step).exists():
        return False
    with transaction.atomic():
        parent = store().lock_task_in_tx(parent_id)
        return parent is not None and parent_settle_in_tx(parent, actor=actor)


def parent_settle_in_tx(parent: Task, *, actor: str) -> bool:
    """Wake `parent` — locked by the caller, read with the database's time —
    if it waits for children none of which is still open. True if it woke."""
    awaited = parent.waits_for or {}
    if awaited.get("kind") != "children":
        return False
    if open_children_of(parent.pk, awaited.get("of_step")).exists():
        return False
    now = parent.pilot_db_now
    move(parent, "wake", at=now, actor=actor, reason="its children have all ended", now=now,
         set_fields={"enqueued_at": now})
    enqueue_on_commit([parent.pk])
    emit_on_commit(Event.TASK_WOKEN, task_id=str(parent.pk), workflow=parent.workflow,
                   attempt=parent.attempts, kind="children", actor=actor,
                   trace_id=parent.trace_id or None)
    return True


__all__ = ["announce", "move", "parent_settle", "parent_settle_in_tx", "settle_on_commit"]
