"""A model-based test of the whole engine (docs/design.md, "Execution"): a
hypothesis state machine drives one task of a three-step saga through the real
engine with several actors interleaved at the points where the engine writes
something durable —

- two workers, each a run paused after every durable write (`Run.steps()`),
  that may be started at any time (a duplicate delivery, a redelivery),
  advanced, crashed between two writes or in the middle of a step body;
- the dispatcher; the database's clock, advanced for the task (leases run out,
  backoffs elapse); a lost reply to an atomic step's COMMIT;
- the owner and an operator: re-trigger (same or different request), cancel,
  retry, retry from the start; steps and compensations that succeed, fail
  retryably or fail for good.

After every rule, invariants the database does not enforce by itself:

- an atomic effect (ledger row) happens exactly once per time its checkpoint
  enters the state that records it (the step succeeded, its compensation
  compensated); a plain effect at most once per started attempt;
- a worker holding a stale token never changes anything (task, steps, ledger);
- the audit trail is a chain of legal edges ending in the task's state; a
  finished task owes no compensation and has no step left running;
- every ending in the audit trail has exactly one webhook delivery (the task
  has an endpoint), numbered by the restarts before it, and nothing else has
  one — the outbox row is written with the ending or not at all;
- at the end, with the failures switched off and the workers running, every
  task reaches a final state.

The step count and example budget are set so that CI's PostgreSQL pass runs
1 200 examples (the SQLite pass 600 more), in four seeded parts that `make test`
runs side by side — since the wait step joined the model an example costs about
three times what it did, and 2 000 took a third of the PostgreSQL pass
(PILOT_MODEL_EXAMPLES overrides the total, e.g. for a long soak). The seed comes
from the commit under test, so every commit explores programs of its own (it is
printed; PILOT_MODEL_SEED replays it), and every kind of fault must be seen
landing in the run — a rule that stopped reaching its window fails the test.
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from django.db import OperationalError, connection
from django.db.models.functions import Now
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from hypothesis.strategies import booleans, integers, sampled_from

from tests.faults.invariants import violations
from tests.faults.seeds import landed_over_the_run, model_seed
from workflows.accounts import client_webhook_ensure
from workflows.engine import faults
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.operations import task_cancel, task_retry
from workflows.engine.run import Run
from workflows.engine.run.outcomes import MISSING
from workflows.engine.signals import task_signal
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.models import (
    DemoLedger,
    StepCheckpoint,
    Task,
    TaskReplay,
    TaskSignal,
    TaskTransition,
    WebhookDelivery,
)
from workflows.registry import registry
from workflows.rules.errors import (
    IdempotencyKeyReused,
    InvalidTransition,
    NonRetryableError,
    RetryableError,
    TaskCancelled,
    TaskFinished,
)
from workflows.rules.states import FINISHED_STATES, TO_COMPENSATE, StepState
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

WORKFLOW = "test.model_saga"
KEY = "model-key"
# A public address (no lookup needed); nothing is ever sent to it here.
CALLBACK = "https://93.184.216.34/pilot-model"
BEHAVIOURS = ("ok", "retryable", "fatal")

# What the steps and compensations do, set by the rules; the plain steps'
# effects (an "external system") are counted here, the atomic ones are ledger rows.
MODE = {"c": "ok", "undo_b": "ok"}
EFFECTS: Counter = Counter()
OWNER: list = []  # the owner of every example's task, set by the test
LANDED: Counter = Counter()  # faults and windows reached over the whole run


def _ledger(ctx, action):
    DemoLedger.objects.create(task=ctx.task_id, action=action)


def _a(ctx):
    _ledger(ctx, "a")
    return "a"


def _undo_a(ctx):
    _ledger(ctx, "undo_a")


def _b(ctx):
    EFFECTS["b"] += 1
    return "b"


def _undo_b(ctx):
    EFFECTS["undo_b"] += 1
    _behave(MODE["undo_b"])


def _c(ctx):
    EFFECTS["c"] += 1
    _behave(MODE["c"])
    return "c"


def _behave(mode):
    if mode == "retryable":
        raise RetryableError("transient")
    if mode == "fatal":
        raise NonRetryableError("permanent")


# Backoffs of an hour: only the `backoff_elapses` rule makes a retry due. With a
# short one, wall-clock time would decide whether a worker's claim finds the task
# due, so the same rule sequence could enable different rules on a slower run
# (hypothesis: FlakyStrategyDefinition) — the model's time is the rules' alone.
if registry.find(WORKFLOW) is None:
    _wf = registry.define(WORKFLOW, max_attempts=3, backoff_initial=3600, backoff_max=3600)
    _wf.add_step("a", _a, atomic=True, compensation=_undo_a)
    _wf.add_step("b", _b, compensation=_undo_b)
    _wf.wait_for_signal("go", timeout=3600)  # parks: a signal or its timeout wakes it
    _wf.add_step("c", _c)


# Everything the invariants read, in one statement (it runs after every rule of
# every example): the task's state, its steps, the ledger and the audit trail,
# each row tagged with its kind. Portable: the SQLite pass runs it too.
_STATE_SQL = """
    SELECT 0 AS kind, CAST(0 AS bigint) AS seq, state AS a, lease_owner AS b,
           CAST(NULL AS text) AS c, CAST(NULL AS bigint) AS n, CAST(NULL AS bigint) AS m,
           lease_expires_at IS NULL AS flag
      FROM workflows_task WHERE id = %s
    UNION ALL
    SELECT 1, 0, name, state, NULL, attempts, compensation_attempts, compensable
      FROM workflows_stepcheckpoint WHERE task_id = %s
    UNION ALL
    SELECT 2, 0, action, NULL, NULL, count(*), NULL, NULL FROM workflows_demoledger GROUP BY action
    UNION ALL
    SELECT 3, id, transition, from_state, to_state, NULL, NULL, NULL
      FROM workflows_tasktransition WHERE task_id = %s
    UNION ALL
    SELECT 4, 0, NULL, NULL, NULL, count(*), NULL, NULL
      FROM workflows_tasksignal WHERE task_id = %s AND consumed_at IS NOT NULL
    ORDER BY kind, seq
"""


def _read_state(task_id):
    """(task, {step name: step}, Counter of ledger actions, [(transition, from, to)]),
    read in one round trip."""
    pk = Task._meta.pk.get_db_prep_value(task_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(_STATE_SQL, [pk, pk, pk, pk])
        rows = cursor.fetchall()
    task, cps, ledger, history, consumed = None, {}, Counter(), [], 0
    for kind, _, a, b, c, n, m, flag in rows:
        if kind == 0:
            task = SimpleNamespace(state=a, lease_owner=b, lease_expires_at_null=bool(flag))
        elif kind == 1:
            cps[a] = SimpleNamespace(name=a, state=b, attempts=n, compensation_attempts=m,
                                     compensable=bool(flag))
        elif kind == 2:
            ledger[a] = n
        elif kind == 3:
            history.append((a, b, c))
        else:
            consumed = n
    task.signals_consumed = consumed
    return task, cps, ledger, history


def _effects_match(cps, ledger, entries, baseline) -> None:
    """An atomic effect once per entry of its checkpoint into the state that
    records it; a plain effect at most once per started attempt."""
    assert ledger["a"] == entries[("a", StepState.SUCCEEDED)], (ledger, entries)
    assert ledger["undo_a"] == entries[("a", StepState.COMPENSATED)], (ledger, entries)
    if "b" in cps:
        assert EFFECTS["b"] <= cps["b"].attempts
        undone = EFFECTS["undo_b"] - baseline["undo_b"]
        assert undone <= cps["b"].compensation_attempts + baseline["undo_b_in_flight"]
        # and at least once: a step recorded compensated had its compensation run
        # (a take-over that dropped a finished plain step would leave it undone)
        assert cps["b"].state != StepState.COMPENSATED or undone >= 1, (cps["b"], undone)
    if "c" in cps:
        assert EFFECTS["c"] <= cps["c"].attempts


def _state_and_steps_agree(task, cps) -> None:
    states = {name: cp.state for name, cp in cps.items()}
    if task.state == S.SUCCEEDED:
        assert set(states.values()) == {StepState.SUCCEEDED}, states
    if task.state in (S.FAILED, S.CANCELLED):
        assert not [cp for cp in cps.values() if cp.state in TO_COMPENSATE and cp.compensable], \
            states
        assert StepState.RUNNING not in states.values(), states
        assert StepState.COMPENSATING not in states.values(), states


def _audit_chain(task, history) -> list[str]:
    """The task's history is a chain of legal edges ending in its state."""
    from tests.faults.invariants import LEGAL_EDGES

    found, at = [], S.PENDING
    for name, source, target in history:
        if (name, source, target) not in LEGAL_EDGES:
            found.append(f"illegal edge {name} {source}->{target}")
        if source != at:
            found.append(f"{name} from {source} but it was {at}")
        at = target
    if at != task.state:
        found.append(f"history ends in {at} but the task is {task.state}")
    return found


def _snapshot():
    task = Task.objects.filter(idempotency_key=KEY).values().first()
    if task:
        for name in ("updated_at", "enqueued_at"):
            task.pop(name)
    steps = sorted(StepCheckpoint.objects.values_list("index", "state", "attempts",
                                                      "compensation_attempts", "progress"))
    signals = sorted(TaskSignal.objects.values_list("id", "consumed_at", "consumed_step"))
    return task, steps, DemoLedger.objects.count(), WebhookDelivery.objects.count(), signals


class EngineMachine(RuleBasedStateMachine):
    """One key, one task (re-created only after it expires, which we never let
    happen), two workers, a dispatcher, an owner who is also the operator."""

    @initialize(step=sampled_from(BEHAVIOURS), compensation=sampled_from(BEHAVIOURS))
    def fresh(self, step, compensation):
        # Plain DELETEs, children first (the ORM's delete() would first collect
        # the cascades: a dozen statements more per example).
        with connection.cursor() as cursor:
            for model in (DemoLedger, TaskTransition, StepCheckpoint, TaskReplay,
                          TaskSignal, WebhookDelivery, Task):
                cursor.execute(f"DELETE FROM {model._meta.db_table}")
        self.owner = OWNER[0]
        MODE.update(c=step, undo_b=compensation)
        EFFECTS.clear()
        self.task_id = None  # the key never expires here: one task for the whole example
        self.workers: dict[int, Run] = {}
        self.runs: dict[int, object] = {}
        self.generation = Counter()
        self.entries = Counter()     # times a checkpoint entered succeeded / compensated
        self.baseline = Counter()    # plain compensation effects before the last retry
        self.at: dict[int, str] = {}  # the point each paused worker stopped at
        self.last_states: dict[str, str] = {}
        self.signals_sent: set[str] = set()
        self.trigger(same=True)  # the first delivery's task; the rules go on from there

    # --- helpers ---------------------------------------------------------------------------

    def task(self) -> SimpleNamespace | None:
        """The task's pk, state and payload (what the rules decide on)."""
        if self.task_id is None:
            return None
        row = Task.objects.filter(pk=self.task_id).values("pk", "state", "payload").first()
        return SimpleNamespace(**row) if row else None

    def _observe(self, cps=None) -> None:
        """Count checkpoints entering the states whose effects are exactly-once."""
        states = ({name: cp.state for name, cp in cps.items()} if cps is not None else
                  dict(StepCheckpoint.objects.values_list("name", "state")))
        for name, state in states.items():
            before = self.last_states.get(name)
            if state != before and state in (StepState.SUCCEEDED, StepState.COMPENSATED):
                self.entries[(name, state)] += 1
        self.last_states = states

    def worker_id(self, i: int) -> str:
        """Worker i's id: a crashed worker comes back as a new process (host:pid)."""
        return f"w{i}-{self.generation[i]}"

    def _stale(self, i: int) -> bool:
        run = self.workers[i]
        if run.lease is None:
            return False
        state, token = Task.objects.filter(pk=self.task_id).values_list(
            "state", "lease_token").get()
        if token == run.lease.token:
            return False
        # The one move a refused worker may still make: take its own cancelled run over.
        return not (state == S.CANCELLING and token == run.lease.token + 1
                    and run.task.state == S.RUNNING)

    def _advance(self, i: int, points: int = 1) -> None:
        """Let worker i go on to its `points`-th next durable write (or its end)."""
        for _ in range(points):
            if i not in self.runs:
                return
            stale = self._stale(i)
            before = _snapshot() if stale else None
            try:
                self.at[i] = next(self.runs[i])
            except StopIteration:
                del self.runs[i], self.workers[i]
                self.at.pop(i, None)
            if stale:
                assert _snapshot() == before, f"worker {i} wrote with a stale token"

    def _until_fired(self, i: int, hits) -> None:
        """Let worker i go on until the armed fault fired (it is at its window)
        or its run ended — a bounded number of durable writes."""
        for _ in range(12):
            if i not in self.runs or hits.fired:
                return
            self._advance(i)
            self._observe()

    # --- the owner and the operator ------------------------------------------------------------

    @rule(same=booleans())
    def trigger(self, same):
        task = self.task()
        if task is None:
            payload = {"p": 1 if same else 2}
        else:
            payload = task.payload if same else {"p": -task.payload["p"]}
        try:
            outcome = task_trigger(owner=self.owner, key=KEY, workflow=WORKFLOW,
                                   payload=payload, callback_url=CALLBACK)
        except IdempotencyKeyReused:
            assert task is not None and not same
            return
        except TaskCancelled:
            assert task is not None and task.state in (S.CANCELLING, S.CANCELLED)
            return
        assert same or task is None
        if task is None:
            assert outcome.outcome == "created"
            self.task_id = outcome.task.pk
        elif task.state == S.FAILED:
            assert outcome.outcome == "restarted"
            self._retried()
        else:
            assert outcome.outcome == "replayed"

    @precondition(lambda self: self.task_id is not None)
    @rule()
    def cancel(self):
        task = self.task()
        try:
            after = task_cancel(task_id=task.pk, user=self.owner)
        except InvalidTransition:
            assert task.state not in (S.PENDING, S.RETRYING, S.RUNNING, S.WAITING)
            return
        assert task.state in (S.PENDING, S.RETRYING, S.RUNNING, S.WAITING)
        assert after.state in (S.CANCELLED, S.CANCELLING)
        LANDED["cancel_of_a_running_task" if task.state == S.RUNNING else "cancel"] += 1
        LANDED["cancel_of_a_waiting_task"] += task.state == S.WAITING

    @precondition(lambda self: self.task_id is not None)
    @rule(from_start=booleans())
    def retry(self, from_start):
        task = self.task()
        try:
            task_retry(task_id=task.pk, user=self.owner, from_start=from_start)
        except InvalidTransition:
            assert task.state not in (S.FAILED, S.CANCELLED)
            return
        assert task.state in (S.FAILED, S.CANCELLED)
        self._retried()

    def _retried(self):
        # Steps a retry resets run (and may be compensated) afresh.
        self.baseline["undo_b"] = EFFECTS["undo_b"]
        # A worker paused just after recording a plain compensation started (its
        # body not yet run) has lost its lease to the retry, but its body may still
        # run once when it wakes — at least once, counted against the attempt it
        # started, which the retry reset. Its record is refused.
        self.baseline["undo_b_in_flight"] = sum(
            1 for i in self.runs if self.at.get(i) == "compensation_started")
        self._observe()

    @rule(step=sampled_from(BEHAVIOURS), compensation=sampled_from(BEHAVIOURS))
    def behaviour(self, step, compensation):
        MODE.update(c=step, undo_b=compensation)

    @precondition(lambda self: self.task_id is not None)
    @rule(key=sampled_from(["s1", "s2", "s3"]))
    def signal_sent(self, key):
        """The partner sends signal `go` (a key it may have used before: a replay)."""
        state = Task.objects.filter(pk=self.task_id).values_list("state", flat=True).get()
        try:
            outcome = task_signal(task_id=self.task_id, name="go", payload={"key": key},
                                  key=key, user=None, actor="model:partner")
        except TaskFinished:
            assert state in FINISHED_STATES
            return
        self.signals_sent.add(key)
        LANDED["signal_woke_the_task" if outcome.woke else "signal_kept"] += 1
        if state == S.WAITING:
            assert outcome.woke or outcome.replayed

    def _signal_ahead(self) -> None:
        """A fresh signal for the wait: kept until a run reaches it, or waking the
        task if it is parked there already."""
        key = f"ahead-{len(self.signals_sent)}"
        try:
            outcome = task_signal(task_id=self.task_id, name="go", payload={"key": key},
                                  key=key, user=None, actor="model:partner")
        except TaskFinished:
            return
        self.signals_sent.add(key)
        LANDED["signal_woke_the_task" if outcome.woke else "signal_kept"] += 1

    @precondition(lambda self: self.task_id is not None)
    @rule()
    def wait_times_out(self):
        """The signal wait's timeout passes, the way the database sees it."""
        waiting = Task.objects.filter(pk=self.task_id, state=S.WAITING).first()
        if waiting is None:
            return
        past = store().db_now() - timedelta(seconds=1)
        Task.objects.filter(pk=self.task_id, lease_token=waiting.lease_token).update(
            next_attempt_at=past, waiting_for={**waiting.waiting_for, "until": past.isoformat()})
        LANDED["wait_timed_out"] += 1

    @precondition(lambda self: self.task_id is not None)
    @rule(i=integers(0, 1), then=sampled_from(["cancel", "signal", "time_out", "both"]))
    def at_the_wait(self, i, then):
        """Worker i (a delivery, if it holds none) goes on until the task parks at
        its wait, then: the owner cancels it; the partner signals it; its timeout
        passes and the dispatcher wakes it; or a signal and the timeout come
        together. The rules above meet a parked task only when it happens to be
        there; this one seeks it, so every run lands each (asserted at its end)."""
        MODE.update(c="ok")
        if i not in self.runs:
            run = Run(self.task_id, self.worker_id(i))
            self.workers[i], self.runs[i] = run, run.steps()
        for _ in range(12):
            if i not in self.runs or self._stale(i):
                break
            self._advance(i)
            self._observe()
        if not Task.objects.filter(pk=self.task_id, state=S.WAITING).exists():
            return
        if then == "cancel":
            self.cancel()
        if then in ("signal", "both"):
            self.signal_sent(f"s{len(self.signals_sent) % 3 + 1}")
        if then in ("time_out", "both"):
            self.wait_times_out()
            self.dispatcher_passes()
        LANDED[f"at_the_wait_{then}"] += 1

    # --- workers -------------------------------------------------------------------------------

    @precondition(lambda self: self.task_id is not None)
    @rule(i=integers(0, 1), points=integers(1, 4))
    def worker_starts(self, i, points):
        """A delivery (first, duplicate or redelivered) reaches worker i."""
        if i in self.runs:
            return
        run = Run(self.task_id, self.worker_id(i))
        self.workers[i], self.runs[i] = run, run.steps()
        self._advance(i, points)

    @precondition(lambda self: self.runs)
    @rule(i=integers(0, 1), points=integers(1, 4))
    def worker_advances(self, i, points):
        self._advance(i, points)

    @precondition(lambda self: self.runs)
    @rule(i=integers(0, 1))
    def worker_takes_one_step(self, i):
        self._advance(i)

    @precondition(lambda self: self.runs)
    @rule(i=integers(0, 1), where=sampled_from(["between_writes", "after_body",
                                                "after_compensation_body"]))
    def worker_crashes(self, i, where):
        """The worker's process dies: between two writes, or right after a body
        ran and before its record."""
        if i not in self.runs:
            return
        if where != "between_writes":
            point = "after_step_body" if where == "after_body" else "after_compensation_body"
            with faults.armed(point) as crash:
                try:
                    self._until_fired(i, crash)
                except faults.SimulatedCrash:
                    pass
            LANDED[f"crash_{where}"] += crash.fired
        else:
            LANDED["crash_between_writes"] += 1
        self.runs.pop(i, None)
        self.at.pop(i, None)
        self.workers.pop(i, None)
        self.generation[i] += 1

    @precondition(lambda self: self.task_id is not None)
    @rule(i=integers(0, 1), fault=sampled_from(["between_writes", "after_step_body",
                                                 "after_compensation_body",
                                                 "after_atomic_commit", "transition_reply"]),
          points=integers(1, 3))
    def worker_meets_a_fault_at_its_window(self, i, fault, points):
        """Worker i (a delivery, if it holds none) goes on until the fault's window
        and meets it there: a crash after a step's or a plain compensation's body,
        a lost reply to an atomic COMMIT or to a transition. The rules above meet
        them only when the run happens to be there; this one seeks the window, so
        every run of the model lands each of them (asserted at its end)."""
        if fault == "after_compensation_body":
            MODE.update(c="fatal", undo_b="ok")  # the run fails for good and undoes b
            self._signal_ahead()  # past the wait before c, or the run parks there
        if i not in self.runs:
            run = Run(self.task_id, self.worker_id(i))
            self.workers[i], self.runs[i] = run, run.steps()
        if fault == "between_writes":  # its process dies a few writes on
            self._advance(i, points)
            self._observe()
            if i in self.runs:
                self.worker_crashes(i, "between_writes")
            return
        crash = fault.startswith("after_") and fault != "after_atomic_commit"
        error = None if crash else OperationalError("server closed the connection")
        with faults.armed(fault, error=error) as hit:
            try:
                self._until_fired(i, hit)
            except faults.SimulatedCrash:
                pass
        LANDED[{"after_step_body": "crash_after_body",
                "after_compensation_body": "crash_after_compensation_body",
                "after_atomic_commit": "commit_reply_lost",
                "transition_reply": "transition_reply_lost"}[fault]] += hit.fired
        if crash and hit.fired:  # the process died there
            self.runs.pop(i, None)
            self.at.pop(i, None)
            self.workers.pop(i, None)
            self.generation[i] += 1

    @precondition(lambda self: self.runs)
    @rule(i=integers(0, 1))
    def transition_lost_while_the_task_was_recovered(self, i):
        """Worker i's next transition never reaches the server; meanwhile its
        lease runs out and the dispatcher recovers the task (the token moves by
        one, not by this worker): the worker must not adopt it, and writes
        nothing more (its stale writes are checked at every advance)."""
        if i not in self.runs:
            return
        if self._stale(i):
            return  # (the stale-write check would take the dispatcher's recovery,
            #          written from inside this worker's advance, for the worker's)

        def recovered_meanwhile():
            self.leases_run_out()
            dispatch_once()

        lost = OperationalError("server closed the connection")
        with faults.on("before_transition", recovered_meanwhile) as hook, \
                faults.armed("before_transition", error=lost) as hit:
            self._until_fired(i, hit)
        LANDED["transition_lost_before_the_server"] += hit.fired and hook.fired

    @precondition(lambda self: self.task_id is not None)
    @rule(i=integers(0, 1))
    def cancel_lands_as_a_step_body_returns(self, i):
        """The owner's cancel commits just after a step's body returned, before
        its record: the worker takes the cancel over, and a plain step whose body
        returned (its effect happened) must be compensated — not recorded failed
        and forgotten."""
        if i not in self.runs:
            run = Run(self.task_id, self.worker_id(i))
            self.workers[i], self.runs[i] = run, run.steps()
        if self._stale(i):
            return  # (the stale-write check would take the operator's cancel for the worker's)
        run, returned = self.workers[i], []

        def cancel_now():
            if run.in_atomic_step:
                return  # (an operator's cancel comes from another connection, never
                #          from inside the step's own transaction as it would here)
            if run.in_flight is None or run.in_flight.output is MISSING:
                return
            if run.in_flight.step.name != "b":
                return
            try:
                task_cancel(task_id=self.task_id, user=self.owner)
            except InvalidTransition:
                return
            returned.append("b")

        for _ in range(12):  # until b's body returns (then the cancel lands) or the run ends
            if i not in self.runs or returned:
                break
            with faults.on("after_step_body", cancel_now):
                self._advance(i)
            self._observe()
        if returned:
            MODE.update(undo_b="ok")
            for _ in range(30):  # the take-over and its compensations
                self._advance(i)
                self._observe()
            state = StepCheckpoint.objects.filter(task_id=self.task_id, name="b").values_list(
                "state", flat=True).first()
            assert i not in self.runs  # the cancel's phase ran through
            assert state == StepState.COMPENSATED, state
            LANDED["cancel_at_a_plain_steps_record"] += 1

    @precondition(lambda self: self.runs)
    @rule(i=integers(0, 1))
    def commit_reply_lost(self, i):
        """The next atomic COMMIT goes through but its reply is lost."""
        if i in self.runs:
            with faults.armed("after_atomic_commit",
                              error=OperationalError("server closed the connection")) as lost:
                self._until_fired(i, lost)
            LANDED["commit_reply_lost"] += lost.fired

    @precondition(lambda self: self.task_id is not None)
    @rule(i=integers(0, 1), points=integers(0, 3))
    def claim_reply_lost(self, i, points):
        """A delivery reaches worker i; its claim (or take-over) commits, the
        reply is lost: the worker must adopt what it claimed."""
        if i in self.runs:
            return
        run = Run(self.task_id, self.worker_id(i))
        self.workers[i], self.runs[i] = run, run.steps()
        with faults.armed("claim_reply", error=OperationalError("server closed the connection")
                          ) as lost:
            self._advance(i)
        LANDED["claim_reply_lost"] += lost.fired
        self._advance(i, points)

    @precondition(lambda self: self.runs)
    @rule(i=integers(0, 1))
    def transition_reply_lost(self, i):
        """The worker's next transition commits; its reply is lost."""
        if i in self.runs:
            with faults.armed("transition_reply",
                              error=OperationalError("server closed the connection")) as lost:
                self._until_fired(i, lost)
            LANDED["transition_reply_lost"] += lost.fired

    # --- time and the dispatcher ---------------------------------------------------------------

    @precondition(lambda self: self.task_id is not None)
    @rule()
    def leases_run_out(self):
        Task.objects.filter(idempotency_key=KEY, lease_expires_at__isnull=False).update(
            lease_expires_at=Now() - timedelta(milliseconds=1))

    @precondition(lambda self: self.task_id is not None)
    @rule()
    def backoff_elapses(self):
        Task.objects.filter(idempotency_key=KEY, next_attempt_at__isnull=False).update(
            next_attempt_at=Now() - timedelta(milliseconds=1))

    @rule()
    def dispatcher_passes(self):
        report = dispatch_once()
        assert report.errors == 0
        LANDED["recovered"] += report.recovered

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def promises_hold(self):
        """Everything is read once per rule (four plain statements: this runs
        after every rule of every example), then checked."""
        if self.task_id is None:
            return
        task, cps, ledger, history = _read_state(self.task_id)
        self._observe(cps)
        _effects_match(cps, ledger, self.entries, self.baseline)
        _state_and_steps_agree(task, cps)
        assert _audit_chain(task, history) == []
        self._signals_hold(task)

    def _signals_hold(self, task):
        """Each signal consumed at most once, one per time the wait step was
        recorded succeeded (exactly once when the task went on past it); a
        waiting task holds no lease."""
        assert task.signals_consumed == self.entries[("go", StepState.SUCCEEDED)], (
            list(TaskSignal.objects.filter(task_id=self.task_id, consumed_at__isnull=False)
                 .values_list("idempotency_key", "consumed_step")), self.entries)
        if task.state == S.WAITING:
            assert task.lease_owner == "" and task.lease_expires_at_null, task

    def every_ending_has_exactly_one_delivery(self):
        """Checked once per example: deliveries are only ever inserted (in the
        transaction of the ending), so a duplicate made mid-run is still here."""
        task = (Task.objects.filter(pk=self.task_id).values("pk", "restarts").first()
                if self.task_id else None)
        if task is None:
            return
        task = SimpleNamespace(**task)
        endings, restarts = [], 0
        for name, target in TaskTransition.objects.filter(task_id=task.pk).order_by(
                "id").values_list("transition", "to_state"):
            restarts += name == "retry"
            if target in FINISHED_STATES:
                endings.append((target, restarts))
        delivered = list(WebhookDelivery.objects.filter(task_id=task.pk).order_by("id")
                         .values_list("task_state", "restarts"))
        assert delivered == endings, (delivered, endings)
        assert task.restarts == restarts

    def teardown(self):
        """With failures switched off, the workers and the dispatcher finish it."""
        self.runs.clear()
        if self.task_id is None:
            return
        row = Task.objects.filter(pk=self.task_id)  # its state only: read up to 30 times
        MODE.update(c="ok", undo_b="ok")
        for n in range(30):
            state = row.values_list("state", flat=True).get()
            if state in FINISHED_STATES:
                break
            if state == S.WAITING:  # liveness: a signal always ends a wait
                task_signal(task_id=self.task_id, name="go", payload={}, key=f"finish-{n}",
                            user=None, actor="model:finisher")
            self.leases_run_out()
            self.backoff_elapses()
            dispatch_once()
            self._observe()
            for _ in Run(self.task_id, "finisher").steps():
                self._observe()
        state, error = row.values_list("state", "error").get()
        assert state in FINISHED_STATES, (state, error)
        self.promises_hold()
        self.every_ending_has_exactly_one_delivery()
        assert violations(require_terminal=True) == []
        LANDED["examples"] += 1
        for transition in TaskTransition.objects.filter(task_id=self.task_id).values_list(
                "transition", flat=True):
            LANDED[f"edge_{transition}"] += 1


# The examples run in PARTS independent parts, each a test class with a seed of its
# own: `make test` hands whole test classes to its pytest-xdist workers (--dist
# loadscope), so the model's examples use both cores instead of one, and each part
# is reproducible on its own (`pytest "tests/faults/test_engine_model.py::TestPart2of4"`).
PARTS = 4


def run_the_model(part: int) -> None:
    on_postgres = connection.vendor == "postgresql"
    # The owner (and its webhook secret) outlives the examples: created once.
    owner, _ = get_user_model().objects.get_or_create(username="model-owner")
    client_webhook_ensure(owner)
    OWNER[:] = [owner]
    examples = int(os.environ.get("PILOT_MODEL_EXAMPLES") or (1200 if on_postgres else 600))
    base = model_seed()
    print(f"engine model, part {part}: seed {base} + {part} "
          f"(PILOT_MODEL_SEED={base} replays it)")
    LANDED.clear()
    machine = seed(base + part)(type(f"EngineMachinePart{part}", (EngineMachine,), {}))
    run_state_machine_as_test(machine, settings=settings(
        max_examples=-(-examples // PARTS), stateful_step_count=25, deadline=None,
        database=None,
        # Each example starts from an empty table: the setup hypothesis times is real.
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    print(f"engine model, part {part}: {dict(sorted(LANDED.items()))}")
    # Every kind of fault, and the windows it opens, must land in the run (all
    # its parts: tests/faults/seeds.py), each crash and each lost reply by name.
    landed_over_the_run("engine-model", part, PARTS, LANDED, (
        "crash_between_writes", "crash_after_body", "crash_after_compensation_body",
        "commit_reply_lost", "claim_reply_lost", "transition_reply_lost",
        "transition_lost_before_the_server", "cancel_at_a_plain_steps_record",
        "edge_recover", "cancel", "cancel_of_a_running_task", "edge_resume", "edge_defer",
        "edge_compensate", "edge_retry", "edge_park", "edge_wake", "signal_woke_the_task",
        "signal_kept", "wait_timed_out", "cancel_of_a_waiting_task", "at_the_wait_cancel",
        "at_the_wait_signal", "at_the_wait_time_out", "at_the_wait_both", "examples"))


class _Part:
    part: int

    def test_the_engine_keeps_its_promises_under_any_interleaving(self):
        run_the_model(self.part)


class TestPart1of4(_Part):
    part = 1


class TestPart2of4(_Part):
    part = 2


class TestPart3of4(_Part):
    part = 3


class TestPart4of4(_Part):
    part = 4
