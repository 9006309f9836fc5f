"""Fair shares of the workers (docs/design.md, "Fairness").

A claim takes a worker only while the task's client and workflow are under
their caps; otherwise the task stays `pending`/`retrying` and waits its turn
without holding a worker:

- PILOT_MAX_RUNNING_PER_CLIENT: at most this many of one client's (owner's)
  tasks held by workers at once (0: no cap);
- `define_workflow(..., max_running=N)`: this workflow's tasks get their own
  per-client cap of N, counted apart from the client's other tasks;
- `define_workflow(..., concurrency=N)`: at most N tasks of this workflow
  held at once, over every client.

"Held" is all the work a client makes the workers do: a task `running`, and a
compensation or cancel phase (`compensating`, `cancelling`) under a live lease
— a worker is undoing its steps, or still running the step a cancel stopped
(review turn 3, security N5: one client's slow compensations held every
worker, and a cancelled running task freed its slot while its worker still
ran). Within one client undo work goes before new runs: a phase waiting for a
worker (no live lease, no backoff left) reserves its client's slot, so a new
run is claimed only while held + waiting undo < cap, and a take-over of a
phase (`resume`) only while held < cap. The worker whose own running attempt
was cancelled takes the phase over without a check: it holds the slot already.

The caps travel to the database as one JSON value (`caps()`); the store
decides there. On PostgreSQL a claim's final check (`pilot_claim_slot_v2`,
migration 0018) takes a transaction-scoped advisory lock per client (and per
capped workflow) and counts with a fresh snapshot, so two claims racing for a
client's last slot are decided one after the other: the second sees the
first's commit. SQLite has one writer at a time, so a count inside the claim's
transaction is already exact.

A message whose claim or take-over a cap refused is consumed: the task is
marked as owed one (`enqueued_at` NULL) and the dispatcher sends it when its
client has a free slot again, at most one per free slot — so a flood of one
client costs each of its messages one refused claim, never a loop. Workers
that finish a run also take the next claimable task straight from the table.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

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


@dataclasses.dataclass(frozen=True)
class HeldBack:
    """The cap a task waits behind: `kind` "client" (PILOT_MAX_RUNNING_PER_CLIENT),
    "own" (its workflow's max_running, per client) or "total" (its workflow's
    concurrency, over every client); `held` of `cap` are taken."""

    kind: str
    cap: int
    held: int


class Slots:
    """The free slots as a snapshot: for each client's group and each workflow,
    the tasks held (module docstring), and for each client's group the undo
    work waiting for a worker. Used to choose (the dispatcher's messages, the
    portable store's candidates); the claim itself decides exactly."""

    def __init__(self, limits: dict[str, Any] | None,
                 held: Iterable[tuple[Any, str]] = (),
                 waiting_undo: Iterable[tuple[Any, str]] = ()):
        self.limits = limits
        self.by_group: Counter[tuple[Any, str]] = Counter()
        self.undo_by_group: Counter[tuple[Any, str]] = Counter()
        self.by_workflow: Counter[str] = Counter()
        if limits is None:
            return
        for owner_id, workflow in held:
            self.by_group[(owner_id, group_of(workflow, limits))] += 1
            self.by_workflow[workflow] += 1
        for owner_id, workflow in waiting_undo:
            self.undo_by_group[(owner_id, group_of(workflow, limits))] += 1

    @classmethod
    def now(cls, limits: dict[str, Any] | None) -> Slots:
        from django.db.models import BooleanField, Case, Value, When
        from django.db.models.functions import Now

        from workflows.models import Task
        from workflows.rules.states import COMPENSATION_STATES, TaskState

        if limits is None:
            return cls(None)
        live = Q(lease_expires_at__gt=Now())
        due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=Now())
        rows = (Task.objects.filter(Q(state=TaskState.RUNNING)
                                    | Q(state__in=COMPENSATION_STATES) & (live | due))
                .annotate(pilot_held=Case(When(Q(state=TaskState.RUNNING) | live,
                                               then=Value(True)),
                                          default=Value(False), output_field=BooleanField()))
                .values_list("owner_id", "workflow", "pilot_held"))
        held: list[tuple[Any, str]] = []
        waiting: list[tuple[Any, str]] = []
        for owner_id, workflow, is_held in rows:
            (held if is_held else waiting).append((owner_id, workflow))
        return cls(limits, held, waiting)

    def _count(self, key: tuple[Any, str], undo: bool) -> int:
        return self.by_group[key] + (0 if undo else self.undo_by_group[key])

    def refusal(self, owner_id: Any, workflow: str, *, undo: bool = False) -> HeldBack | None:
        """Why a task of `workflow` of this client may not start now (a new
        run, or with `undo` the take-over of a compensation phase): the cap it
        is at; None when it may. `free` is this, and the console says it."""
        if self.limits is None:
            return None
        group = group_of(workflow, self.limits)
        cap = cap_of(group, self.limits)
        held = self._count((owner_id, group), undo)
        if cap and held >= cap:
            return HeldBack("own" if group else "client", cap, held)
        total = self.limits["total"].get(workflow)
        if total and self.by_workflow[workflow] >= total:
            return HeldBack("total", total, self.by_workflow[workflow])
        return None

    def free(self, owner_id: Any, workflow: str, *, undo: bool = False) -> bool:
        """May a task of `workflow` of this client start now — a new run, or
        (`undo`) the take-over of a compensation phase?"""
        return self.refusal(owner_id, workflow, undo=undo) is None

    def usage(self) -> list[tuple[Any, str, int, int]]:
        """(client, group, held, cap) of every client's group holding workers or
        owing undo work, most held first: what Workers & queue shows."""
        if self.limits is None:
            return []
        keys = set(self.by_group) | set(self.undo_by_group)
        rows = [(owner_id, group, self._count((owner_id, group), False),
                 cap_of(group, self.limits)) for owner_id, group in keys]
        return sorted(rows, key=lambda r: (-r[2], str(r[0]), r[1]))

    def take(self, owner_id: Any, workflow: str, *, undo: bool = False) -> bool:
        """Reserve a slot if one is free (for choosing several at once)."""
        if not self.free(owner_id, workflow, undo=undo):
            return False
        self.reserve(owner_id, workflow)
        if undo and self.limits is not None:  # it was waiting: now it is held instead
            key = (owner_id, group_of(workflow, self.limits))
            self.undo_by_group[key] = max(0, self.undo_by_group[key] - 1)
        return True

    def reserve(self, owner_id: Any, workflow: str, n: int = 1) -> None:
        """Count `n` more as held (say, tasks whose message is on its way: it
        will try for the slot first)."""
        if self.limits is not None:
            self.by_group[(owner_id, group_of(workflow, self.limits))] += n
            self.by_workflow[workflow] += n

    def blocked_owners(self, *, undo: bool = False) -> set[tuple[Any, str]]:
        """(client, group) pairs at their cap, for new runs or (`undo`) for
        take-overs of compensation phases."""
        if self.limits is None:
            return set()
        limits = self.limits
        return {key for key in set(self.by_group) | set(self.undo_by_group)
                if cap_of(key[1], limits) and self._count(key, undo) >= cap_of(key[1], limits)}


def blocked_q(slots: Slots, *, undo: bool = False) -> Q:
    """Matches the tasks whose client's group or workflow is at its cap (as
    `slots` saw them) for new runs or (`undo`) for take-overs of compensation
    phases; matches nothing when nothing is."""
    if slots.limits is None:
        return Q(pk__in=[])
    own = list(slots.limits["own"])
    blocked = Q(pk__in=[])
    for owner_id, group in slots.blocked_owners(undo=undo):
        same_group = Q(workflow=group) if group else ~Q(workflow__in=own)
        blocked |= Q(owner_id=owner_id) & same_group
    full = [w for w, n in slots.by_workflow.items()
            if n >= slots.limits["total"].get(w, n + 1)]
    if full:
        blocked |= Q(workflow__in=full)
    return blocked


__all__ = ["DEFAULT_GROUP", "LOCK_CLIENT", "LOCK_WORKFLOW", "HeldBack", "Slots", "blocked_q",
           "cap_of", "caps", "caps_json", "group_of"]
