"""The invariant checker every fault scenario ends with.

It reads only the database (and what the scenario's clients recorded) and
returns the list of violations, so a scenario asserts `violations == []` and a
failure names every broken promise at once.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, F
from django.utils import timezone

from workflows.models import DemoOrder, Task, TaskTransition
from workflows.states import FINISHED_STATES
from workflows.states import TaskState as S

# Every edge of the state machine (docs/design.md), as (transition, from, to).
LEGAL_EDGES = {
    ("claim", S.PENDING, S.RUNNING), ("claim", S.RETRYING, S.RUNNING),
    ("succeed", S.RUNNING, S.SUCCEEDED),
    ("schedule_retry", S.RUNNING, S.RETRYING), ("recover", S.RUNNING, S.RETRYING),
    ("compensate", S.RUNNING, S.COMPENSATING),
    ("fail", S.RUNNING, S.FAILED), ("fail", S.COMPENSATING, S.FAILED),
    ("resume", S.COMPENSATING, S.COMPENSATING), ("resume", S.CANCELLING, S.CANCELLING),
    ("defer", S.COMPENSATING, S.COMPENSATING), ("defer", S.CANCELLING, S.CANCELLING),
    ("cancel", S.PENDING, S.CANCELLED), ("cancel", S.RETRYING, S.CANCELLED),
    ("cancel", S.PENDING, S.CANCELLING), ("cancel", S.RETRYING, S.CANCELLING),
    ("cancel", S.RUNNING, S.CANCELLING),
    ("finish_cancel", S.CANCELLING, S.CANCELLED),
    ("retry", S.FAILED, S.PENDING), ("retry", S.CANCELLED, S.PENDING),
}


@dataclasses.dataclass
class Observed:
    """What the clients of a scenario saw."""

    acknowledged: dict = dataclasses.field(default_factory=dict)  # (owner_id, key) -> task id
    server_errors: list = dataclasses.field(default_factory=list)  # 5xx outside fault windows
    foreign_reads: list = dataclasses.field(default_factory=list)  # another client's data seen


def violations(observed: Observed | None = None, *, require_terminal: bool = True,
               tasks=None) -> list[str]:
    observed = observed or Observed()
    tasks = tasks if tasks is not None else Task.objects.all()
    found: list[str] = []

    dupes = (tasks.values("owner_id", "idempotency_key").annotate(n=Count("id"))
             .filter(n__gt=1))
    found += [f"{d['n']} tasks for ({d['owner_id']}, {d['idempotency_key']!r})" for d in dupes]

    ids = {str(pk) for pk in tasks.values_list("pk", flat=True)}
    for (_owner_id, key), task_id in observed.acknowledged.items():
        if str(task_id) not in ids:
            found.append(f"acknowledged task {task_id} for key {key!r} is missing")

    if require_terminal:
        stuck = tasks.exclude(state__in=FINISHED_STATES).values_list("pk", "state")
        found += [f"task {pk} is still {state}" for pk, state in stuck]

    late = timezone.now() - timedelta(seconds=settings.PILOT_DISPATCHER_POLL_SECONDS + 2)
    overdue = tasks.filter(state=S.RUNNING, lease_expires_at__lt=late).values_list("pk",
                                                                                   flat=True)
    found += [f"task {pk} is running on a lease that expired long ago" for pk in overdue]

    over = tasks.filter(attempts__gt=F("max_attempts")).values_list("pk", flat=True)
    found += [f"task {pk} used more attempts than allowed" for pk in over]

    found += _atomic_effects(tasks)
    found += _audit_chains(tasks)
    found += [f"5xx outside a fault window: {e}" for e in observed.server_errors]
    found += [f"foreign read: {e}" for e in observed.foreign_reads]
    return found


def _atomic_effects(tasks) -> list[str]:
    """demo.sync_orders writes `count` rows in its atomic last step: exactly
    `count` rows when it succeeded, none otherwise."""
    found = []
    rows = defaultdict(int)
    for batch, n in DemoOrder.objects.values_list("batch").annotate(n=Count("id")):
        rows[batch] = n
    for task in tasks.filter(workflow="demo.sync_orders").only("pk", "state", "payload"):
        expected = task.payload["count"] if task.state == S.SUCCEEDED else 0
        if rows[task.payload["batch"]] != expected:
            found.append(f"batch {task.payload['batch']}: {rows[task.payload['batch']]} rows, "
                         f"expected {expected} (task {task.pk} {task.state})")
    return found


def _audit_chains(tasks) -> list[str]:
    """Every audit row is a legal edge, each starts where the last ended, and
    the last one ends in the task's current state."""
    found = []
    current = dict(tasks.values_list("pk", "state"))
    chains = defaultdict(list)
    for task_id, name, source, target in (
            TaskTransition.objects.filter(task_id__in=list(current)).order_by("task_id", "id")
            .values_list("task_id", "transition", "from_state", "to_state")):
        chains[task_id].append((name, source, target))
    for task_id, state in current.items():
        at = S.PENDING
        for name, source, target in chains[task_id]:
            if (name, source, target) not in LEGAL_EDGES:
                found.append(f"task {task_id}: illegal edge {name} {source}->{target}")
            if source != at:
                found.append(f"task {task_id}: {name} from {source} but it was {at}")
            at = target
        if at != state:
            found.append(f"task {task_id}: history ends in {at} but the task is {state}")
    return found
