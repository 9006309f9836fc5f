"""The held attempt (docs/design.md, "Execution"): a task this worker holds
under a lease, with the database's clock — the one object every phase of a
run writes through.

Its token is the task's own `lease_token`, held once: every write names it,
the store fences it, and a transition this attempt applies moves it on (the
store moves the task's, and the lease is read from the task). A refused write
becomes, here and nowhere else, what the worker does next (`leases.classify`):
`CancelRequested` when the only change is an operator's cancel of this very
run, `LeaseLost` otherwise — phases see signals, never refusals.

Writes survive a lost connection: a step write is idempotent and is retried
briefly; a transition whose reply was lost is read back and adopted when the
change was this attempt's own (the task's next version, and its last audit
row by this worker); a claim made in the same statement is found again by
`held_by_me`. A write that cannot reach the database within
WRITE_PATIENCE_SECONDS raises `Interrupted`: the lease runs out and the
dispatcher recovers the task, as after a crash.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import transaction
from django_fsm import ConcurrentTransition

from workflows.engine import faults
from workflows.engine.announce import announce
from workflows.engine.context import StepContext
from workflows.engine.leases import (
    TRANSIENT,
    WRITE_PATIENCE_SECONDS,
    DbClock,
    Interrupted,
    Lease,
    LeaseClock,
    Refused,
    classify,
    lease_length,
    patiently,
)
from workflows.engine.plans import Plan
from workflows.engine.run.outcomes import MISSING
from workflows.engine.store import Claimed, OrmStore, StepRow
from workflows.engine.store import rows as step_rows
from workflows.models import StepCheckpoint, Task, TaskSignal, TaskTransition
from workflows.observability.events import Event, emit
from workflows.registry import Step
from workflows.rules.errors import PilotError, ValidationFailed
from workflows.rules.states import Source

T = TypeVar("T")
# Per worker id (this process's), the tasks its runs gave up on while still holding
# them (interrupted, an error, a lost lease): never a lost claim of its own to adopt.
_abandoned: dict[str, collections.deque[Any]] = {}


class StepFailure(Exception):  # noqa: N818 - carries the step's own exception
    def __init__(self, exc: BaseException):
        self.exc = exc
        super().__init__(str(exc))


def abandon(worker: str, task_id: Any) -> None:
    """A run of `worker` gave `task_id` up while it may still hold it (until its
    lease expires)."""
    _abandoned.setdefault(worker, collections.deque(maxlen=64)).append(task_id)


def held_by_me(store: OrmStore, worker: str, *, task_id: Any = None,
               besides: tuple[Any, ...] = (), deadline: float | None = None) -> Claimed | None:
    """The task `worker` holds by its own latest claim or take-over whose reply
    was lost (`task_id`'s, when named; never one of `besides` nor one a run of
    this worker gave up on), adopted; None when there is none."""
    others = [*_abandoned.get(worker, ()), *besides]
    held = read(lambda: store.held_by(worker=worker, task_id=task_id, besides=others),
                deadline)
    if held is not None:
        emit(Event.CLAIM_ADOPTED, level=logging.WARNING, task_id=str(held.task.pk),
             workflow=held.task.workflow, attempt=held.task.attempts,
             trace_id=held.task.trace_id or None, adopted=str(held.task.pk))
    return held


def read(query: Callable[[], T], deadline: float | None = None) -> T:
    """`query()`, retried across a lost connection until `deadline`."""
    return patiently(query, doing="read back", deadline=deadline)


class Held:
    """The attempt a claim (or a take-over) gave `worker`: `task` as stored under
    its token, the database's `clock`, and every write the run makes."""

    def __init__(self, claimed: Claimed, store: OrmStore) -> None:
        self.task: Task = claimed.task
        self.worker = claimed.worker
        self.actor = f"worker:{claimed.worker}"
        self.store = store
        self.clock = DbClock(claimed.db_now)
        self.renewal = LeaseClock()
        # Inside an atomic step's transaction: its errors are settled by
        # `atomically`, not retried write by write.
        self.in_atomic_step = False

    @property
    def lease(self) -> Lease:
        return Lease(self.task.pk, self.task.lease_token, self.worker, self.renewal)

    def emit(self, event: str, *, level: int = logging.INFO, **fields: Any) -> None:
        emit(event, level=level, **{"task_id": str(self.task.pk), "workflow": self.task.workflow,
                                    "attempt": self.task.attempts,
                                    "trace_id": self.task.trace_id or None, **fields})

    def context(self, index: int, step: Step, *, outputs: dict[str, Any], progress: Any,
                atomic: bool, compensating: bool = False, output: Any = None) -> StepContext:
        task = self.task
        return StepContext(held=self, task_id=str(task.pk), workflow=task.workflow,
                           payload=task.payload, outputs=dict(outputs), attempt=task.attempts,
                           step_index=index, step_name=step.name, progress=progress,
                           output=output, atomic=atomic, compensating=compensating)

    # --- fenced writes ---------------------------------------------------------------------

    def fenced(self, write: Callable[[Lease], T]) -> T:
        """`write(lease)`, a write the store fences on this attempt's token; a
        refusal becomes the worker's signal."""
        lease = self.lease
        try:
            return write(lease)
        except Refused as refused:
            raise classify(refused) from None
        except ConcurrentTransition:
            raise classify(self.store.refusal(lease)) from None

    def write(self, rows: list[StepRow]) -> None:
        """A fenced step write (extending the lease when it is due). Outside a
        transaction, a database error is retried briefly — the write is
        idempotent — then the run is Interrupted."""
        renew = lease_length() if self.renewal.due() else None
        self._durably(lambda: self.fenced(
            lambda lease: self.store.write_steps(lease, rows, renew_for=renew)))

    def renew(self) -> None:
        self.fenced(lambda lease: self.store.renew(lease, lease_length=lease_length()))

    def check(self) -> None:
        self.fenced(self.store.check)

    def save_progress(self, index: int, progress: Any) -> None:
        self.fenced(lambda lease: self.store.save_progress(lease, index=index,
                                                           progress=progress))

    def record_step(self, plan: Plan, index: int, step: Step, output: Any,
                    following: int | None, *, then_claim: bool = False,
                    release: bool = False) -> Claimed | None:
        """One step boundary, all or nothing: step `index`'s success with the
        next step's start (`following`) — or, after the last step, with the
        task's success, which may claim the next due task (`then_claim`). With
        `release` (the workers are stopping, engine/shutdown.py) the next step
        does not start: the success goes with the task's `release`."""
        now = self.clock.now()
        done = step_rows.succeeded(index, step.name, output, now,
                                   compensable=step.compensation is not None)
        if following is None:
            return self.transition("succeed", result=output, now=now, steps=[done],
                                   then_claim=then_claim)
        if release:
            name = plan.steps[following].name
            self.transition("release", now=now, steps=[done],
                            reason=f"the workers are stopping: step {step.name} done, "
                                   f"{name} starts on their next start")
            return None
        nxt = step_rows.started(following, plan.steps[following].name,
                                plan.attempts_of(following) + 1, now)
        self.write([done, nxt])
        return None

    def consume_signal(self, name: str, index: int) -> TaskSignal | None:
        """Consume the oldest stored signal `name` for wait step `index`, fenced
        (holding the task's row until the enclosing transaction ends)."""
        return self.fenced(lambda lease: self.store.consume_signal(
            lease, name, step=index, at=self.clock.now()))

    def start_children(self, step: str, workflow: str, payloads: list[Any],
                       suffixes: list[str]) -> list[Task]:
        """Start (or find, by their keys) the children `suffixes` of step
        `step` — `workflow` runs with `payloads` — as the task's owner, in one
        transaction holding the task's row under the fence (engine/children.py).
        Refused children (a bad payload, a key used for another request) raise
        their error and start nothing."""
        from workflows.engine import children
        from workflows.engine.triggers import MAX_BATCH, ChildOf, TriggerRequest, task_trigger_many

        task = self.task
        keys = [children.child_key(task.pk, step, suffix) for suffix in suffixes]
        started: list[Task] = []
        for first in range(0, len(keys), MAX_BATCH):
            batch = range(first, min(first + MAX_BATCH, len(keys)))
            with transaction.atomic():
                self.fenced(lambda lease: self.store.write_steps(lease, []))  # holds the row
                base = Task.objects.filter(pk=task.pk).values_list("children_count",
                                                                    flat=True)[0]
                outcomes = task_trigger_many(
                    owner=task.owner, source=Source.CHILD, trace_id=task.trace_id,
                    traceparent=task.traceparent,
                    requests=[TriggerRequest(workflow, payloads[i], keys[i]) for i in batch],
                    parent=ChildOf(task.pk, step, base))
                for outcome in outcomes:
                    if isinstance(outcome, PilotError):
                        raise outcome
                    started.append(outcome.task)
                created = sum(o.outcome == "created" for o in outcomes)  # type: ignore[union-attr]  # errors raised
                if base + created > children.MAX_CHILDREN:
                    raise ValidationFailed(f"A task may start at most {children.MAX_CHILDREN} "
                                           "children")
                self.store.children_counted_in_tx(task.pk, created)
            task.children_count = base + created
            faults.fault_point("child_batch_started")
        return started

    def transition(self, name: str, *, reason: str = "", then_claim: bool = False,
                   **kwargs: Any) -> Claimed | None:
        """Apply transition `name` to the task, fenced on its token (which moves
        on). After a database error outside a transaction it reads back: if the
        change committed (its reply was lost) the run goes on from there; if not,
        it tries again. With `then_claim`, returns the next due task the same
        statement claimed for this worker."""
        deadline = time.monotonic() + WRITE_PATIENCE_SECONDS
        then_claim_for = (self.worker, lease_length()) if then_claim else None
        while True:
            if time.monotonic() > deadline:
                raise Interrupted(f"cannot record {name}: the database keeps failing")
            token = self.task.lease_token
            try:
                faults.fault_point("before_transition")
                fact = self.fenced(lambda _lease: self.store.transition(
                    self.task, name, at=self.clock.now(), actor=self.actor, reason=reason,
                    then_claim_for=then_claim_for, **kwargs))
                announce(fact)
                faults.fault_point("transition_reply")
                return fact.following
            except TRANSIENT:
                if self.in_atomic_step:
                    raise  # the enclosing atomic step settles it
                fresh = self.reread(deadline)
                if fresh.lease_token == token + 1 and self.last_change_was_ours(name):
                    self.adopt(fresh)
                    # A success may have claimed the next task in the same commit.
                    return self.claimed_next(deadline) if then_claim else None
                if fresh.lease_token != token:
                    raise classify(self.store.refusal(Lease(self.task.pk, token,
                                                            self.worker))) from None

    def atomically(self, body: Callable[[], T], settle: Callable[[], Any]) -> Any:
        """Run `body` (which ends with its fenced record) in one transaction.
        After an error: if `settle()` finds it committed anyway, its result;
        if SQLite refused the transaction for another writer, run it again;
        otherwise StepFailure. Signals pass through, rolled back with the
        token (a transition inside moved it on)."""
        for round_ in range(1, 4):
            stored = {f.attname: self.task.__dict__[f.attname]
                      for f in Task._meta.concrete_fields}
            try:
                with self.store.atomic_step():
                    self.in_atomic_step = True
                    try:
                        result = body()
                    finally:
                        self.in_atomic_step = False
                faults.fault_point("after_atomic_commit")
                return result
            except BaseException as exc:
                self.task.__dict__.update(stored)  # the database has it as it was
                self.task._update_initial_state()
                if not isinstance(exc, Exception) or isinstance(exc, Interrupted):
                    raise
                settled = settle()
                if settled is not MISSING:
                    return settled
                if self.store.is_lock_conflict(exc) and round_ < 3:
                    time.sleep(0.05 * round_)
                    continue
                raise StepFailure(exc) from exc
        raise AssertionError("unreachable")

    def _durably(self, write: Callable[[], object]) -> None:
        if self.in_atomic_step:
            write()  # the enclosing atomic step settles its errors
            return
        patiently(write, doing="record")

    # --- reading back ----------------------------------------------------------------------

    def checkpoint(self, index: int) -> StepCheckpoint | None:
        return read(lambda: StepCheckpoint.objects.filter(task_id=self.task.pk,
                                                          index=index).first())

    def reread(self, deadline: float | None = None) -> Task:
        """The task as stored, whatever this attempt believed; the in-memory task
        is brought back to it when a change it made did not commit."""
        fresh = read(lambda: Task.objects.get(pk=self.task.pk), deadline)
        if fresh.lease_token == self.task.lease_token:
            self.adopt(fresh)
        return fresh

    def adopt(self, fresh: Task) -> None:
        self.task.__dict__.update({f.attname: fresh.__dict__[f.attname]
                                   for f in Task._meta.concrete_fields})
        self.task._update_initial_state()

    def last_change_was_ours(self, name: str) -> bool:
        last = (TaskTransition.objects.filter(task_id=self.task.pk).order_by("-id")
                .values_list("transition", "actor").first())
        return last == (name, self.actor[:200])

    def claimed_next(self, deadline: float | None = None) -> Claimed | None:
        """The task a success of this attempt claimed in the same statement,
        when the reply was lost."""
        return held_by_me(self.store, self.worker, besides=(self.task.pk,), deadline=deadline)
