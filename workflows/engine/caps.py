"""Fair shares of the workers (docs/design.md, "Fairness").

A claim takes a worker only while the task's client and workflow are under
their caps; otherwise the task stays `pending`/`retrying` and waits its turn
without holding a worker:

- PILOT_MAX_RUNNING_PER_CLIENT: at most this many of one client's (owner's)
  tasks `running` at once (0: no cap);
- `define_workflow(..., max_running=N)`: this workflow's tasks get their own
  per-client cap of N, counted apart from the client's other tasks;
- `define_workflow(..., concurrency=N)`: at most N tasks of this workflow
  `running` at once, over every client.

Only `running` counts: a compensation or cancel phase is never held back (undo
work must not queue behind the client's own backlog) and does not take a slot.

The caps travel to the database as one JSON value (`caps()`); the store
decides there. On PostgreSQL a claim's final check (`pilot_claim_slot`,
migration 0015) takes a transaction-scoped advisory lock per client (and per
capped workflow) and counts the running tasks with a fresh snapshot, so two
claims racing for a client's last slot are decided one after the other: the
second sees the first's commit. SQLite has one writer at a time, so a count
inside the claim's transaction is already exact.

A message whose claim a cap refused is consumed: the task is marked as owed
one (`enqueued_at` NULL) and the dispatcher sends it when its client has a
free slot again (`free_slots`), at most one per free slot — so a flood of one
client costs each of its messages one refused claim, never a loop. Workers
that finish a run also take the next claimable task straight from the table.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from django.db import connection
from django.db.models import Q

from workflows.conf import pilot_settings
from workflows.registry import registry

# Keys of the advisory locks a capped claim takes (pg_advisory_xact_lock(int, int)):
# the first int names the kind, the second is hashtext of the client or workflow.
LOCK_CLIENT = 0x50494C31  # "PIL1"
LOCK_WORKFLOW = 0x50494C32  # "PIL2"

DEFAULT_GROUP = ""


def caps() -> dict[str, Any] | None:
    """{"client": C, "own": {workflow: N}, "total": {workflow: N}} for the
    registered workflows, or None when nothing is capped at all."""
    client = int(pilot_settings.PILOT_MAX_RUNNING_PER_CLIENT)
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    for workflow in registry.all():
        if workflow.max_running is not None:
            own[workflow.name] = workflow.max_running
        if workflow.concurrency is not None:
            total[workflow.name] = workflow.concurrency
    if not client and not own and not total:
        return None
    return {"client": client, "own": own, "total": total}


def caps_json() -> str | None:
    """`caps()` as the JSON parameter of the PostgreSQL statements."""
    value = caps()
    return None if value is None else json.dumps(value, sort_keys=True)


def group_of(workflow: str, limits: dict[str, Any]) -> str:
    """The per-client cap group a workflow's tasks count in: its own, when it
    has `max_running`, else the client-wide one."""
    return workflow if workflow in limits["own"] else DEFAULT_GROUP


def cap_of(group: str, limits: dict[str, Any]) -> int:
    """The cap of a group (0: none)."""
    return int(limits["client"] if group == DEFAULT_GROUP else limits["own"][group])


class Slots:
    """The free slots as a snapshot of the running tasks: how many more of a
    client's group, and of a workflow, may start. Used to choose (the
    dispatcher's messages, the portable store's candidates); the claim itself
    decides exactly."""

    def __init__(self, limits: dict[str, Any] | None, running: Iterable[tuple[Any, str]]):
        self.limits = limits
        self.by_group: Counter[tuple[Any, str]] = Counter()
        self.by_workflow: Counter[str] = Counter()
        if limits is None:
            return
        for owner_id, workflow in running:
            self.by_group[(owner_id, group_of(workflow, limits))] += 1
            self.by_workflow[workflow] += 1

    @classmethod
    def now(cls, limits: dict[str, Any] | None) -> Slots:
        from workflows.models import Task
        from workflows.states import TaskState

        if limits is None:
            return cls(None, ())
        return cls(limits, Task.objects.filter(state=TaskState.RUNNING)
                   .values_list("owner_id", "workflow"))

    def free(self, owner_id: Any, workflow: str) -> bool:
        if self.limits is None:
            return True
        group = group_of(workflow, self.limits)
        cap = cap_of(group, self.limits)
        if cap and self.by_group[(owner_id, group)] >= cap:
            return False
        total = self.limits["total"].get(workflow)
        return not (total and self.by_workflow[workflow] >= total)

    def take(self, owner_id: Any, workflow: str) -> bool:
        """Reserve a slot if one is free (for choosing several at once)."""
        if not self.free(owner_id, workflow):
            return False
        self.reserve(owner_id, workflow)
        return True

    def reserve(self, owner_id: Any, workflow: str, n: int = 1) -> None:
        """Count `n` more as if running (say, tasks whose message is on its way:
        it will try for the slot first)."""
        if self.limits is not None:
            self.by_group[(owner_id, group_of(workflow, self.limits))] += n
            self.by_workflow[workflow] += n

    def blocked_owners(self) -> set[tuple[Any, str]]:
        """(client, group) pairs at their cap."""
        if self.limits is None:
            return set()
        return {key for key, n in self.by_group.items()
                if cap_of(key[1], self.limits) and n >= cap_of(key[1], self.limits)}


def blocked_q(slots: Slots) -> Q:
    """Matches the tasks whose client's group or workflow is at its cap (as
    `slots` saw the running tasks); matches nothing when nothing is."""
    if slots.limits is None:
        return Q(pk__in=[])
    own = list(slots.limits["own"])
    blocked = Q(pk__in=[])
    for owner_id, group in slots.blocked_owners():
        same_group = Q(workflow=group) if group else ~Q(workflow__in=own)
        blocked |= Q(owner_id=owner_id) & same_group
    full = [w for w, n in slots.by_workflow.items()
            if n >= slots.limits["total"].get(w, n + 1)]
    if full:
        blocked |= Q(workflow__in=full)
    return blocked


def slot_free_exact(owner_id: Any, workflow: str, limits: dict[str, Any] | None) -> bool:
    """The portable store's final check, inside the claim's transaction: on
    PostgreSQL under the same advisory locks as `pilot_claim_slot` (each count
    a statement of its own, so it sees every claim committed before the lock was
    granted); on SQLite the transaction already holds the only write lock."""
    from workflows.models import Task
    from workflows.states import TaskState

    if limits is None:
        return True
    running = Task.objects.filter(state=TaskState.RUNNING)
    group = group_of(workflow, limits)
    cap = cap_of(group, limits)
    if cap:
        _lock(LOCK_CLIENT, str(owner_id))
        mine = running.filter(owner_id=owner_id)
        mine = (mine.filter(workflow=workflow) if group != DEFAULT_GROUP
                else mine.exclude(workflow__in=list(limits["own"])))
        if mine.count() >= cap:
            return False
    total = limits["total"].get(workflow)
    if total:
        _lock(LOCK_WORKFLOW, workflow)
        if running.filter(workflow=workflow).count() >= total:
            return False
    return True


def _lock(kind: int, key: str) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [kind, key])


__all__ = ["LOCK_CLIENT", "LOCK_WORKFLOW", "Slots", "blocked_q", "caps", "caps_json",
           "slot_free_exact"]
