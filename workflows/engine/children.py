"""Child tasks (docs/writing-workflows.md, "Children"; docs/design.md).

A step starts children through the idempotent trigger, as the parent's owner,
each under a key derived from the parent, the step and a per-child suffix —
so a step run again after a crash finds the children it started and starts
no child twice. A children wait parks the parent until they have all ended.

    start (the parent's worker, `Held.start_children`): one transaction that
      holds the parent's row under its fence — a stale worker starts nothing —,
      triggers the children in batches of the batch trigger (a statement or
      two per batch of up to MAX_BATCH), and counts the new ones on the parent
    look (the wait phase, run/waiting.py): in one transaction holding the
      parent's row, read its children: one still open → `park`; all ended →
      the step's output, or ChildFailed
    settle (a child's ending, on its commit — engine/announce.py — and the
      dispatcher's pass for any ending whose settle was lost): a sibling
      still open → nothing (no lock); else lock the parent; waiting for
      children none of which is still open → `wake`

The look and the settle lock the same row, so a child that ends while its
parent parks is seen by one of them: either the look reads it ended, or the
settle runs after the park committed and wakes it. Two last children ending
at once settle one after the other; the second finds the parent woken.

Cancelling a parent cancels its children that have not ended
(`children_cancel_in_tx`, in the cancel's transaction, their own children
too). A parent that fails leaves its children to end by themselves: a retry
of the parent finds them as they ended.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet

from workflows.engine.store import store
from workflows.models import Task
from workflows.observability.events import Event, emit, emit_on_commit
from workflows.rules.errors import ValidationFailed
from workflows.rules.keys import MAX_KEY_LENGTH
from workflows.rules.states import FINISHED_STATES, TaskState

# Children one task may start in all (over every step and attempt).
MAX_CHILDREN = 10_000
# How deep a cancel follows children of children.
MAX_CANCEL_DEPTH = 20

_SUFFIX_CHARS = frozenset(chr(c) for c in range(0x21, 0x7f))


def child_key(parent_id: Any, step: str, suffix: str) -> str:
    """The idempotency key of the child `suffix` of the parent's step `step`."""
    key = f"child:{parent_id}:{step}:{suffix}"
    if not suffix or not set(suffix) <= _SUFFIX_CHARS or len(key) > MAX_KEY_LENGTH:
        raise ValidationFailed(
            f"A child's suffix must be 1-{MAX_KEY_LENGTH - len(key) + len(suffix)} printable "
            f"ASCII characters without spaces, not {suffix!r}",
            errors={"suffix": ["Printable ASCII, no spaces, short enough for the key."]})
    return key


def _open(children: QuerySet[Task]) -> QuerySet[Task]:
    return children.exclude(state__in=FINISHED_STATES)


def children_of(parent_id: Any, of_step: str | None = None) -> QuerySet[Task]:
    """The children of `parent_id` (of step `of_step` only, if given), in the
    order they were started."""
    children = Task.objects.filter(parent_id=parent_id)
    if of_step is not None:
        children = children.filter(parent_step=of_step)
    return children.order_by("parent_index")


def parent_settle_in_tx(parent: Task, *, actor: str) -> bool:
    """Wake `parent` — locked by the caller, read with the database's time —
    if it waits for children none of which is still open. True if it woke."""
    from workflows.engine.announce import move
    from workflows.engine.enqueue import enqueue_on_commit

    awaited = parent.waits_for or {}
    if awaited.get("kind") != "children":
        return False
    if _open(children_of(parent.pk, awaited.get("of_step"))).exists():
        return False
    now = parent.pilot_db_now
    move(parent, "wake", at=now, actor=actor, reason="its children have all ended", now=now,
         set_fields={"enqueued_at": now})
    enqueue_on_commit([parent.pk])
    emit_on_commit(Event.TASK_WOKEN, task_id=str(parent.pk), workflow=parent.workflow,
                   attempt=parent.attempts, kind="children", actor=actor,
                   trace_id=parent.trace_id or None)
    return True


def parent_settle(parent_id: Any, *, actor: str, step: str | None = None) -> bool:
    """A child of `parent_id`'s step `step` ended (committed): wake the parent
    if that was the last one it waits for. Its own short transaction — but
    first, without a lock, one look at the child's siblings: one still open
    means this was not the last ending a wait could care for (whether the
    wait is for every child or for that step's), so nothing is locked. The
    sibling that ends last looks after every other ending committed — each
    looks after its own commit — and goes on to the locked check."""
    if step is not None and _open(children_of(parent_id, step)).exists():
        return False
    with transaction.atomic():
        parent = store().lock_task_in_tx(parent_id)
        return parent is not None and parent_settle_in_tx(parent, actor=actor)


def settle_on_commit(parent_id: Any, actor: str, *, step: str | None = None) -> None:
    """After the current transaction commits, settle `parent_id`. A failure is
    logged, not raised — the child's ending stands — and the dispatcher's pass
    (`parents_settle_due`) wakes the parent instead."""

    def settle() -> None:
        try:
            parent_settle(parent_id, actor=actor, step=step)
        except Exception as exc:  # noqa: BLE001 - the dispatcher's pass is the fallback
            emit(Event.DISPATCHER_ERROR, level=logging.WARNING, task_id=str(parent_id),
                 error=f"settling a parent: {type(exc).__name__}: {exc}"[:300])

    transaction.on_commit(settle)


def parents_settle_due(*, batch: int, actor: str) -> tuple[int, bool]:
    """The dispatcher's pass: parents waiting for children of which none is
    still open (a settle lost with its process), woken. Returns (woken, full)."""
    open_child = _open(Task.objects.filter(parent_id=OuterRef("pk")))
    due = (Task.objects.filter(state=TaskState.WAITING, waiting_for__kind="children")
           .exclude(Exists(open_child)))
    if not due.exists():  # the idle pass: one small query
        return 0, False
    woken = 0
    with transaction.atomic():
        rows = store().lock_free_in_tx(due.order_by("updated_at"), batch)
        if rows:
            now = store().db_now()
            for parent in rows:
                parent.pilot_db_now = now
                woken += parent_settle_in_tx(parent, actor=actor)
    return woken, len(rows) == batch


def children_cancel_in_tx(parents: Iterable[Any], *, actor: str, reason: str) -> int:
    """Cancel the children of `parents` that have not ended — and theirs, to
    MAX_CANCEL_DEPTH — in the caller's transaction, each by the cancel plan
    (nothing to undo → cancelled; work to undo → cancelling, enqueued; a
    running child → cancelling, its worker stops). Returns how many."""
    from workflows.engine.operations import cancel_locked_in_tx

    cancelled = 0
    level = list(parents)
    for _ in range(MAX_CANCEL_DEPTH):
        if not level:
            break
        children = store().lock_tasks_in_tx(
            _open(Task.objects.filter(parent_id__in=level))
            .exclude(state__in=[TaskState.CANCELLING, TaskState.COMPENSATING]).order_by("pk"))
        for child in children:
            cancel_locked_in_tx(child, actor=actor, reason=reason)
        cancelled += len(children)
        level = [child.pk for child in children]
    return cancelled


__all__ = ["MAX_CHILDREN", "child_key", "children_cancel_in_tx",
           "children_of", "parent_settle", "parent_settle_in_tx",
           "parents_settle_due", "settle_on_commit"]
