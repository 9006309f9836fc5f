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
    settle (a child's ending, on its commit — engine/announce.py, which
      owes it as it owes the ending's webhook — and the dispatcher's pass
      here for any ending whose settle was lost): a sibling still open →
      nothing (no lock); else lock the parent; waiting for children none of
      which is still open → `wake`

The look and the settle lock the same row, so a child that ends while its
parent parks is seen by one of them: either the look reads it ended, or the
settle runs after the park committed and wakes it. Two last children ending
at once settle one after the other; the second finds the parent woken.

Cancelling a parent cancels its children that have not ended (operations.py,
in the cancel's transaction, their own children too). A parent that fails
leaves its children to end by themselves: a retry of the parent finds them as
they ended.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef

from workflows.engine.announce import parent_settle_in_tx
from workflows.engine.store import store
from workflows.models import Task
from workflows.rules.errors import ValidationFailed
from workflows.rules.keys import MAX_KEY_LENGTH
from workflows.rules.states import FINISHED_STATES, TaskState

# Children one task may start in all (over every step and attempt).
MAX_CHILDREN = 10_000

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


def parents_settle_due(*, batch: int, actor: str) -> tuple[int, bool]:
    """The dispatcher's pass: parents waiting for children of which none is
    still open (a settle lost with its process), woken. Returns (woken, full)."""
    open_child = Task.objects.filter(parent_id=OuterRef("pk")).exclude(state__in=FINISHED_STATES)
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


__all__ = ["MAX_CHILDREN", "child_key", "parents_settle_due"]
