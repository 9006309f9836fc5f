"""Running a claimed task: steps in order, checkpoints, retries, failure,
cancel and compensation (SPEC §7).

`task_run(task_id=...)` is the whole story for one delivery: claim (or return
"skipped"), run the steps that have no succeeded checkpoint, and end the
attempt with exactly one of: succeed, schedule_retry, fail, finish_cancel — or
stop silently when the lease was lost (someone else owns the task now).

No row lock is held across a step body, except the database-only body of an
atomic step, which runs inside its own fenced transaction by design.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from django_fsm import ConcurrentTransition

from workflows.backoff import backoff_delay
from workflows.engine import checkpoints, faults
from workflows.engine.audit import transition_apply
from workflows.engine.claims import COMPENSATE, Claim, task_claim
from workflows.engine.compensation import compensate
from workflows.engine.context import StepContext
from workflows.engine.leases import fence_lock, raise_lease_refusal, worker_id
from workflows.errors import CancelRequested, LeaseLost, PilotError, WorkflowChanged
from workflows.observability.events import emit, log_context
from workflows.registry import DEFAULT_IDEMPOTENCY_TTL, Step, Workflow, registry
from workflows.states import StepState, TaskState


@dataclasses.dataclass
class RunReport:
    task_id: str
    outcome: str  # skipped | succeeded | retrying | failed | cancelled | lease_lost
    steps_run: list[str] = dataclasses.field(default_factory=list)


def task_run(*, task_id, worker: str | None = None) -> RunReport:
    """Claim and run one task. A second call while the first runs, or after the
    task finished, returns outcome "skipped" and changes nothing."""
    worker = worker or worker_id()
    claim = task_claim(task_id=task_id, worker=worker)
    if claim is None:
        return RunReport(str(task_id), "skipped")
    faults.fault_point("after_claim")
    task = claim.task
    with log_context(trace_id=task.trace_id or None, task_id=str(task.pk),
                     workflow=task.workflow):
        return _Run(claim).execute()


def _ttl(workflow: Workflow | None) -> timedelta:
    return workflow.idempotency_ttl if workflow else DEFAULT_IDEMPOTENCY_TTL


def _describe(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text, type(exc).__name__


class _Run:
    def __init__(self, claim: Claim):
        self.claim = claim
        self.task = claim.task
        self.lease = claim.lease
        self.report = RunReport(str(self.task.pk), "")
        self.workflow: Workflow | None = None
        self.plan: list[Step] = []
        self.current: tuple[int, Step] | None = None

    def execute(self) -> RunReport:
        try:
            self.workflow = registry.get(self.task.workflow)
            self.plan = self.workflow.steps_for(self.task.payload)
        except (PilotError, Exception) as exc:  # noqa: BLE001 - the workflow itself is broken
            return self._fail(*_describe(exc), compensate_first=False)
        try:
            if self.claim.mode == COMPENSATE:
                return self._finish_cancel()
            try:
                done = self._succeeded_outputs()
            except WorkflowChanged as exc:
                return self._fail(*_describe(exc), compensate_first=False)
            return self._run_steps(done)
        except CancelRequested:
            return self._cancel_in_flight()
        except LeaseLost as lost:
            # A warning: a healthy fleet loses leases only to crashes or pauses.
            emit("lease_lost", level=logging.WARNING, task_id=str(self.task.pk),
                 workflow=self.task.workflow, attempt=self.task.attempts, detail=lost.detail)
            self.report.outcome = "lease_lost"
            return self.report

    # --- the happy path ------------------------------------------------------------------

    def _run_steps(self, done: dict[int, object]) -> RunReport:
        todo = [i for i in range(len(self.plan)) if i not in done]
        outputs = {self.plan[i].name: done[i] for i in done}
        if not todo:  # crashed after the last checkpoint, before finishing
            return self._succeed(outputs[self.plan[-1].name])
        first = todo[0]
        if self.claim.started != first:  # the claim marks it running in the common case
            checkpoints.steps_write(self.lease, [checkpoints.started(
                first, self.plan[first].name, self._step_attempts(first) + 1, timezone.now())])
        for position, index in enumerate(todo):
            step = self.plan[index]
            self.current = (index, step)
            following = todo[position + 1] if position + 1 < len(todo) else None
            started = time.monotonic()
            # DEBUG: step_finished (with its duration) says the same at INFO; a
            # running step is visible in the admin and by its heartbeats.
            emit("step_started", level=logging.DEBUG, task_id=str(self.task.pk),
                 workflow=self.task.workflow, step=step.name, attempt=self.task.attempts)
            try:
                output = self._run_one(index, step, outputs, following)
            except Exception as exc:  # noqa: BLE001 - the step's failure, classified below
                # (LeaseLost, CancelRequested and SimulatedCrash are BaseExceptions
                # and pass through to execute().)
                return self._attempt_failed(index, step, exc)
            emit("step_finished", task_id=str(self.task.pk), workflow=self.task.workflow,
                 step=step.name, attempt=self.task.attempts,
                 duration_ms=round((time.monotonic() - started) * 1000, 3))
            self.report.steps_run.append(step.name)
            outputs[step.name] = output
            if following is None:
                self.report.outcome = "succeeded"
                return self.report
            faults.fault_point("after_checkpoint")
        raise AssertionError("unreachable: the last step returns")

    def _run_one(self, index: int, step: Step, outputs: dict, following: int | None):
        """Run one step body and record it (for the last step: with the task's
        success). An atomic step's body and record share its transaction; a
        plain step's record is a write of its own."""
        ctx = StepContext(lease=self.lease, workflow=self.task.workflow,
                          payload=self.task.payload, outputs=dict(outputs),
                          attempt=self.task.attempts, step_index=index, step_name=step.name,
                          progress=self._checkpoint_field(index, "progress"), atomic=step.atomic)
        next_step = None
        if following is not None:
            next_step = (following, self.plan[following].name, self._step_attempts(following) + 1)
        if step.atomic:
            with transaction.atomic():
                output = step.func(ctx)
                faults.fault_point("after_step_body")
                self._record(index, step, output, next_step)
            return output
        output = step.func(ctx)
        faults.fault_point("after_step_body")
        try:
            self._record(index, step, output, next_step)
        except CancelRequested:
            # The body ran and its effects are out there: record it so that the
            # cancel compensates it, then stop.
            checkpoints.steps_write(self.lease, [checkpoints.succeeded(
                index, step.name, output, timezone.now())], states=(TaskState.CANCELLING,))
            self.current = None
            raise
        return output

    def _record(self, index: int, step: Step, output, next_step) -> None:
        """One step boundary, all or nothing: this step's checkpoint and the next
        step's start — or, after the last step, the checkpoint with the task's
        success (one statement each on PostgreSQL)."""
        now = timezone.now()
        done = checkpoints.succeeded(index, step.name, output, now)
        if next_step is not None:
            checkpoints.steps_write(self.lease, [done, checkpoints.started(*next_step, now)])
            return
        self._transition("succeed", result=output, now=now, ttl=_ttl(self.workflow),
                         steps=[done])

    def _transition(self, name: str, **kwargs) -> None:
        """Apply transition `name` to the task as claimed, saved as a
        compare-and-set on our lease token and its state (no row read first);
        LeaseLost/CancelRequested when someone else changed it."""
        try:
            transition_apply(self.task, name, actor=f"worker:{self.lease.worker}",
                             fence_token=self.lease.token, **kwargs)
        except ConcurrentTransition:
            raise_lease_refusal(self.lease)

    def _succeed(self, result) -> RunReport:
        self._transition("succeed", result=result, now=timezone.now(), ttl=_ttl(self.workflow))
        self.report.outcome = "succeeded"
        return self.report

    # --- checkpoints read at claim time ------------------------------------------------------

    def _succeeded_outputs(self) -> dict[int, object]:
        done = {}
        for index, cp in self.claim.checkpoints.items():
            if index >= len(self.plan) or cp.name != self.plan[index].name:
                expected = repr(self.plan[index].name) if index < len(self.plan) else "no step"
                raise WorkflowChanged(
                    f"checkpoint {index} is step {cp.name!r} but {self.task.workflow} now has "
                    f"{expected} there; resuming would skip the wrong step")
            if cp.state == StepState.SUCCEEDED:
                done[index] = cp.output
        return done

    def _checkpoint_field(self, index: int, field: str):
        cp = self.claim.checkpoints.get(index)
        return getattr(cp, field) if cp else None

    def _step_attempts(self, index: int) -> int:
        return self._checkpoint_field(index, "attempts") or 0

    # --- endings ---------------------------------------------------------------------------

    def _attempt_failed(self, index: int, step: Step, exc: Exception) -> RunReport:
        error, error_type = _describe(exc)
        failed = checkpoints.StepRow(index, step.name, StepState.FAILED, error=error,
                                     finished_at=timezone.now())
        retryable = self.workflow.is_retryable(exc) and not isinstance(exc, WorkflowChanged)
        if retryable and self.task.attempts < self.task.max_attempts:
            delay = backoff_delay(self.workflow.policy, self.task.attempts)
            self._transition("schedule_retry", reason=f"{error_type}; retry in {delay:.3f}s",
                             error=error, error_type=error_type, steps=[failed],
                             next_attempt_at=timezone.now() + timedelta(seconds=delay))
            emit("retry_scheduled", task_id=str(self.task.pk), workflow=self.task.workflow,
                 attempt=self.task.attempts, delay_seconds=round(delay, 3),
                 error_type=error_type)
            self.report.outcome = "retrying"
            return self.report
        checkpoints.steps_write(self.lease, [failed])
        if retryable:
            error = f"attempts exhausted ({self.task.attempts}); last error: {error}"
        return self._fail(error, error_type, compensate_first=True)

    def _fail(self, error: str, error_type: str, *, compensate_first: bool) -> RunReport:
        if compensate_first:
            problem = compensate(self.lease, self.task, self.plan, states=(TaskState.RUNNING,))
            if problem:
                error, error_type = f"{error}; then {problem}", "CompensationFailed"
        self._transition("fail", reason=error_type, error=error, error_type=error_type,
                         now=timezone.now(), ttl=_ttl(self.workflow))
        self.report.outcome = "failed"
        return self.report

    def _cancel_in_flight(self) -> RunReport:
        if self.current is not None:
            index, step = self.current
            checkpoints.step_failed(self.lease, index=index, name=step.name,
                                    error="cancelled while running",
                                    states=(TaskState.CANCELLING,))
        return self._finish_cancel()

    def _finish_cancel(self) -> RunReport:
        problem = compensate(self.lease, self.task, self.plan, states=(TaskState.CANCELLING,))
        with transaction.atomic():
            task = fence_lock(self.lease, states=(TaskState.CANCELLING,))
            transition_apply(task, "finish_cancel", actor=f"worker:{self.lease.worker}",
                             reason="in-flight work ended, compensations ran",
                             now=timezone.now(), ttl=_ttl(self.workflow),
                             error=problem or "",
                             error_type="CompensationFailed" if problem else "")
        self.report.outcome = "cancelled"
        return self.report
