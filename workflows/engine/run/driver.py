"""Running a task: one delivery's whole story (docs/design.md, "Execution").

    claim it (pending, or retrying and due → running); or take its compensation
      phase over (compensating / cancelling with no live lease); or "skipped"
    hold it (held.py): the task, its token, the database's clock
    build the plan once
    run a phase — forward (forward.py), wait (waiting.py) or compensation
      (compensation.py) — and do what it hands back (outcomes.py): the wait
      phase at a wait step (`WaitReached`), then the forward phase on after it
      (`Waited`) or failing it (`WaitFailed`), or the end when it parked
      (`Ended("waiting")`); the compensation phase after `Compensate`; after
      `CancelNoticed`, take the phase over under a new token (`resume`) and
      compensate; stop at `Ended` or `Lost`

The driver only claims, holds and sequences: every write is the held
attempt's, every decision about a step is a phase's, and no phase calls
another.

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
import logging
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from workflows.engine import faults, shutdown
from workflows.engine.announce import announce
from workflows.engine.leases import (
    TRANSIENT,
    WRITE_PATIENCE_SECONDS,
    Interrupted,
    Lease,
    lease_length,
    reconnect,
    worker_id,
)
from workflows.engine.plans import Plan, PlanUnavailable
from workflows.engine.run.compensation import Compensation
from workflows.engine.run.forward import Forward, unplannable
from workflows.engine.run.held import Held, abandon, held_by_me
from workflows.engine.run.outcomes import (
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
from workflows.engine.run.waiting import Waiting
from workflows.engine.store import Claimed, store
from workflows.models import Task
from workflows.observability import tracing
from workflows.observability.events import Event, emit, emit_on_commit, log_context
from workflows.rules.errors import LeaseLost, WorkerSignal
from workflows.rules.states import TaskState

# How a run may end while its task is still held under its worker's lease.
ABANDONING = ("interrupted", "error", "lease_lost")


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
    if shutdown.stop_requested():  # the workers are stopping: claim nothing new
        return RunReport(str(task_id), outcome="skipped")
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
        if claimed is None and shutdown.stop_requested():
            break  # the workers are stopping: nothing new
        run = _drive(Run(None, worker, claimed=claimed, chain_until=until))
        if run.report.outcome in ("idle", "error", "interrupted", "released"):
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
        self.report = RunReport(self.task_id)
        self.store = store()
        self.held: Held | None = None  # from the claim on
        self.forward: Forward | None = None

    @property
    def task(self) -> Task | None:
        return self.held.task if self.held else None

    @property
    def lease(self) -> Lease | None:
        return self.held.lease if self.held else None

    @property
    def in_flight(self) -> InFlight | None:
        return self.forward.in_flight if self.forward else None

    @property
    def in_atomic_step(self) -> bool:
        return self.held is not None and self.held.in_atomic_step

    def steps(self) -> Iterator[str]:
        """The run, pausing after every durable write (the name of the point)."""
        try:
            yield from self._run()
        except Interrupted as exc:
            self._emit(Event.RUN_INTERRUPTED, level=logging.WARNING, detail=str(exc)[:300])
            self.report.outcome = "interrupted"
        except WorkerSignal as signal:  # every path handles its own; never let one escape
            self._lost(signal)
        except Exception as exc:  # noqa: BLE001 - worker isolation: log it, return normally
            logging.getLogger("pilot.runner").exception("run of task %s failed", self.task_id)
            self._emit(Event.RUN_FAILED, level=logging.ERROR, error=describe(exc)[0][:500])
            self.report.outcome = "error"
        if self.held is not None and self.report.outcome in ABANDONING:
            # It may still be held under this worker's lease (until it expires): never
            # this worker's lost claim to adopt.
            abandon(self.worker, self.held.task.pk)

    def _run(self) -> Generator[str, None, None]:
        started_ns = tracing.now_ns()
        claimed = self._claim_for_run()
        if claimed is None:
            self.report.outcome = "idle" if self.task_id is None else "skipped"
            return
        self.task_id = self.report.task_id = str(claimed.task.pk)
        held = self._hold(claimed)
        task = held.task
        if started_ns:
            tracing.span_record("pilot.claim", parent=task.traceparent, started_ns=started_ns,
                                task_id=self.task_id, workflow=task.workflow,
                                attempt=task.attempts, state=task.state, worker=self.worker)
        faults.fault_point("after_claim")
        yield "claimed"
        compensating = task.state != TaskState.RUNNING
        # A first claim has no checkpoints to read — unless it was adopted after a
        # lost reply (`_claim`): a run of this worker may have begun.
        checkpoints = (self.store.checkpoints(task.pk)
                       if compensating or task.attempts > 1 or claimed.adopted else {})
        plan: Plan | None = None
        unplanned: PlanUnavailable | None = None
        try:
            plan = Plan.build(task, checkpoints)
        except PlanUnavailable as problem:
            unplanned = problem
        nxt: Next
        if compensating:
            nxt = Compensate()
        elif plan is None:
            nxt = yield from unplannable(held, unplanned)  # type: ignore[arg-type]  # set
        else:
            self.forward = Forward(held, plan, self.report, chain_until=self.chain_until)
            nxt = yield from self.forward.run()
        while True:
            if isinstance(nxt, Compensate):
                nxt = yield from Compensation(self.held, plan, self.report,  # type: ignore[arg-type]
                                              unplanned=unplanned).run()
            elif isinstance(nxt, CancelNoticed):
                nxt = yield from self._take_over_cancel(nxt.in_flight, plan, unplanned)
            elif isinstance(nxt, WaitReached):
                nxt = yield from self._wait(nxt, plan)  # type: ignore[arg-type]  # planned
            elif isinstance(nxt, Ended):
                self.report.outcome, self.next_claimed = nxt.outcome, nxt.next_claimed
                return
            else:
                self._lost(nxt.signal)
                return

    def _wait(self, reached: WaitReached, plan: Plan) -> Generator[str, None, Next]:
        """The forward phase reached a wait step: the wait phase decides; the
        forward phase goes on after it, or fails it."""
        assert self.held is not None and self.forward is not None  # a forward phase ran
        decided = yield from Waiting(self.held, plan, reached).run()
        if isinstance(decided, Waited):
            return (yield from self.forward.proceed(decided))
        if isinstance(decided, WaitFailed):
            return (yield from self.forward.fail_wait(decided))
        return decided

    def _claim_for_run(self) -> Claimed | None:
        if self.claimed is not None:
            return self.claimed
        worker, lease = self.worker, lease_length()
        if self.task_id is None:
            return self._claim(lambda: self.store.claim_next(worker=worker, lease=lease))
        task_id = self.task_id
        claimed = self._claim(lambda: self.store.claim(task_id, worker=worker, lease=lease))
        if claimed is None:
            claimed = self._claim(lambda: self.store.resume(task_id, worker=worker, lease=lease))
        return claimed

    def _claim(self, claim: Callable[[], Claimed | None]) -> Claimed | None:
        """`claim()` — a claim, the next claim from the queue, or a take-over —
        across a lost connection. A claim has no side effect before it commits,
        but its reply may be lost after it did: before trying again, look for the
        task this worker now holds by its own claim (`store.held_by`) and adopt
        it, so nothing is left `running` under a lease nobody uses and no attempt
        is spent on work that never ran (review turn 3, F3). Interrupted when the
        database stays unreachable."""
        deadline = time.monotonic() + WRITE_PATIENCE_SECONDS
        while True:
            try:
                claimed = claim()
                announce(claimed)
                faults.fault_point("claim_reply")
                return claimed
            except TRANSIENT as exc:
                if time.monotonic() > deadline:
                    raise Interrupted(f"cannot claim: {describe(exc)[0]}") from exc
                reconnect()
                named = self.task_id if self.claimed is None else None
                held = held_by_me(self.store, self.worker, task_id=named, deadline=deadline)
                if held is not None:
                    return held

    def _hold(self, claimed: Claimed) -> Held:
        self.held = held = Held(claimed, self.store)
        task = held.task
        lag = ((claimed.db_now - claimed.enqueued_at).total_seconds()
               if claimed.enqueued_at else None)
        # DEBUG: the claim's own line is its transition (task_transitioned); the queue
        # lag reaches the metrics either way.
        emit_on_commit(Event.TASK_CLAIMED, level=logging.DEBUG, task_id=str(task.pk),
                       workflow=task.workflow, attempt=task.attempts, state=task.state,
                       queue_lag_seconds=lag, worker=self.worker,
                       trace_id=task.trace_id or None)
        return held

    def _take_over_cancel(self, in_flight: InFlight | None, plan: Plan | None,
                          unplanned: PlanUnavailable | None) -> Generator[str, None, Next]:
        """Our running attempt was cancelled: take the phase over under a new
        token; the compensation phase records the step in flight first."""
        cancelled = self.held
        assert cancelled is not None  # a phase ran: held
        claimed = self.store.resume(cancelled.task.pk, worker=self.worker, lease=lease_length(),
                                    after_cancel_of=cancelled.task.lease_token)
        announce(claimed)
        if claimed is None:
            return Lost(LeaseLost(f"task {cancelled.task.pk} changed again after its cancel"))
        held = self._hold(claimed)
        held.emit(Event.CANCEL_NOTICED, step=in_flight.step.name if in_flight else None)
        yield "resumed"
        return (yield from Compensation(held, plan, self.report, unplanned=unplanned,
                                        in_flight=in_flight).run())

    def _lost(self, signal: BaseException) -> None:
        # A warning: a healthy fleet loses leases only to crashes, pauses and cancels.
        self._emit(Event.LEASE_LOST, level=logging.WARNING,
                   detail=getattr(signal, "detail", str(signal)))
        self.report.outcome = "lease_lost"

    def _emit(self, event: str, *, level: int = logging.INFO, **fields: Any) -> None:
        if self.held is not None:
            self.held.emit(event, level=level, **fields)
            return
        emit(event, level=level, task_id=self.task_id, workflow=None, attempt=None,
             trace_id=None, **fields)
