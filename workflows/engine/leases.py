"""Leases and fencing (SPEC §7, STYLE practice 4).

A claim gives the worker a `Lease`: the task id and the lease token the claim
set. Every write the worker makes afterwards is conditional on that token and
on the task's state, so a worker that lost the task — its lease expired and
another worker claimed it, or an operator cancelled it — has its writes
refused instead of clobbering someone else's run:

- `fence_renew(lease)`: one conditional UPDATE that also extends the lease;
  inside a transaction it holds the task's row lock until commit, so what the
  caller writes next commits only if the fence held.
- `fence_lock(lease)`: SELECT … FOR UPDATE of the task under the same
  condition, for writes that apply a transition.

Both raise CancelRequested when the token is still ours but the task is
`cancelling`, and LeaseLost otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from workflows.errors import CancelRequested, LeaseLost
from workflows.models import Task
from workflows.states import TaskState


class LeaseClock:
    """When this worker last extended its lease (monotonic time). Writes that
    pass the fence extend the lease only once it is due (every
    PILOT_HEARTBEAT_SECONDS), so a run of short steps does not rewrite the task
    row at every boundary."""

    def __init__(self):
        self.renewed = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.renewed >= settings.PILOT_HEARTBEAT_SECONDS

    def mark(self) -> None:
        self.renewed = time.monotonic()


@dataclasses.dataclass(frozen=True)
class Lease:
    task_id: object
    token: int
    worker: str
    clock: LeaseClock = dataclasses.field(default_factory=LeaseClock, compare=False,
                                          repr=False)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def lease_expiry(now=None):
    return (now or timezone.now()) + timedelta(seconds=settings.PILOT_LEASE_SECONDS)


def raise_lease_refusal(lease: Lease) -> None:
    """A fenced write matched nothing: say why, as the exception the worker acts on."""
    row = Task.objects.filter(pk=lease.task_id).values("state", "lease_token").first()
    if row and row["lease_token"] == lease.token and row["state"] == TaskState.CANCELLING:
        raise CancelRequested(f"task {lease.task_id} is being cancelled")
    raise LeaseLost(f"task {lease.task_id}: lease {lease.token} is no longer held "
                    f"(now {row['state'] if row else 'deleted'}, "
                    f"token {row['lease_token'] if row else '-'})")


def fence_renew(lease: Lease, *, states=(TaskState.RUNNING,)) -> None:
    """Extend the lease if the task is still ours and in `states`; raise otherwise.

    One statement. Inside transaction.atomic() it keeps the task row locked
    until commit (lock order: task before steps)."""
    now = timezone.now()
    renewed = Task.objects.filter(pk=lease.task_id, lease_token=lease.token,
                                  state__in=states).update(lease_expires_at=lease_expiry(now))
    if renewed != 1:
        raise_lease_refusal(lease)
    lease.clock.mark()


def fence_check(lease: Lease, *, states=(TaskState.RUNNING,)) -> None:
    """Read-only fence: raise unless the task is still ours and in `states`."""
    if not Task.objects.filter(pk=lease.task_id, lease_token=lease.token,
                               state__in=states).exists():
        raise_lease_refusal(lease)


def fence_lock(lease: Lease, *, states=(TaskState.RUNNING,)) -> Task:
    """The task, locked FOR UPDATE, if still ours and in `states`; raise otherwise.
    Call inside transaction.atomic()."""
    task = (Task.objects.select_for_update()
            .filter(pk=lease.task_id, lease_token=lease.token, state__in=states).first())
    if task is None:
        raise_lease_refusal(lease)
    return task
