"""The compensation phase (saga): undo the succeeded steps, last first, then end
the task (docs/design.md, "Compensation").

A run enters it holding a `compensating` task (failed for good) or a
`cancelling` one (cancelled), under a token no one else has: its own
`compensate` transition, or a take-over (`resume`) — after its own attempt
was cancelled, or of a task whose previous holder died. Per step whose
compensation is owed (`succeeded` or `compensating`, and `compensable`):

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
error_type CompensationFailed naming the steps left uncompensated, if any.
A step still `running` when the phase starts was interrupted by a crash or
the cancel; it is recorded `failed`, and not compensated (it never
succeeded). Every record is fenced on the run's token: once recorded, a
compensation never runs again.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from workflows.backoff import backoff_delay
from workflows.engine import faults
from workflows.engine.runner import MISSING, StepFailure, describe
from workflows.engine.store import rows as step_rows
from workflows.errors import WorkerSignal
from workflows.models import StepCheckpoint
from workflows.observability import tracing
from workflows.states import TO_COMPENSATE, StepState, TaskState

if TYPE_CHECKING:
    from workflows.engine.context import StepContext
    from workflows.engine.runner import Run
    from workflows.registry import Step

DONE, DEFERRED = "done", "deferred"


def compensation_phase(run: Run) -> Iterator[str]:
    """Compensate what `run.task` owes, then end it (module docstring)."""
    checkpoints = run.store.checkpoints(run.task.pk)
    now = run.clock.now()
    interrupted = [step_rows.failed(i, cp.name, "interrupted before it finished: not "
                                                "compensated", now)
                   for i, cp in sorted(checkpoints.items()) if cp.state == StepState.RUNNING]
    if interrupted:
        run.write(interrupted)
    problems: list[str] = []
    for index in sorted(checkpoints, reverse=True):
        cp = checkpoints[index]
        if cp.state not in TO_COMPENSATE or not cp.compensable:
            continue
        outcome = yield from _compensate_one(run, cp, problems)
        if outcome == DEFERRED:
            return
    _end(run, problems)


def _compensate_one(run: Run, cp: StepCheckpoint,
                    problems: list[str]) -> Generator[str, None, str]:
    step = run.plan.step_at(cp.index, cp.name) if run.plan else None
    if step is None or step.compensation is None:
        reason = (run.unplanned.reason if run.unplanned else
                  f"the workflow no longer defines a compensation for step {cp.name!r}")
        _give_up(run, cp, reason, problems)
        return DONE
    cap = run.plan.workflow.max_attempts
    if cp.compensation_attempts >= cap:
        _give_up(run, cp, f"gave up after {cp.compensation_attempts} attempt(s); the last "
                          "one never finished (its worker was lost)", problems)
        return DONE
    attempt = cp.compensation_attempts + 1
    run.write([step_rows.compensation_started(cp.index, cp.name, attempt)])
    yield "compensation_started"
    ctx = run._context(cp.index, step, {}, atomic=step.compensation_atomic, compensating=True,
                       output=cp.output)
    with tracing.span("pilot.compensate", parent=run.task.traceparent, task_id=run.task_id,
                      workflow=run.task.workflow, step=cp.name, attempt=attempt) as span:
        try:
            _run_compensation(run, cp, step, ctx)
            failed = None
        except (_CompensationError, StepFailure) as failure:
            tracing.span_failed(span, failure.exc)
            failed = failure
    if failed is not None:
        return _failed(run, cp, attempt, failed.exc, problems)
    run.report.compensations_run.append(cp.name)
    run._emit("step_compensated", step=cp.name, attempt=attempt)
    yield "compensated"
    return DONE


def _run_compensation(run: Run, cp: StepCheckpoint, step: Step, ctx: StepContext) -> None:
    """The body and its `compensated` record: together (atomic), or in turn."""
    if step.compensation_atomic:
        def body() -> str:
            step.compensation(ctx)  # type: ignore[misc]  # compensable: it has one
            run.write([step_rows.compensated(cp.index, cp.name, run.clock.now())])
            return DONE

        run.atomically(body, lambda: _settle(run, cp))
        return
    _call(step, ctx)
    faults.fault_point("after_compensation_body")
    run.write([step_rows.compensated(cp.index, cp.name, run.clock.now())])


class _CompensationError(Exception):  # noqa: N818
    def __init__(self, exc: BaseException):
        self.exc = exc
        super().__init__(str(exc))


def _call(step: Step, ctx: StepContext) -> None:
    try:
        step.compensation(ctx)  # type: ignore[misc]  # compensable: it has one
    except WorkerSignal:
        raise
    except Exception as exc:  # noqa: BLE001 - the compensation's own failure
        raise _CompensationError(exc) from exc


def _settle(run: Run, cp: StepCheckpoint) -> Any:
    """An atomic compensation's transaction failed: did it commit anyway?"""
    row = run._read(lambda: StepCheckpoint.objects.filter(task_id=run.task.pk,
                                                          index=cp.index).first())
    return DONE if row is not None and row.state == StepState.COMPENSATED else MISSING


def _failed(run: Run, cp: StepCheckpoint, attempt: int, exc: BaseException,
            problems: list[str]) -> str:
    error, error_type = describe(exc)
    workflow = run.plan.workflow
    run._emit("compensation_failed", step=cp.name, attempt=attempt, error_type=error_type)
    if workflow.is_retryable(exc) and attempt < workflow.max_attempts:
        delay = backoff_delay(workflow.policy, attempt)
        run.transition("defer", reason=f"compensation of {cp.name} failed ({error}); "
                                       f"retry in {delay:.3f}s",
                       next_attempt_at=run.clock.now() + timedelta(seconds=delay))
        run.report.outcome = "deferred"
        return DEFERRED
    if workflow.is_retryable(exc):
        error = f"attempts exhausted ({attempt}); last error: {error}"
    _give_up(run, cp, error, problems)
    return DONE


def _give_up(run: Run, cp: StepCheckpoint, reason: str, problems: list[str]) -> None:
    run.write([step_rows.compensation_failed(cp.index, cp.name, reason, run.clock.now())])
    problems.append(f"{cp.name} ({reason})")


def _end(run: Run, problems: list[str]) -> None:
    now, task = run.clock.now(), run.task
    error, error_type = "", ""
    if problems:
        error_type = "CompensationFailed"
        error = "steps left uncompensated: " + "; ".join(problems)
    if task.state == TaskState.COMPENSATING:
        if problems:
            error = f"{task.error}; then {error}" if task.error else error
        else:
            error, error_type = task.error, task.error_type
        run.transition("fail", reason=error_type or "failed", error=error, error_type=error_type,
                       now=now)
        run.report.outcome = "failed"
        return
    run.transition("finish_cancel", reason="in-flight work ended, compensations ran",
                   error=error, error_type=error_type, now=now)
    run.report.outcome = "cancelled"
