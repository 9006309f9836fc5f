"""The compensation phase (saga): undo the succeeded steps, last first, then end
the task (docs/design.md, "Compensation").

A run enters it holding a `compensating` task (failed for good) or a
`cancelling` one (cancelled), under a token no one else has: its own
`compensate` transition, or a take-over (`resume`) — after its own attempt
was cancelled (then the step in flight is recorded first: succeeded if its
body returned, so that it is compensated; failed if the cancel interrupted
it), or of a task whose previous holder died. Per step whose compensation is
owed (`succeeded` or `compensating`, and `compensable`):

    record `compensating`, attempts + 1 — before the body, so a compensation
      that kills its worker is counted and, at the workflow's max_attempts,
      given up (`compensation_failed`) instead of looping
    run the compensation: an atomic one inside the transaction that records
      it `compensated` (exactly once); a plain one, then its record
      (at least once, with its own key `<task>:<step>:compensate`)
    a retryable error with attempts left → `defer`: the task waits its
      backoff and any worker resumes it; otherwise `compensation_failed`,
      and the remaining compensations still run

At the end: `fail` (compensating) or `finish_cancel` (cancelling), with
error_type CompensationFailed naming the steps left uncompensated, if any —
read from the stored checkpoints, not from this run's memory: the phase spans
runs (a `defer`, a crash and a take-over), and a step given up by an earlier
run is as uncompensated as one given up by this one.
A step still `running` when the phase starts was interrupted by a crash or
the cancel; it is recorded `failed`, and not compensated (it never
succeeded). Every record is fenced on the run's token: once recorded, a
compensation never runs again. The phase returns what comes next
(outcomes.py): `Ended` — failed, cancelled or deferred — or `Lost`.
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import timedelta
from typing import Any

from workflows.engine import faults
from workflows.engine.plans import Plan, PlanUnavailable
from workflows.engine.run.held import Held, StepFailure
from workflows.engine.run.outcomes import MISSING, Ended, InFlight, Lost, Next, RunReport, describe
from workflows.engine.store import rows as step_rows
from workflows.models import StepCheckpoint
from workflows.observability import tracing
from workflows.observability.events import Event
from workflows.registry import Step
from workflows.rules.backoff import backoff_delay
from workflows.rules.errors import WorkerSignal
from workflows.rules.states import TO_COMPENSATE, StepState, TaskState

DONE, DEFERRED = "done", "deferred"


class Compensation:
    """The compensation phase of `held`'s attempt; `plan` is None when the
    workflow could not be planned (`unplanned` says why: nothing can run)."""

    def __init__(self, held: Held, plan: Plan | None, report: RunReport, *,
                 unplanned: PlanUnavailable | None = None,
                 in_flight: InFlight | None = None) -> None:
        self.held, self.plan, self.report = held, plan, report
        self.unplanned, self.in_flight = unplanned, in_flight

    def run(self) -> Generator[str, None, Next]:
        try:
            return (yield from self._phase())
        except WorkerSignal as signal:
            return Lost(signal)

    def _phase(self) -> Generator[str, None, Next]:
        held = self.held
        if self.in_flight is not None:
            held.write([_in_flight_row(self.in_flight, held.clock.now())])
        checkpoints = held.store.checkpoints(held.task.pk)
        now = held.clock.now()
        interrupted = [step_rows.failed(i, cp.name, "interrupted before it finished: not "
                                                    "compensated", now)
                       for i, cp in sorted(checkpoints.items()) if cp.state == StepState.RUNNING]
        if interrupted:
            held.write(interrupted)
        for index in sorted(checkpoints, reverse=True):
            cp = checkpoints[index]
            if cp.state not in TO_COMPENSATE or not cp.compensable:
                continue
            outcome = yield from self._compensate_one(cp)
            if outcome == DEFERRED:
                return Ended("deferred")
        return self._end()

    def _compensate_one(self, cp: StepCheckpoint) -> Generator[str, None, str]:
        held, plan = self.held, self.plan
        step = plan.step_at(cp.index, cp.name) if plan else None
        if plan is None or step is None or step.compensation is None:
            reason = (self.unplanned.reason if self.unplanned else
                      f"the workflow no longer defines a compensation for step {cp.name!r}")
            self._give_up(cp, reason)
            return DONE
        cap = plan.workflow.max_attempts
        if cp.compensation_attempts >= cap:
            self._give_up(cp, f"gave up after {cp.compensation_attempts} attempt(s); the last "
                              "one never finished (its worker was lost)")
            return DONE
        attempt = cp.compensation_attempts + 1
        held.write([step_rows.compensation_started(cp.index, cp.name, attempt)])
        yield "compensation_started"
        ctx = held.context(cp.index, step, outputs={}, progress=plan.progress_of(cp.index),
                           atomic=step.compensation_atomic, compensating=True, output=cp.output)
        task = held.task
        with tracing.span("pilot.compensate", parent=task.traceparent, task_id=str(task.pk),
                          workflow=task.workflow, step=cp.name, attempt=attempt) as span:
            try:
                self._run_compensation(cp, step, ctx)
                failed = None
            except (_CompensationError, StepFailure) as failure:
                tracing.span_failed(span, failure.exc)
                failed = failure
        if failed is not None:
            return self._failed(cp, attempt, failed.exc)
        self.report.compensations_run.append(cp.name)
        held.emit(Event.STEP_COMPENSATED, step=cp.name, attempt=attempt)
        yield "compensated"
        return DONE

    def _run_compensation(self, cp: StepCheckpoint, step: Step, ctx: Any) -> None:
        """The body and its `compensated` record: together (atomic), or in turn."""
        held = self.held
        if step.compensation_atomic:
            def body() -> str:
                step.compensation(ctx)  # type: ignore[misc]  # compensable: it has one
                held.write([step_rows.compensated(cp.index, cp.name, held.clock.now())])
                return DONE

            held.atomically(body, lambda: self._settle(cp))
            return
        _call(step, ctx)
        faults.fault_point("after_compensation_body")
        held.write([step_rows.compensated(cp.index, cp.name, held.clock.now())])

    def _settle(self, cp: StepCheckpoint) -> Any:
        """An atomic compensation's transaction failed: did it commit anyway?"""
        row = self.held.checkpoint(cp.index)
        return DONE if row is not None and row.state == StepState.COMPENSATED else MISSING

    def _failed(self, cp: StepCheckpoint, attempt: int, exc: BaseException) -> str:
        held = self.held
        error, error_type = describe(exc)
        workflow = self.plan.workflow  # type: ignore[union-attr]  # a body ran: planned
        held.emit(Event.COMPENSATION_FAILED, step=cp.name, attempt=attempt,
                  error_type=error_type)
        if workflow.is_retryable(exc) and attempt < workflow.max_attempts:
            delay = backoff_delay(workflow.policy, attempt)
            held.transition("defer", reason=f"compensation of {cp.name} failed ({error}); "
                                            f"retry in {delay:.3f}s",
                            next_attempt_at=held.clock.now() + timedelta(seconds=delay))
            return DEFERRED
        if workflow.is_retryable(exc):
            error = f"attempts exhausted ({attempt}); last error: {error}"
        self._give_up(cp, error)
        return DONE

    def _give_up(self, cp: StepCheckpoint, reason: str) -> None:
        self.held.write([step_rows.compensation_failed(cp.index, cp.name, reason,
                                                       self.held.clock.now())])

    def _uncompensated(self) -> list[str]:
        """The steps this phase gave up on, in any of its runs, as stored: each
        `compensation_failed` step that had a compensation, with its reason."""
        stored = self.held.store.checkpoints(self.held.task.pk)
        return [f"{cp.name} ({cp.error.removeprefix(step_rows.COMPENSATION_FAILED_PREFIX)})"
                for _, cp in sorted(stored.items(), reverse=True)
                if cp.state == StepState.COMPENSATION_FAILED and cp.compensable]

    def _end(self) -> Ended:
        held = self.held
        now, task = held.clock.now(), held.task
        problems = self._uncompensated()
        error, error_type = "", ""
        if problems:
            error_type = "CompensationFailed"
            error = "steps left uncompensated: " + "; ".join(problems)
        if task.state == TaskState.COMPENSATING:
            if problems:
                error = f"{task.error}; then {error}" if task.error else error
            else:
                error, error_type = task.error, task.error_type
            held.transition("fail", reason=error_type or "failed", error=error,
                            error_type=error_type, now=now)
            return Ended("failed")
        held.transition("finish_cancel", reason=self._cancel_reason(), error=error,
                        error_type=error_type, now=now)
        return Ended("cancelled")

    def _cancel_reason(self) -> str:
        """What the cancel did, as stored: the step it ended in flight, the
        compensations that ran — or that there was nothing to compensate."""
        stored = self.held.store.checkpoints(self.held.task.pk)
        done = [cp.name for _, cp in sorted(stored.items(), reverse=True)
                if cp.state == StepState.COMPENSATED]
        parts = [f"step {self.in_flight.step.name} ended in flight"] if self.in_flight else []
        parts.append(f"compensated {', '.join(done)}" if done else "nothing to compensate")
        return "cancel finished: " + "; ".join(parts)


def _in_flight_row(in_flight: InFlight, now: Any) -> step_rows.StepRow:
    step = in_flight.step
    if in_flight.output is not MISSING:
        return step_rows.succeeded(in_flight.index, step.name, in_flight.output, now,
                                   compensable=step.compensation is not None)
    return step_rows.failed(in_flight.index, step.name, step_rows.CANCELLED_WHILE_RUNNING, now)


class _CompensationError(Exception):  # noqa: N818
    def __init__(self, exc: BaseException):
        self.exc = exc
        super().__init__(str(exc))


def _call(step: Step, ctx: Any) -> None:
    try:
        step.compensation(ctx)  # type: ignore[misc]  # compensable: it has one
    except WorkerSignal:
        raise
    except Exception as exc:  # noqa: BLE001 - the compensation's own failure
        raise _CompensationError(exc) from exc
