"""The forward phase (docs/design.md, "Execution"): the plan's steps without a
succeeded checkpoint, in order, through the held attempt.

    mark the first step running — a fenced write, so a cancel that landed
      since the claim stops the run before the step starts
    run the body; record its success with the next step's start (one write
      per boundary; the last step's success with the task's, which may claim
      the next due task in the same statement)
    a step error → `schedule_retry` while attempts remain; otherwise fail —
      or, when succeeded steps have compensations, `compensate`, and hand the
      compensation phase to the driver

When the workers are stopping (engine/shutdown.py), a step's success is
recorded with the task's `release` instead of the next step's start: the run
ends ("released") and the next start of the workers resumes at that step.

At a wait step it hands the decision to the wait phase (`WaitReached`) and,
when the wait phase recorded the step, goes on after it (`proceed`) or fails
it like any step (`fail_wait`).

It returns what comes next (outcomes.py): `Ended`, `Compensate`, or — when a
write or a heartbeat found the task changed — `CancelNoticed` with the step in
flight, or `Lost`. An atomic step's body runs inside the transaction that
records it; after an error there the phase reads back before deciding (the
reply to COMMIT may be lost while the commit happened).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from datetime import timedelta
from typing import Any

from workflows.engine import failures, faults, shutdown
from workflows.engine.leases import lease_length
from workflows.engine.plans import Plan, PlanUnavailable, owed_compensations
from workflows.engine.run.held import Held, StepFailure
from workflows.engine.run.outcomes import (
    MISSING,
    CancelNoticed,
    Compensate,
    Ended,
    InFlight,
    Lost,
    Next,
    RunReport,
    Waited,
    WaitFailed,
    WaitReached,
    describe,
)
from workflows.engine.store import Claimed
from workflows.engine.store import rows as step_rows
from workflows.observability import tracing
from workflows.observability.events import Event
from workflows.registry import Step
from workflows.rules.backoff import backoff_delay
from workflows.rules.errors import CancelRequested, WorkerSignal, WorkflowChanged
from workflows.rules.states import TO_COMPENSATE, StepState, TaskState

Recorded = tuple[Any, Claimed | None]  # a step's output, and the task its success claimed


class Forward:
    """The forward phase of `held`'s attempt over `plan`. With `chain_until` (a
    monotonic deadline) the last step's success also claims the next due task."""

    def __init__(self, held: Held, plan: Plan, report: RunReport, *,
                 chain_until: float | None = None) -> None:
        self.held, self.plan, self.report = held, plan, report
        self.chain_until = chain_until
        self.in_flight: InFlight | None = None
        self.succeeded_here: list[int] = []
        # The steps this phase runs (plan.todo()), the output of each step so far,
        # and the position in `todo` of the step it is at.
        self.todo: list[int] = []
        self.outputs: dict[str, Any] = {}
        self.position = 0
        # Whether the last step's success asked to claim the next task with it;
        # whether a step's success released the task (the workers are stopping).
        self.chained = False
        self.released = False

    def run(self) -> Generator[str, None, Next]:
        return (yield from self._guarded(self._steps()))

    def proceed(self, waited: Waited) -> Generator[str, None, Next]:
        """After the wait phase recorded the wait step this phase reached: go on
        with the step after it (or end, when it was the last)."""
        return (yield from self._guarded(self._after_wait(waited)))

    def fail_wait(self, failed: WaitFailed) -> Generator[str, None, Next]:
        """The wait this phase reached ended without what it waited for: the
        step failed, like any step."""
        index = self.todo[self.position]
        return (yield from self._guarded(
            self._attempt_failed(index, self.plan.steps[index], failed.exc)))

    def _guarded(self, phase: Generator[str, None, Next]) -> Generator[str, None, Next]:
        try:
            return (yield from phase)
        except CancelRequested:
            return CancelNoticed(self.in_flight)
        except WorkerSignal as signal:
            return Lost(signal)

    def _steps(self) -> Generator[str, None, Next]:
        held, plan = self.held, self.plan
        self.outputs = {plan.steps[i].name: out for i, out in sorted(plan.done().items())}
        self.todo = plan.todo()
        if not self.todo:  # every step is recorded; the ending was lost with its worker
            held.transition("succeed", result=self.outputs[plan.steps[-1].name],
                            now=held.clock.now())
            return Ended("succeeded")
        first = self.todo[0]
        held.write([step_rows.started(first, plan.steps[first].name,
                                      plan.attempts_of(first) + 1, held.clock.now())])
        return (yield from self._from(0))

    def _from(self, start: int) -> Generator[str, None, Next]:
        """The steps of `todo` from position `start` on; the one at `start` is
        recorded as started."""
        held, plan, todo = self.held, self.plan, self.todo
        for position in range(start, len(todo)):
            index = todo[position]
            yield "step"
            step = plan.steps[index]
            following = todo[position + 1] if position + 1 < len(todo) else None
            self.position = position
            self.in_flight = InFlight(index, step)
            if step.wait is not None:  # the wait phase decides (driver.py)
                return WaitReached(index, step, following)
            started = time.monotonic()
            failed: StepFailure | None = None
            held.emit(Event.STEP_STARTED, level=logging.DEBUG, step=step.name)
            task = held.task
            with tracing.span("pilot.step", parent=task.traceparent, task_id=str(task.pk),
                              workflow=task.workflow, step=step.name, index=index,
                              attempt=task.attempts) as span:
                try:
                    output, next_claimed = self._step(index, step, self.outputs, following)
                except StepFailure as failure:
                    tracing.span_failed(span, failure.exc)
                    failed = failure
            self.in_flight = None
            if failed is not None:
                return (yield from self._attempt_failed(index, step, failed.exc))
            # DEBUG: a line per step is volume, not news (the audit trail and the
            # step-duration histogram, which still sees every event, carry it).
            held.emit(Event.STEP_FINISHED, level=logging.DEBUG, step=step.name,
                      duration_ms=round((time.monotonic() - started) * 1000, 3))
            self._done(index, step, output)
            if following is None:
                return Ended("succeeded", next_claimed)
            if self.released:  # the workers are stopping: the next start resumes it here
                return Ended("released")
            faults.fault_point("after_checkpoint")
        raise AssertionError("unreachable: the last step returns")

    def _after_wait(self, waited: Waited) -> Generator[str, None, Next]:
        index = self.todo[self.position]
        self.in_flight = None
        self._done(index, self.plan.steps[index], waited.output)
        if waited.last:
            return Ended("succeeded")
        faults.fault_point("after_checkpoint")
        return (yield from self._from(self.position + 1))

    def _done(self, index: int, step: Step, output: Any) -> None:
        self.report.steps_run.append(step.name)
        self.succeeded_here.append(index)
        self.outputs[step.name] = output

    def _step(self, index: int, step: Step, outputs: dict[str, Any],
              following: int | None) -> Recorded:
        ctx = self.held.context(index, step, outputs=outputs,
                                progress=self.plan.progress_of(index), atomic=step.atomic)
        if step.atomic:
            def body() -> Recorded:
                output = step.func(ctx)
                faults.fault_point("after_step_body")
                return output, self._record(index, step, output, following)

            return self.held.atomically(body, lambda: self._settle(index, following))
        try:
            output = step.func(ctx)
        except Exception as exc:  # noqa: BLE001 - the step's failure, classified by the caller
            raise StepFailure(exc) from exc
        self.in_flight.output = output  # type: ignore[union-attr]  # set by _steps
        faults.fault_point("after_step_body")
        return output, self._record(index, step, output, following)

    def _record(self, index: int, step: Step, output: Any,
                following: int | None) -> Claimed | None:
        """One step boundary (Held.record_step); the last step's success also
        claims the next due task while the chain's deadline has not passed."""
        stopping = shutdown.stop_requested()
        self.chained = (following is None and self.chain_until is not None
                        and time.monotonic() < self.chain_until and not stopping)
        self.released = following is not None and stopping
        return self.held.record_step(self.plan, index, step, output, following,
                                     then_claim=self.chained, release=self.released)

    def _settle(self, index: int, following: int | None) -> Recorded | object:
        """After an error in an atomic step's transaction: did it commit anyway
        (the reply to COMMIT was lost)? What it recorded if so, else MISSING."""
        held = self.held
        if following is None:
            fresh = held.reread()
            if fresh.state == TaskState.SUCCEEDED and held.last_change_was_ours("succeed"):
                held.adopt(fresh)
                # The success may have claimed the next task in the same commit.
                return fresh.result, (held.claimed_next() if self.chained else None)
            return MISSING
        cp = held.checkpoint(index)
        if cp is not None and cp.state == StepState.SUCCEEDED:
            return cp.output, None
        return MISSING

    def _attempt_failed(self, index: int, step: Step,
                        exc: BaseException) -> Generator[str, None, Next]:
        held = self.held
        error, error_type = describe(exc)
        now = held.clock.now()
        stored = self.plan.checkpoints.get(index)
        failed = step_rows.failed(index, step.name, error, now, failures=failures.appended(
            stored.failures if stored is not None else None,
            failures.entry(exc, attempt=held.task.attempts, at=now)))
        workflow = self.plan.workflow
        retryable = workflow.is_retryable(exc) and not isinstance(exc, WorkflowChanged)
        if retryable and held.task.attempts < held.task.max_attempts:
            delay = backoff_delay(workflow.policy, held.task.attempts)
            held.transition("schedule_retry", reason=f"{error_type}; retry in {delay:.3f}s",
                            error=error, error_type=error_type, steps=[failed],
                            next_attempt_at=now + timedelta(seconds=delay))
            held.emit(Event.RETRY_SCHEDULED, delay_seconds=round(delay, 3), error_type=error_type)
            return Ended("retrying")
        if retryable:
            error = f"attempts exhausted ({held.task.attempts}); last error: {error}"
        if self._owes_compensation():
            return (yield from give_up_compensating(held, error, error_type, steps=[failed]))
        held.transition("fail", reason=error_type, error=error, error_type=error_type,
                        steps=[failed], now=now)
        return Ended("failed")

    def _owes_compensation(self) -> bool:
        stored = self.plan.checkpoints
        if any(cp.state in TO_COMPENSATE and cp.compensable for cp in stored.values()):
            return True
        return any(self.plan.steps[i].compensation is not None for i in self.succeeded_here)


def give_up_compensating(held: Held, error: str, error_type: str, *,
                         steps: list[step_rows.StepRow] | None = None
                         ) -> Generator[str, None, Next]:
    """Failed for good with compensations owed: `compensate`, under a fresh lease."""
    held.transition("compensate", reason=error_type, error=error, error_type=error_type,
                    steps=steps or [], worker=held.worker, now=held.clock.now(),
                    lease=lease_length())
    yield "compensating"
    return Compensate()


def unplannable(held: Held, problem: PlanUnavailable) -> Generator[str, None, Next]:
    """The workflow cannot be planned (gone, its plan raises, changed under the
    checkpoints): no step can run. Owed compensations cannot run either; the
    compensation phase records them as failed, naming the reason."""
    try:
        if owed_compensations([held.task.pk]):
            return (yield from give_up_compensating(held, problem.reason, problem.error_type))
        held.transition("fail", reason=problem.error_type, error=problem.reason,
                        error_type=problem.error_type, now=held.clock.now())
        return Ended("failed")
    except CancelRequested:
        return CancelNoticed(None)
    except WorkerSignal as signal:
        return Lost(signal)
