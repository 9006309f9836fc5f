"""A model-based test of the queue's liveness (docs/guarantees.md, "Liveness"):
a hypothesis state machine drives several clients' tasks through the real
engine, the real broker and the real dispatcher, with the faults that strand
work when liveness is decided by a proxy instead of per task —

- three clients under the production-shaped cap (one held task each), tasks
  that succeed, retry, fail for good through their compensations (undo work
  that counts toward the cap), and are cancelled;
- two workers, each taking the next message off the broker (or, like a worker
  that finished a run, the next due task straight from the table) and paused
  at every durable write; a worker crashes, a claim's reply is lost (the claim
  committed, the worker saw a connection error), a message is lost (a dead
  cluster's prefetch, a failed push);
- time passes (messages go stale, leases and backoffs run out) and the
  dispatcher passes.

After every rule, what must always hold: no client holds more than its cap
(running, or compensating/cancelling under a live lease). And, whenever the
`workers_go_idle` rule runs and at the end of every example, what must
eventually hold: once the workers are idle, round after round of (time passes,
the dispatcher passes, the idle workers take every message), every client that
had due work its cap allows gets some of it taken in that round — no client with
a free slot waits behind another — and within a bound every task ends.

Each kind of fault must be seen landing across the run (counted, asserted at
the end), so a rule that stopped reaching its window fails the test instead of
passing it vacuously. The seed varies with the commit (printed; set
PILOT_MODEL_SEED to replay one), so CI explores new programs every run.
PILOT_QUEUE_MODEL_EXAMPLES sets the budget (docs/testing.md)."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import OperationalError, connection
from django.db.models import Count, F, Q
from django.db.models.functions import Now
from django.test import TestCase, override_settings
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage
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
from tests.support.helpers import purge_queue
from workflows.engine import faults
from workflows.engine.caps import Slots, caps
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.enqueue import broker, uses_orm_broker
from workflows.engine.operations import task_cancel
from workflows.engine.run import Run
from workflows.engine.triggers import task_trigger
from workflows.models import (
    DemoLedger,
    StepCheckpoint,
    Task,
    TaskReplay,
    TaskTransition,
    WebhookDelivery,
)
from workflows.registry import registry
from workflows.rules.errors import InvalidTransition, NonRetryableError, RetryableError
from workflows.rules.states import COMPENSATION_STATES, FINISHED_STATES
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

CLIENTS, WORKERS, CAP = 3, 2, 1
LOST = "server closed the connection unexpectedly"
KINDS = ("short", "flaky", "saga_ok", "saga_fail")
OWNERS: list = []  # created once per test (they outlive the examples)
LANDED: Counter = Counter()  # faults and windows reached, over the whole run


def _flaky(ctx):
    if ctx.attempt == 1:
        raise RetryableError("first attempt fails")
    return "ok"


def _confirm(ctx):
    if ctx.payload.get("fail"):
        raise NonRetryableError("refused")
    return "confirmed"


def _undo(ctx):
    DemoLedger.objects.create(task=ctx.task_id, action="undo")


if registry.find("q.short") is None:
    # Backoffs of an hour: only time passing (a rule) makes a retry due, so the
    # same rules enable the same rules on any machine.
    registry.define("q.short").add_step("only", lambda ctx: "done")
    registry.define("q.flaky", max_attempts=3, backoff_initial=3600,
                    backoff_max=3600).add_step("flaky", _flaky)
    _saga = registry.define("q.saga", max_attempts=2, backoff_initial=3600, backoff_max=3600)
    _saga.add_step("reserve", lambda ctx: "reserved", compensation=_undo)
    _saga.add_step("confirm", _confirm)

# Every stored time (all of them the database's), moved back when time passes.
TIMES = {Task: ("created_at", "updated_at", "started_at", "finished_at", "expires_at",
                "enqueued_at", "next_attempt_at", "lease_expires_at"),
         StepCheckpoint: ("started_at", "finished_at"), TaskTransition: ("at",),
         TaskReplay: ("at",)}

WORKFLOW = {"short": ("q.short", {}), "flaky": ("q.flaky", {}),
            "saga_ok": ("q.saga", {}), "saga_fail": ("q.saga", {"fail": True})}


def pop_one() -> str | None:
    """Take the next message off the real broker (as a worker's pusher does):
    the task id it names, or None when the queue is empty."""
    b = broker()
    if uses_orm_broker():
        row = OrmQ.objects.using(Conf.ORM).filter(key=b.list_key).order_by("id").first()
        if row is None:
            return None
        row.delete()
        payload = row.payload
    else:
        payload = b.connection.lpop(b.list_key)
        if payload is None:
            return None
    return SignedPackage.loads(payload)["args"][0]


def committed():
    """What a commit does in this test's one transaction: run the on-commit
    callbacks (the Redis pushes, the events) at the end of the block."""
    return TestCase.captureOnCommitCallbacks(execute=True)


def held_by_client() -> dict:
    """Tasks each client holds now, as the caps count them."""
    held = Task.objects.filter(Q(state=S.RUNNING)
                               | Q(state__in=COMPENSATION_STATES, lease_expires_at__gt=Now()))
    return dict(held.values("owner_id").annotate(n=Count("pk")).order_by()
                .values_list("owner_id", "n"))


class QueueMachine(RuleBasedStateMachine):
    @initialize()
    def fresh(self):
        with connection.cursor() as cursor:
            for model in (DemoLedger, TaskTransition, StepCheckpoint, TaskReplay,
                          WebhookDelivery, Task):
                cursor.execute(f"DELETE FROM {model._meta.db_table}")
        purge_queue()
        self.runs: dict[int, tuple[Run, object]] = {}
        self.generation = Counter()  # a crashed worker comes back as a new process (id)
        self.tasks: list = []

    # --- helpers ---

    def worker_id(self, w: int) -> str:
        return f"q{w}-{self.generation[w]}"

    def _advance(self, w: int, points: int = 1) -> None:
        for _ in range(points):
            if w not in self.runs:
                return
            with committed():
                try:
                    next(self.runs[w][1])
                except StopIteration:
                    del self.runs[w]

    def _start(self, w: int, task_id: str | None) -> None:
        run = Run(task_id, self.worker_id(w))
        self.runs[w] = (run, run.steps())

    def _finish_all(self) -> None:
        for w in list(self.runs):
            self._advance(w, 1000)

    # --- clients and operators ---

    @rule(client=integers(0, CLIENTS - 1), kind=sampled_from(KINDS))
    def trigger(self, client, kind):
        workflow, payload = WORKFLOW[kind]
        with committed():
            task = task_trigger(owner=OWNERS[client], key=uuid.uuid4().hex,
                                workflow=workflow, payload=payload).task
        self.tasks.append(task.pk)

    @precondition(lambda self: self.tasks)
    @rule(i=integers(0, 1000))
    def cancel(self, i):
        task = Task.objects.filter(pk=self.tasks[i % len(self.tasks)]).first()
        if task is None:
            return
        try:
            with committed():
                task_cancel(task_id=task.pk, user=task.owner)
            LANDED["cancel"] += 1
        except InvalidTransition:
            pass

    # --- workers and the broker ---

    @rule(w=integers(0, WORKERS - 1), reply_lost=booleans(), points=integers(1, 4))
    def worker_takes_a_message(self, w, reply_lost, points):
        if w in self.runs:
            return
        with committed():
            task_id = pop_one()
        if task_id is None:
            return
        self._start(w, task_id)
        run = self.runs[w][0]
        if reply_lost:
            with faults.armed("claim_reply", error=OperationalError(LOST)) as lost:
                self._advance(w)
            LANDED["claim_reply_lost"] += lost.fired
            points -= 1
        self._advance(w, points)
        self._count_refusal(run, task_id)

    def _count_refusal(self, run: Run, task_id: str) -> None:
        if run.report.outcome == "skipped" and Task.objects.filter(
                pk=task_id, state=S.PENDING, enqueued_at__isnull=True).exists():
            LANDED["cap_refused"] += 1  # its client was at its cap: the task is owed one

    @precondition(lambda self: 0 < len(self.runs) < WORKERS)
    @rule(kind=sampled_from(KINDS))
    def a_busy_clients_new_task_reaches_the_idle_worker(self, kind):
        """The cap's window, sought: while a worker holds a client's task, a
        message for a new task of that client reaches the idle worker. Its claim
        is refused by the cap; the task is owed a message, which the dispatcher's
        owed scan sends once a slot frees (its trigger's own message is still
        queued too: a duplicate, as a redelivery would be)."""
        [(run, _)] = list(self.runs.values())[:1]
        if run.task is None or run.task.state != S.RUNNING:
            return
        workflow, payload = WORKFLOW[kind]
        with committed():
            task = task_trigger(owner=run.task.owner, key=uuid.uuid4().hex,
                                workflow=workflow, payload=payload).task
        self.tasks.append(task.pk)
        idle = next(w for w in range(WORKERS) if w not in self.runs)
        self._start(idle, str(task.pk))
        other = self.runs[idle][0]
        self._advance(idle)
        self._count_refusal(other, str(task.pk))

    @rule(w=integers(0, WORKERS - 1), points=integers(1, 4))
    def worker_takes_the_next_due_task(self, w, points):
        """A worker that just finished a run claims the next due task from the
        table (its drain), without a message."""
        if w in self.runs:
            return
        self._start(w, None)
        self._advance(w, points)

    @precondition(lambda self: self.runs)
    @rule(w=integers(0, WORKERS - 1), points=integers(1, 4))
    def worker_advances(self, w, points):
        self._advance(w, points)

    @precondition(lambda self: self.runs)
    @rule(w=integers(0, WORKERS - 1))
    def worker_crashes(self, w):
        if self.runs.pop(w, None) is not None:
            self.generation[w] += 1
            LANDED["crash"] += 1

    @rule(w=integers(0, WORKERS - 1), points=integers(1, 3))
    def a_worker_dies_mid_run(self, w, points):
        """The crash's window, sought: worker w (taking the next due task if it
        holds none) goes a few writes on and its process dies there — the rule
        above meets a run only when one happens to be in flight, and some seeds
        never did (no crash in a whole run)."""
        if w not in self.runs:
            self._start(w, None)
            self._advance(w, points)
        self.worker_crashes(w)

    @rule()
    def message_lost(self):
        with committed():
            if pop_one() is not None:
                LANDED["message_lost"] += 1

    # --- time and the dispatcher ---

    @rule(how_long=sampled_from(["a_period", "a_lease", "a_backoff"]))
    def time_passes(self, how_long):
        """The database's clock moves on (every stored time moves back instead):
        a re-send period, a lease, or an hour of backoff."""
        seconds = {"a_period": 11, "a_lease": 61, "a_backoff": 3601}[how_long]
        shift = timedelta(seconds=seconds)
        for model, fields in TIMES.items():
            for name in fields:
                model.objects.filter(**{f"{name}__isnull": False}).update(
                    **{name: F(name) - shift})

    @rule()
    def dispatcher_passes(self):
        with committed():
            report = dispatch_once()
        assert report.errors == 0
        LANDED["resent"] += report.reenqueued
        LANDED["owed_sent"] += report.owed_enqueued
        LANDED["recovered"] += report.recovered

    # --- what must always hold ---

    @invariant()
    def no_client_holds_more_than_its_cap(self):
        held = held_by_client()
        assert all(n <= CAP for n in held.values()), held

    # --- what must eventually hold ---

    @rule()
    def workers_go_idle(self):
        self._finish_all()
        self._rounds(bound=3, to_the_end=False)

    def _due_and_free(self) -> dict:
        """{client: {task ids}} of the work a free slot allows now: pending or due
        retrying tasks (a new run), and compensation phases without a live
        lease (a take-over), each as its client's cap allows."""
        slots = Slots.now(caps())
        now_due = (Q(state=S.PENDING) | Q(state=S.RETRYING, next_attempt_at__lte=Now())
                   | Q(state__in=COMPENSATION_STATES)
                   & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=Now()))
                   & (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=Now())))
        found: dict = {}
        for pk, owner_id, workflow, state, attempts, max_attempts in (
                Task.objects.filter(now_due).values_list("pk", "owner_id", "workflow", "state",
                                                         "attempts", "max_attempts")):
            undo = state in COMPENSATION_STATES
            if not undo and attempts >= max_attempts:
                continue
            if slots.free(owner_id, workflow, undo=undo):
                found.setdefault(owner_id, set()).add(pk)
        return found

    def _rounds(self, *, bound: int, to_the_end: bool) -> None:
        """Idle workers, round after round: a period and a lease and a backoff pass,
        the dispatcher passes, the workers take every message and run it to its
        end. Each client with due work its cap allows gets some of it taken in
        every round; with `to_the_end`, every task ends within `bound` rounds."""
        for round_no in range(bound):
            for how_long in ("a_period", "a_lease", "a_backoff"):
                self.time_passes(how_long)
            # Whatever else the fleet is doing: another client's new task arrives
            # with its message and is claimed now — claims go on all the time.
            self.trigger(round_no % CLIENTS, "short")
            with committed():
                busy = pop_one()
            self._start(1, busy)
            self._advance(1, 1000)
            due = self._due_and_free()
            if not due and not to_the_end:
                return
            versions = dict(Task.objects.values_list("pk", "lease_token"))
            self.dispatcher_passes()
            for _ in range(200):
                with committed():
                    task_id = pop_one()
                if task_id is None:
                    break
                self._start(0, task_id)
                self._advance(0, 1000)
            else:
                raise AssertionError("the broker never emptied")
            after = dict(Task.objects.values_list("pk", "lease_token"))
            for client, tasks in due.items():
                taken = [pk for pk in tasks if after.get(pk) != versions.get(pk)]
                assert taken, f"client {client} had {len(tasks)} due task(s) and a free slot, " \
                              "and none was taken in a round"
                LANDED["liveness_checked"] += 1
            if not Task.objects.exclude(state__in=FINISHED_STATES).exists():
                return
        if to_the_end:
            left = list(Task.objects.exclude(state__in=FINISHED_STATES)
                        .values_list("state", "attempts", "next_attempt_at", "enqueued_at"))
            raise AssertionError(f"not every task ended within {bound} rounds: {left}")

    def teardown(self):
        self._finish_all()
        self.runs.clear()
        self._rounds(bound=len(self.tasks) + 4, to_the_end=True)
        assert violations(require_terminal=True) == []
        LANDED["examples"] += 1


PARTS = 2


@override_settings(PILOT_MAX_RUNNING_PER_CLIENT=CAP)
def run_the_model(part: int) -> None:
    users = get_user_model().objects
    OWNERS[:] = [users.get_or_create(username=f"queue-client-{i}")[0] for i in range(CLIENTS)]
    on_postgres = connection.vendor == "postgresql"
    examples = int(os.environ.get("PILOT_QUEUE_MODEL_EXAMPLES") or (120 if on_postgres else 150))
    base = model_seed()
    print(f"queue model, part {part}: seed {base} + {part} (PILOT_MODEL_SEED={base} replays it)")
    LANDED.clear()
    machine = seed(base + part)(type(f"QueueMachinePart{part}", (QueueMachine,), {}))
    run_state_machine_as_test(machine, settings=settings(
        max_examples=-(-examples // PARTS), stateful_step_count=30, deadline=None,
        database=None, suppress_health_check=[HealthCheck.too_slow,
                                              HealthCheck.filter_too_much]))
    print(f"queue model, part {part}: {dict(LANDED)}")
    # Every kind of fault must land in the run (all its parts: tests/faults/seeds.py).
    landed_over_the_run("queue-model", part, PARTS, LANDED, (
        "crash", "claim_reply_lost", "message_lost", "cancel", "resent", "cap_refused",
        "owed_sent", "recovered", "liveness_checked", "examples"))


class _Part:
    part: int

    def test_nothing_waits_forever_or_behind_another_client_under_any_interleaving(self):
        run_the_model(self.part)


class TestQueuePart1of2(_Part):
    part = 1


class TestQueuePart2of2(_Part):
    part = 2
