"""What a step (or a compensation) sees: `ctx` (docs/writing-workflows.md).

    ctx.task_id         the task's id (a string)
    ctx.payload         the task's payload (a dict; treat as read-only)
    ctx.outputs         {step name: output} of the steps before this one
    ctx.output          in a compensation: the output of the step it undoes
    ctx.attempt         the task's attempt number (1 on the first run)
    ctx.compensating    True inside a compensation
    ctx.step_key        "<task id>:<step name>" for a step and
                        "<task id>:<step name>:compensate" for its compensation:
                        stable across attempts; pass it to external systems as
                        their idempotency key (a refund never reuses the charge's)
    ctx.progress        what this step saved last time (None at first)
    ctx.save_progress(v)  store v for a resumed attempt (fenced)
    ctx.heartbeat()     renew the lease during long work; raises (a BaseException)
                        if the task was cancelled or the lease lost
    ctx.sleep(s)        sleep s seconds, heartbeating on the way
    ctx.start_children(workflow, payloads, suffixes=None)
                        start child tasks of `workflow` (one per payload),
                        idempotently: a step run again finds the ones it
                        started; returns their ids (docs/writing-workflows.md,
                        "Children")
    ctx.start_child(workflow, payload, suffix=None)   one of them
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from django.db import DatabaseError

from workflows.conf import pilot_settings
from workflows.engine import faults
from workflows.engine.leases import Lease, LeaseClock
from workflows.observability.events import Event, emit


class Holder(Protocol):
    """What a step needs of the attempt that holds its task (run/held.py's
    `Held`): fenced writes that raise the worker's signal when refused."""

    renewal: LeaseClock

    @property
    def lease(self) -> Lease: ...

    def renew(self) -> None: ...

    def check(self) -> None: ...

    def save_progress(self, index: int, progress: Any) -> None: ...

    def start_children(self, step: str, workflow: str, payloads: list[Any],
                       suffixes: list[str]) -> list[Any]: ...


class StepContext:
    """A step's view of its run; its heartbeat and saved progress are writes of
    the attempt that holds the task, fenced like every other."""

    def __init__(self, *, held: Holder, task_id: str, workflow: str, payload: dict[str, Any],
                 outputs: dict[str, Any], attempt: int, step_index: int, step_name: str,
                 progress: Any = None, output: Any = None,
                 atomic: bool = False, compensating: bool = False) -> None:
        self.task_id = task_id
        self.workflow = workflow
        self.payload = payload
        self.outputs = outputs
        self.attempt = attempt
        self.step_index = step_index
        self.step_name = step_name
        self.progress = progress
        self.output = output
        self.compensating = compensating
        self._held = held
        self._atomic = atomic
        self._last_check = time.monotonic()
        self._children_asked = 0  # this run of the step's: the next default suffix

    @property
    def _lease(self) -> Lease:
        """The lease this step runs under (its worker, its token), for tests."""
        return self._held.lease

    @property
    def step_key(self) -> str:
        key = f"{self.task_id}:{self.step_name}"
        return f"{key}:compensate" if self.compensating else key

    def heartbeat(self, *, force: bool = False) -> None:
        """Renew the lease (at most every PILOT_HEARTBEAT_SECONDS unless `force`).

        Inside an atomic body the lease cannot be renewed (the write would only
        commit with the step); the fence is still checked, so a cancel or a lost
        lease stops the step and rolls its writes back.

        A database error here (a restart, SQLite's single writer busy with
        another task's atomic step) is not the step's failure: the heartbeat is
        skipped and the lease, renewed a few heartbeats ago, still holds. Only a
        refusal — the token is no longer ours — stops the step."""
        if self._atomic:
            now = time.monotonic()
            if force or now - self._last_check >= pilot_settings.PILOT_HEARTBEAT_SECONDS:
                self._last_check = now
                self._unless_unreachable(self._held.check)
            return
        if not force and not self._held.renewal.due():
            return
        faults.fault_point("during_lease_renewal")
        self._unless_unreachable(self._held.renew)

    def _unless_unreachable(self, write: Callable[[], object]) -> None:
        try:
            write()
        except DatabaseError as exc:
            if self._atomic:
                raise  # inside the step's transaction: it is lost anyway
            emit(Event.HEARTBEAT_SKIPPED, level=logging.WARNING, task_id=self.task_id,
                 workflow=self.workflow, step=self.step_name,
                 error=f"{type(exc).__name__}: {exc}"[:300])

    def sleep(self, seconds: float) -> None:
        """Sleep, heartbeating, so a cancel is noticed within a heartbeat interval."""
        deadline = time.monotonic() + max(0.0, seconds)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(remaining, pilot_settings.PILOT_HEARTBEAT_SECONDS, 0.25))
            self.heartbeat()

    def save_progress(self, progress: Any) -> None:
        if self._atomic:
            raise RuntimeError("an atomic step commits all or nothing; it has no progress "
                               "to save")
        self._held.save_progress(self.step_index, progress)
        self.progress = progress

    def start_children(self, workflow: str, payloads: list[Any], *,
                       suffixes: list[str] | None = None) -> list[str]:
        """Start a child task of `workflow` per payload, as this task's owner;
        returns their ids in order. Each child's key is derived from this
        task, this step and its suffix (default: its position among the
        children this run of the step asked for, "0", "1", …), so a step run
        again — after a crash, a retry — finds the children it started instead
        of starting them twice. A payload the child workflow refuses, or a
        suffix reused for another payload, raises and starts none of its batch."""
        if self.compensating:
            raise RuntimeError("a compensation cannot start children")
        payloads = list(payloads)
        if suffixes is None:
            suffixes = [str(self._children_asked + i) for i in range(len(payloads))]
        suffixes = [str(s) for s in suffixes]
        if len(suffixes) != len(payloads) or len(set(suffixes)) != len(suffixes):
            raise ValueError("start_children needs one distinct suffix per payload")
        self._children_asked += len(payloads)
        if not payloads:
            return []
        started = self._held.start_children(self.step_name, workflow, payloads, suffixes)
        return [str(task.pk) for task in started]

    def start_child(self, workflow: str, payload: Any, *, suffix: str | None = None) -> str:
        """`start_children` for one child; its id."""
        return self.start_children(workflow, [payload],
                                   suffixes=None if suffix is None else [suffix])[0]
