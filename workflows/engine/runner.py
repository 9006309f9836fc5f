"""Running a task: one delivery's whole story (docs/design.md, "Execution").

    claim it (pending, or retrying and due → running); or take its compensation
      phase over (compensating / cancelling with no live lease); or "skipped"
    build the plan once
    forward, for each step without a succeeded checkpoint:
      mark it running — a fenced write, so a cancel that landed since the
        claim stops the run before the step starts
      run the body; record its success with the next step's start (one write
        per boundary; the last step's success with the task's)
    a step error → schedule_retry while attempts remain; otherwise fail —
      through the durable compensation phase (`compensate`) when succeeded
      steps have compensations (compensation.py)
    a cancel noticed (a write refused because the task is `cancelling` at our
      token + 1) → take the phase over under a new token (`resume`), record
      the step in flight, compensate, finish the cancel
    any other refusal → the lease is lost: stop, writing nothing more

Every write names the lease token this run holds (the store fences it).
After an error at an atomic step's COMMIT the run re-reads before deciding
(the reply may be lost while the commit happened); a write that cannot reach
the database is retried briefly and otherwise abandoned ("interrupted": the
lease runs out and the dispatcher recovers the task, as after a crash).

`task_run` never raises (worker isolation): django-q2 catches only Exception,
and a control-flow signal escaping it would kill the worker process.

The run is a generator of the points just after each durable write
(`Run.steps()`), so a test can interleave several workers, cancels, crashes
and dispatcher passes exactly there; `task_run` drives it to the end.

Trace context (docs/tracing.md): once the task is claimed, `task_run` binds
its stored trace id to every log record of the run, and with OpenTelemetry
the claim and each step body are spans under the task's `traceparent`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError, connection
from django_fsm import ConcurrentTransition

from workflows.backoff import backoff_delay
from workflows.engine import faults
from workflows.engine.context import StepContext
from workflows.engine.leases import (
    DbClock,
    Lease,
    Refused,
    classify,
    lease_length,
    worker_id,
)
from workflows.engine.plans import Plan, PlanUnavailable, owed_compensations
from workflows.engine.store import Claimed, StepRow, store
from workflows.engine.store import rows as step_rows
from workflows.errors import CancelRequested, LeaseLost, WorkerSignal, WorkflowChanged
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.observability import tracing
from workflows.observability.events import emit, emit_on_commit, log_context
from workflows.registry import Step
from workflows.states import TO_COMPENSATE, TaskState

T = TypeVar("T")
MISSING = object()
# Errors of the connection, not of the statement: worth retrying the same write.
TRANSIENT = (OperationalError, InterfaceError)
# How long a write that cannot reach the database is retried before the run
# gives up (the lease, far longer, then expires and the task is recovered).
WRITE_PATIENCE_SECONDS = 5.0


@dataclasses.dataclass
class RunReport:
    task_id: str | None
    # idle (nothing due) | skipped | succeeded | retrying | failed | cancelled | deferred |
    # lease_lost | interrupted | error
    outcome: str = ""
    steps_run: list[str] = dataclasses.field(default_factory=list)
    compensations_run: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class InFlight:
    """The step whose body is running (or just returned, not yet recorded)."""

    index: int
    step: Step
    output: object = MISSING  # a plain step's body returned this


class StepFailure(Exception):  # noqa: N818 - carries the step's own exception
    def __init__(self, exc: BaseException):
        self.exc = exc
        super().__init__(str(exc))


class Interrupted(Exception):  # noqa: N818 - a stop, not an error
    """The database could not be reached to record or decide something."""


def describe(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text, type(exc).__name__


def task_run(*, task_id: object, worker: str | None = None,
             drain_seconds: float = 0.0) -> RunReport:
    """Claim and run one task; never raises. A second call while the first runs,
    or for a finished, missing or not-yet-due task, returns "skipped" and
    changes nothing.

    With `drain_seconds`, go on — the database is the queue — claiming and
    running the next due task, in due order, for up to that long or until none
    is due: one message keeps a worker busy while work is due, and messages only
    wake workers up. Each run's success claims the next task in the same
    statement. Returns the report of the task the call named."""
    worker = worker or worker_id()
    deadline = time.monotonic() + drain_seconds if drain_seconds else None
    run = _drive(Run(task_id, worker, chain_until=deadline))
    if deadline is not None:
        tasks_drain(worker=worker, until=deadline, first=run.next_claimed)
    return run.report


def tasks_drain(*, worker: str | None = None, until: float,
                first: Claimed | None = None) -> int:
    """Claim and run due tasks until the monotonic time `until` or until none is
    due (a task already claimed, `first`, runs whatever the time). Returns how
    many ran; never raises."""
    worker, ran, claimed = worker or worker_id(), 0, first
    while claimed is not None or time.monotonic() < until:
        run = _drive(Run(None, worker, claimed=claimed, chain_until=until))
        if run.report.outcome in ("idle", "error", "interrupted"):
            break
        ran += 1
        claimed = run.next_claimed
    return ran


def _drive(run: Run) -> Run:
    """Run `run` to its end with its task and trace bound to every log line
    (the trace is known once the task is claimed)."""
    with contextlib.ExitStack() as bound:
        if run.task_id is not None:
            bound.enter_context(log_context(task_id=run.task_id))
        traced = False
        for _ in run.steps():
            if not traced and run.task is not None:
                traced = True
                bound.enter_context(log_context(task_id=run.task_id,
                                                trace_id=run.task.trace_id or None))
    return run


class Run:
    """One run: of task `task_id`, of a task already `claimed`, or (neither) of
    the next due task, if any. With `chain_until` (a monotonic deadline not yet
    passed) its success also claims the next due task (`next_claimed`)."""

    def __init__(self, task_id: object, worker: str, *, claimed: Claimed | None = None,
                 chain_until: float | None = None) -> None:
        if claimed is not None:
            task_id = claimed.task.pk
        self.task_id = str(task_id) if task_id is not None else None
        self.claimed = claimed
        self.chain_until = chain_until
        self.next_claimed: Claimed | None = None
        self.worker = worker
        self.actor = f"worker:{worker}"
        self.report = RunReport(self.task_id)
        self.store = store()
        # None until the claim (_hold) or the plan is built; only _drive and _emit()
        # can run before that, and they test for it.
        self.task: Task = None  # type: ignore[assignment]
        self.lease: Lease = None  # type: ignore[assignment]
        self.clock: DbClock = None  # type: ignore[assignment]
        self.plan: Plan = None  # type: ignore[assignment]
        self.unplanned: PlanUnavailable | None = None
        self.in_flight: InFlight | None = None
        self.succeeded_here: list[int] = []

    # --- the driver ----------------------------------------------------------------------

    def steps(self) -> Iterator[str]:
        """The run, pausing after every durable write (the name of the point)."""
        try:
            yield from self._run()
        except Interrupted as exc:
            self._emit("run_interrupted", level=logging.WARNING, detail=str(exc)[:300])
            self.report.outcome = "interrupted"
        except WorkerSignal as signal:  # every path handles its own; never let one escape
            self._lost(signal)
        except Exception as exc:  # noqa: BLE001 - worker isolation: log it, return normally
            logging.getLogger("pilot.runner").exception("run of task %s failed", self.task_id)
            self._emit("run_failed", level=logging.ERROR, error=describe(exc)[0][:500])
            self.report.outcome = "error"

    def _run(self) -> Iterator[str]:
        # A claim has no side effect before it commits: a connection error (or
        # SQLite's busy writer) is retried like a read.
        started_ns = tracing.now_ns()
        claimed: Claimed | None
        if self.claimed is not None:
            claimed, compensating = self.claimed, False
        elif self.task_id is None:
            claimed = self._read(lambda: self.store.claim_next(worker=self.worker,
                                                               lease=lease_length()))
            if claimed is None:
                self.report.outcome = "idle"
                return
            self.task_id = self.report.task_id = str(claimed.task.pk)
            compensating = False
        else:
            claimed = self._read(lambda: self.store.claim(self.task_id, worker=self.worker,
                                                          lease=lease_length()))
            compensating = claimed is None
            if compensating:
                claimed = self._read(lambda: self.store.resume(
                    self.task_id, worker=self.worker, lease=lease_length()))
        if claimed is None:
            self.report.outcome = "skipped"
            return
        self._hold(claimed)
        if started_ns:
            tracing.span_record("pilot.claim", parent=self.task.traceparent,
                                started_ns=started_ns, task_id=self.task_id,
                                workflow=self.task.workflow, attempt=self.task.attempts,
                                state=self.task.state, worker=self.worker)
        faults.fault_point("after_claim")
        yield "claimed"
        try:
            checkpoints = (self.store.checkpoints(self.task.pk)
                           if compensating or self.task.attempts > 1 else {})
            try:
                self.plan = Plan.build(self.task, checkpoints)
            except PlanUnavailable as problem:
                self.unplanned = problem
                yield from self._unplannable(problem, compensating)
                return
            if compensating:
                yield from self.compensate()
            else:
                yield from self._forward()
        except Refused as refused:
            yield from self._signalled(classify(refused))
        except WorkerSignal as signal:  # raised by ctx.heartbeat() inside a body
            yield from self._signalled(signal)

    def _hold(self, claimed: Claimed) -> None:
        self.task = claimed.task
        self.lease = claimed.lease
        self.clock = DbClock(claimed.db_now)
        lag = ((claimed.db_now - claimed.enqueued_at).total_seconds()
               if claimed.enqueued_at else None)
        # DEBUG: the claim's own line is its transition (task_transitioned); the queue
        # lag reaches the metrics either way.
        emit_on_commit("task_claimed", level=logging.DEBUG, task_id=str(self.task.pk),
                       workflow=self.task.workflow,
                       attempt=self.task.attempts, state=self.task.state,
                       queue_lag_seconds=lag, worker=self.worker,
                       trace_id=self.task.trace_id or None)

    def _signalled(self, signal: WorkerSignal) -> Iterator[str]:
        if isinstance(signal, CancelRequested) and self.task.state == TaskState.RUNNING:
            yield from self._take_over_cancel()
        else:
            self._lost(signal)

    def _lost(self, signal: BaseException) -> None:
        # A warning: a healthy fleet loses leases only to crashes, pauses and cancels.
        self._emit("lease_lost", level=logging.WARNING,
                   detail=getattr(signal, "detail", str(signal)))
        self.report.outcome = "lease_lost"

    # --- forward -------------------------------------------------------------------------

    def _forward(self) -> Iterator[str]:
        plan = self.plan
        outputs = {plan.steps[i].name: out for i, out in plan.done().items()}
        todo = plan.todo()
        if not todo:  # every step is recorded; the ending was lost with its worker
            self.transition("succeed", result=outputs[plan.steps[-1].name],
                            now=self.clock.now())
            self.report.outcome = "succeeded"
            return
        first = todo[0]
        self.write([step_rows.started(first, plan.steps[first].name,
                                      plan.attempts_of(first) + 1, self.clock.now())])
        for position, index in enumerate(todo):
            yield "step"
            step = plan.steps[index]
            following = todo[position + 1] if position + 1 < len(todo) else None
            self.in_flight = InFlight(index, step)
            started = time.monotonic()
            failed: StepFailure | None
            self._emit("step_started", level=logging.DEBUG, step=step.name)
            with tracing.span("pilot.step", parent=self.task.traceparent, task_id=self.task_id,
                              workflow=self.task.workflow, step=step.name, index=index,
                              attempt=self.task.attempts) as span:
                try:
                    output = self._step(index, step, outputs, following)
                except StepFailure as failure:
                    tracing.span_failed(span, failure.exc)
                    failed = failure
                else:
                    failed = None
            if failed is not None:
                self.in_flight = None
                yield from self._attempt_failed(index, step, failed.exc)
                return
            self.in_flight = None
            # DEBUG: a line per step is volume, not news (the audit trail and the
            # step-duration histogram, which still sees every event, carry it).
            self._emit("step_finished", level=logging.DEBUG, step=step.name,
                       duration_ms=round((time.monotonic() - started) * 1000, 3))
            self.report.steps_run.append(step.name)
            self.succeeded_here.append(index)
            outputs[step.name] = output
            if following is None:
                self.report.outcome = "succeeded"
                return
            faults.fault_point("after_checkpoint")

    def _context(self, index: int, step: Step, outputs: dict[str, Any], *, atomic: bool,
                 compensating: bool = False, output: Any = None) -> StepContext:
        return StepContext(lease=self.lease, workflow=self.task.workflow,
                           payload=self.task.payload, outputs=dict(outputs),
                           attempt=self.task.attempts, step_index=index, step_name=step.name,
                           progress=self.plan.progress_of(index), output=output,
                           atomic=atomic, compensating=compensating)

    def _step(self, index: int, step: Step, outputs: dict[str, Any],
              following: int | None) -> Any:
        ctx = self._context(index, step, outputs, atomic=step.atomic)
        if step.atomic:
            def body() -> Any:
                output = step.func(ctx)
                faults.fault_point("after_step_body")
                self._record(index, step, output, following)
                return output

            return self.atomically(body, lambda: self._settle_step(index, following))
        try:
            output = step.func(ctx)
        except Exception as exc:  # noqa: BLE001 - the step's failure, classified by the caller
            raise StepFailure(exc) from exc
        self.in_flight.output = output  # type: ignore[union-attr]  # set by _forward
        faults.fault_point("after_step_body")
        self._record(index, step, output, following)
        return output

    def _record(self, index: int, step: Step, output: Any, following: int | None) -> None:
        """One step boundary, all or nothing: this step's success with the next
        step's start — or, after the last step, with the task's success."""
        now = self.clock.now()
        done = step_rows.succeeded(index, step.name, output, now,
                                   compensable=step.compensation is not None)
        if following is None:
            chain = self.chain_until is not None and time.monotonic() < self.chain_until
            self.next_claimed = self.transition("succeed", result=output, now=now,
                                                steps=[done], then_claim=chain)
            return
        nxt = step_rows.started(following, self.plan.steps[following].name,
                                self.plan.attempts_of(following) + 1, now)
        self.write([done, nxt])

    def _settle_step(self, index: int, following: int | None) -> Any:
        """After an error in an atomic step's transaction: did it commit anyway
        (the reply to COMMIT was lost)? The step's output if so, else MISSING."""
        fresh = self._reread()
        if following is None:
            if fresh.state == TaskState.SUCCEEDED and self._last_change_was_ours("succeed"):
                self._adopt(fresh)
                return fresh.result
            return MISSING
        cp = self._read(lambda: StepCheckpoint.objects.filter(task_id=self.task.pk,
                                                              index=index).first())
        if cp is not None and cp.state == "succeeded":
            return cp.output
        return MISSING

    def _attempt_failed(self, index: int, step: Step, exc: BaseException) -> Iterator[str]:
        error, error_type = describe(exc)
        now = self.clock.now()
        failed = step_rows.failed(index, step.name, error, now)
        workflow = self.plan.workflow
        retryable = workflow.is_retryable(exc) and not isinstance(exc, WorkflowChanged)
        if retryable and self.task.attempts < self.task.max_attempts:
            delay = backoff_delay(workflow.policy, self.task.attempts)
            self.transition("schedule_retry", reason=f"{error_type}; retry in {delay:.3f}s",
                            error=error, error_type=error_type, steps=[failed],
                            next_attempt_at=now + timedelta(seconds=delay))
            self._emit("retry_scheduled", delay_seconds=round(delay, 3), error_type=error_type)
            self.report.outcome = "retrying"
            return
        if retryable:
            error = f"attempts exhausted ({self.task.attempts}); last error: {error}"
        yield from self._give_up(error, error_type, steps=[failed])

    def _give_up(self, error: str, error_type: str, *, steps: list[StepRow]) -> Iterator[str]:
        """Failed for good: through the compensation phase when something is owed."""
        now = self.clock.now()
        if self._owes_compensation():
            self.transition("compensate", reason=error_type, error=error, error_type=error_type,
                            steps=steps, worker=self.worker, now=now, lease=lease_length())
            yield "compensating"
            yield from self.compensate()
            return
        self.transition("fail", reason=error_type, error=error, error_type=error_type,
                        steps=steps, now=now)
        self.report.outcome = "failed"

    def _owes_compensation(self) -> bool:
        stored = self.plan.checkpoints if self.plan else {}
        if any(cp.state in TO_COMPENSATE and cp.compensable for cp in stored.values()):
            return True
        return bool(self.plan) and any(self.plan.steps[i].compensation is not None
                                       for i in self.succeeded_here)

    def _unplannable(self, problem: PlanUnavailable, compensating: bool) -> Iterator[str]:
        """The workflow cannot be planned (gone, its plan raises, changed under
        the checkpoints): no step can run. Owed compensations cannot run either;
        the phase records them as failed, naming the reason."""
        if not compensating:
            if owed_compensations([self.task.pk]):
                self.transition("compensate", reason=problem.error_type, error=problem.reason,
                                error_type=problem.error_type, worker=self.worker,
                                now=self.clock.now(), lease=lease_length())
                yield "compensating"
            else:
                self.transition("fail", reason=problem.error_type, error=problem.reason,
                                error_type=problem.error_type, now=self.clock.now())
                self.report.outcome = "failed"
                return
        yield from self.compensate()

    # --- cancel --------------------------------------------------------------------------

    def _take_over_cancel(self) -> Iterator[str]:
        """Our running attempt was cancelled: take the phase over under a new
        token, record the step in flight (done if its body returned, so that it
        is compensated; failed if the cancel interrupted it), compensate."""
        in_flight = self.in_flight
        claimed = self.store.resume(self.task.pk, worker=self.worker, lease=lease_length(),
                                    after_cancel_of=self.lease.token)
        if claimed is None:
            self._lost(LeaseLost(f"task {self.task.pk} changed again after its cancel"))
            return
        self._hold(claimed)
        self._emit("cancel_noticed", step=in_flight.step.name if in_flight else None)
        yield "resumed"
        try:
            if in_flight is not None:
                now = self.clock.now()
                step = in_flight.step
                if in_flight.output is not MISSING:
                    row = step_rows.succeeded(in_flight.index, step.name, in_flight.output, now,
                                              compensable=step.compensation is not None)
                else:
                    row = step_rows.failed(in_flight.index, step.name,
                                           step_rows.CANCELLED_WHILE_RUNNING, now)
                self.write([row])
            yield from self.compensate()
        except Refused as refused:
            self._lost(classify(refused))
        except WorkerSignal as signal:
            self._lost(signal)

    def compensate(self) -> Iterator[str]:
        from workflows.engine.compensation import compensation_phase

        yield from compensation_phase(self)

    # --- writes --------------------------------------------------------------------------

    def write(self, rows: list[StepRow]) -> None:
        """A fenced step write (extending the lease when it is due). Raises
        Refused. Outside a transaction, a database error is retried briefly —
        the write is idempotent — then the run is Interrupted."""
        renew = lease_length() if self.lease.clock.due() else None
        self._durably(lambda: self.store.write_steps(self.lease, rows, renew_for=renew))

    def transition(self, name: str, *, reason: str = "", then_claim: bool = False,
                   **kwargs: Any) -> Claimed | None:
        """Apply a transition to the task this run holds, fenced on its token.
        Raises Refused when the task changed. After a database error outside a
        transaction it re-reads: if the change committed (its reply was lost)
        the run goes on from there; if not, it tries again. With `then_claim`,
        returns the next due task the same statement claimed for this worker."""
        deadline = time.monotonic() + WRITE_PATIENCE_SECONDS
        following = None
        then_claim_for = (self.worker, lease_length()) if then_claim else None
        while True:
            if time.monotonic() > deadline:
                raise Interrupted(f"cannot record {name}: the database keeps failing")
            try:
                following = self.store.transition(self.task, name, at=self.clock.now(),
                                                  actor=self.actor, reason=reason,
                                                  then_claim_for=then_claim_for, **kwargs)
                break
            except ConcurrentTransition:
                raise self.store.refusal(self.lease) from None
            except TRANSIENT:
                if connection.in_atomic_block:
                    raise  # the enclosing atomic step settles it
                fresh = self._reread(deadline)
                if fresh.lease_token == self.lease.token + 1 and self._last_change_was_ours(name):
                    self._adopt(fresh)
                    break
                if fresh.lease_token != self.lease.token:
                    raise self.store.refusal(self.lease) from None
        self.lease = self.lease.advanced(self.task.lease_token)
        return following

    def atomically(self, body: Callable[[], Any], settle: Callable[[], Any]) -> Any:
        """Run `body` (which ends with its fenced record) in one transaction.
        After an error: if `settle()` finds it committed anyway, its result;
        if SQLite refused the transaction for another writer, run it again;
        otherwise StepFailure. Refusals and signals pass through (rolled back)."""
        for round_ in range(1, 4):
            lease = self.lease  # a transition inside moves it on; a rollback moves it back
            try:
                with self.store.atomic_step():
                    result = body()
                faults.fault_point("after_atomic_commit")
                return result
            except (Refused, WorkerSignal, Interrupted):
                self.lease, self.next_claimed = lease, None  # rolled back with it
                raise
            except Exception as exc:  # noqa: BLE001 - the body's, or the commit's
                self.lease, self.next_claimed = lease, None
                settled = settle()
                if settled is not MISSING:
                    return settled
                if self.store.is_lock_conflict(exc) and round_ < 3:
                    time.sleep(0.05 * round_)
                    continue
                raise StepFailure(exc) from exc
        raise AssertionError("unreachable")

    def _durably(self, write: Callable[[], object]) -> None:
        if connection.in_atomic_block:
            write()
            return
        deadline = time.monotonic() + WRITE_PATIENCE_SECONDS
        while True:
            try:
                write()
                return
            except TRANSIENT as exc:
                if time.monotonic() > deadline:
                    raise Interrupted(f"cannot record: {describe(exc)[0]}") from exc
                self._reconnect()

    def _read(self, query: Callable[[], T], deadline: float | None = None) -> T:
        """`query()`, retried across a lost connection until `deadline`."""
        deadline = deadline or time.monotonic() + WRITE_PATIENCE_SECONDS
        while True:
            try:
                return query()
            except TRANSIENT as exc:
                if time.monotonic() > deadline:
                    raise Interrupted(f"cannot read back: {describe(exc)[0]}") from exc
                self._reconnect()

    def _reread(self, deadline: float | None = None) -> Task:
        """The task as stored, whatever this run believed; the in-memory task is
        brought back to it when a change it made did not commit."""
        fresh = self._read(lambda: Task.objects.get(pk=self.task.pk), deadline)
        if fresh.lease_token == self.lease.token:
            self._adopt(fresh)
        return fresh

    def _adopt(self, fresh: Task) -> None:
        self.task.__dict__.update({f.attname: fresh.__dict__[f.attname]
                                   for f in Task._meta.concrete_fields})
        self.task._update_initial_state()

    def _last_change_was_ours(self, name: str) -> bool:
        last = (TaskTransition.objects.filter(task_id=self.task.pk).order_by("-id")
                .values_list("transition", "actor").first())
        return last == (name, self.actor[:200])

    @staticmethod
    def _reconnect() -> None:
        time.sleep(0.2)
        connection.close_if_unusable_or_obsolete()
        if connection.connection is not None and not connection.is_usable():
            connection.close()

    # --- helpers -------------------------------------------------------------------------

    def _emit(self, event: str, *, level: int = logging.INFO, **fields: Any) -> None:
        task = self.task
        base = {"task_id": self.task_id, "workflow": task.workflow if task else None,
                "attempt": task.attempts if task else None,
                "trace_id": (task.trace_id or None) if task else None}
        emit(event, level=level, **{**base, **fields})
