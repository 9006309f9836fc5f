"""Acting on what the store did (docs/design.md, "The store"): a transition's
event, and the webhook message its ending owes, each once, on commit.

The store persists a transition and returns the fact (`Moved`; a claim's is
`Claimed.moved`); whoever asked for it announces it here — the held attempt,
the driver's claims, the dispatcher, the operators' verbs. On commit: a
transaction rolled back announces nothing, and nothing is sent about a change
the database does not have."""

from __future__ import annotations

from typing import Any

from workflows.engine.children import settle_on_commit
from workflows.engine.enqueue import deliveries_enqueue_on_commit
from workflows.engine.store import store
from workflows.engine.store.orm import Claimed, Moved
from workflows.models import Task
from workflows.observability.events import Event, emit_on_commit
from workflows.rules.states import FINISHED_STATES


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


__all__ = ["announce", "move"]
