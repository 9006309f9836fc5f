"""Leases, the fence and the database's clock (docs/design.md, "Fencing", "Time").

A claim gives the worker a `Lease`: the task id and the exact `lease_token`
its claim wrote. The token is the task's version — every transition
increments it — so "the task is still mine" is one predicate, `id = ? AND
lease_token = ?`, and the store is the only code that evaluates it
(`store.write_steps`, `renew`, `check`, `save_progress`, and every transition
the worker applies). A write that finds another token raises `Refused`;
`classify` turns that into what the worker does next:

- `CancelRequested` when the only change since the worker's claim is an
  operator's cancel of that very run (state `cancelling`, token = ours + 1):
  the worker may take the compensation phase over (`store.resume`) and run
  it under a new token;
- `LeaseLost` for anything else (a recover, a take-over, a retry, an end):
  the worker stops touching the task.

A claim is held across a lost connection: a write under it is idempotent
(fenced by its token) and `patiently` retries it — a lost connection, not a
refused statement — for WRITE_PATIENCE_SECONDS, reconnecting between tries,
then raises `Interrupted` and the claim runs out by itself. The held attempt
of a run (run/held.py) and the held attempt of a webhook delivery
(deliveries.py) are both such claims: a token, the database's clock, patient
fenced writes.

Times: the worker never compares its own clock with anyone's. The claim
returns the database's time; `DbClock` continues it with the worker's
monotonic clock, so the timestamps a worker writes are database time, and
every comparison that decides something (due, expired, stale) is made in SQL
against the database's clock.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError

from workflows import database
from workflows.conf import pilot_settings
from workflows.rules.errors import CancelRequested, LeaseLost
from workflows.rules.states import TaskState

T = TypeVar("T")
# Errors of the connection, not of the statement: worth retrying the same write.
TRANSIENT = (OperationalError, InterfaceError)
# How long a write that cannot reach the database is retried before its holder
# gives up (the claim, far longer, then runs out and someone else takes over).
WRITE_PATIENCE_SECONDS = 5.0


class Interrupted(Exception):  # noqa: N818 - a stop, not an error
    """The database could not be reached to record or decide something."""


def reconnect() -> None:
    """Between two tries: a moment's pause, then drop the connection if it is
    dead, so the next statement opens a new one."""
    if database.in_transaction():
        return  # a test's enclosing transaction: the connection is not ours to close
    time.sleep(0.2)
    database.drop_if_dead()


def patiently(op: Callable[[], T], *, doing: str, deadline: float | None = None) -> T:
    """`op()` — a read, or a write that is idempotent under its claim — retried
    across a lost connection until `deadline` (monotonic; default
    WRITE_PATIENCE_SECONDS from now), then Interrupted("cannot <doing>: …").
    A statement the database refused is not retried: it raises at once."""
    deadline = deadline or time.monotonic() + WRITE_PATIENCE_SECONDS
    while True:
        try:
            return op()
        except TRANSIENT as exc:
            if time.monotonic() > deadline:
                text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                raise Interrupted(f"cannot {doing}: {text}") from exc
            reconnect()


class DbClock:
    """The database's clock as seen from this process: a time the database gave
    (`anchor`), advanced by this process's monotonic clock since it was read."""

    def __init__(self, anchor: datetime):
        self.anchor = anchor
        self._at = time.monotonic()

    def now(self) -> datetime:
        return self.anchor + timedelta(seconds=time.monotonic() - self._at)


class LeaseClock:
    """When this worker last extended its lease (monotonic time). Writes that
    pass the fence extend the lease only once it is due (every
    PILOT_HEARTBEAT_SECONDS), so a run of short steps does not rewrite the task
    row at every boundary."""

    def __init__(self) -> None:
        self.renewed = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.renewed >= pilot_settings.PILOT_HEARTBEAT_SECONDS

    def mark(self) -> None:
        self.renewed = time.monotonic()


@dataclasses.dataclass(frozen=True)
class Lease:
    task_id: Any  # the task's UUID (or its text)
    token: int
    worker: str
    clock: LeaseClock = dataclasses.field(default_factory=LeaseClock, compare=False,
                                          repr=False)


class Refused(Exception):  # noqa: N818 - a refusal, not an error
    """A fenced write matched nothing: the task's (state, token) now, or
    (None, None) when the task is gone."""

    def __init__(self, lease: Lease, state: str | None, token: int | None):
        self.lease, self.state, self.token = lease, state, token
        super().__init__(str(self))

    def __str__(self) -> str:
        now = f"now {self.state}, token {self.token}" if self.state else "deleted"
        return f"task {self.lease.task_id}: lease {self.lease.token} is no longer held ({now})"


def classify(refused: Refused) -> CancelRequested | LeaseLost:
    """The worker signal a refusal means (module docstring)."""
    lease = refused.lease
    if refused.state == TaskState.CANCELLING and refused.token == lease.token + 1:
        return CancelRequested(f"task {lease.task_id} was cancelled while it ran")
    return LeaseLost(str(refused))


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def lease_length() -> timedelta:
    return timedelta(seconds=pilot_settings.PILOT_LEASE_SECONDS)
