"""What a step sees: `ctx` (SPEC §7).

    ctx.payload         the task's payload (a dict; treat as read-only)
    ctx.outputs         {step name: output} of the steps before this one
    ctx.output          in a compensation: the output of the step it undoes
    ctx.attempt         the task's attempt number (1 on the first run)
    ctx.step_key        "<task id>:<step name>": stable across attempts; pass it
                        to external systems as their idempotency key
    ctx.progress        what this step saved last time (None at first)
    ctx.save_progress(v)  store v for a resumed attempt (fenced)
    ctx.heartbeat()     renew the lease during long work; raises (a BaseException)
                        if the task was cancelled or the lease lost
    ctx.sleep(s)        sleep s seconds, heartbeating on the way
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import transaction

from workflows.engine import checkpoints, faults
from workflows.engine.leases import Lease, fence_check, fence_renew
from workflows.states import TaskState


class StepContext:
    def __init__(self, *, lease: Lease, workflow: str, payload: dict, outputs: dict,
                 attempt: int, step_index: int, step_name: str, progress=None, output=None,
                 atomic: bool = False, fence_states=(TaskState.RUNNING,)):
        self.task_id = str(lease.task_id)
        self.workflow = workflow
        self.payload = payload
        self.outputs = outputs
        self.attempt = attempt
        self.step_index = step_index
        self.step_name = step_name
        self.progress = progress
        self.output = output
        self._lease = lease
        self._atomic = atomic
        self._fence_states = fence_states
        self._last_check = time.monotonic()

    @property
    def step_key(self) -> str:
        return f"{self.task_id}:{self.step_name}"

    def heartbeat(self, *, force: bool = False) -> None:
        """Renew the lease (at most every PILOT_HEARTBEAT_SECONDS unless `force`).

        Inside an atomic step the lease cannot be renewed (the write would only
        commit with the step); the fence is still checked, so a cancel or a lost
        lease stops the step and rolls its writes back."""
        if self._atomic:
            now = time.monotonic()
            if force or now - self._last_check >= settings.PILOT_HEARTBEAT_SECONDS:
                self._last_check = now
                fence_check(self._lease, states=self._fence_states)
            return
        if not force and not self._lease.clock.due():
            return
        with transaction.atomic():
            fence_renew(self._lease, states=self._fence_states)
            faults.fault_point("during_lease_renewal")

    def sleep(self, seconds: float) -> None:
        """Sleep, heartbeating, so a cancel is noticed within a heartbeat interval."""
        deadline = time.monotonic() + max(0.0, seconds)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(remaining, settings.PILOT_HEARTBEAT_SECONDS, 0.25))
            self.heartbeat()

    def save_progress(self, progress) -> None:
        if self._atomic:
            raise RuntimeError("an atomic step commits all or nothing; it has no progress "
                               "to save")
        checkpoints.step_progress_save(self._lease, index=self.step_index, name=self.step_name,
                                       progress=progress)
        self.progress = progress
