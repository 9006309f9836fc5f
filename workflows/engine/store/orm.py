"""The portable store: every verb with Django's ORM and plain SQL.

It is correct on any database Django runs with either row locks (PostgreSQL)
or a single writer (SQLite), and the contract suite (tests/engine/store/)
runs it on both. `PostgresStore` overrides the hot verbs with literal SQL;
`SqliteStore` changes how an atomic step's transaction begins.

Every write a worker makes names the lease token it holds; the predicate
`id = ? AND lease_token = ?` lives in `_fence` and `transition` only.

A terminal transition (succeeded, failed, cancelled) of a task with an
endpoint (`callback_url`) also writes its webhook's outbox row, in the same
transaction (PostgreSQL: the same statement); a task without one pays nothing.

The store acts on nothing but rows: a transition returns what happened (a
`Moved`, and a claim its `Claimed.moved`), and the engine acts on it —
`engine/announce.py` emits its event and enqueues the webhook it owes, once,
on commit (docs/webhooks.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    BooleanField,
    Count,
    DateTimeField,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
)
from django.db.models.functions import Now, TruncHour
from django.db.models.sql import Query
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django_fsm import ConcurrentTransition

from workflows.conf import pilot_settings
from workflows.database import in_callers_transaction, serialize
from workflows.engine import faults
from workflows.engine.caps import (
    DEFAULT_GROUP,
    LOCK_CLIENT,
    LOCK_WORKFLOW,
    Slots,
    blocked_q,
    cap_of,
    caps,
    group_of,
)
from workflows.engine.leases import Lease, Refused
from workflows.engine.store.deliveries import DeliveryStore
from workflows.engine.store.rows import StepRow
from workflows.engine.store.schedules import ScheduleStore
from workflows.engine.store.signals import SignalStore
from workflows.models import (
    ActivityMinute,
    StepCheckpoint,
    Task,
    TaskReplay,
    TaskSignal,
    TaskTransition,
    WebhookDelivery,
)
from workflows.models.webhook import delivery_message_id
from workflows.rules.states import (
    COMPENSATION_STATES,
    FINISHED_STATES,
    LEASED_STATES,
    STEP_OVERWRITES,
    StepState,
    TaskState,
)

_FIELDS = [f for f in Task._meta.concrete_fields if not f.primary_key]
_ATTNAMES = [f.attname for f in _FIELDS]
STEP_TABLE = StepCheckpoint._meta.db_table
# How recent a claim must be for its worker to adopt it after a lost reply
# (held_by): the runner asks within WRITE_PATIENCE_SECONDS of its claim.
ADOPTABLE_SECONDS = 60
STEP_COLUMNS = ("task_id", "index", "name", "state", "output", "attempts", "compensable",
                "compensation_attempts", "error", "started_at", "finished_at", "failures")


@dataclasses.dataclass(frozen=True)
class Moved:
    """A transition the store persisted, as the engine needs it to act: the
    event it emits, the webhook message it sends (`delivery`: the message id
    an ending of a task with an endpoint owes, None otherwise), and — asked
    `then_claim_for` — the claim the same commit made (`following`)."""

    task_id: Any
    workflow: str
    transition: str
    from_state: str
    to_state: str
    attempt: int
    actor: str
    trace_id: str | None
    delivery: str | None = None
    following: Claimed | None = None
    parent_id: Any = None  # a child's parent (its ending may wake it: engine/children.py)
    parent_step: str = ""  # and the parent's step that started it


def moved(task: Task, name: str, from_state: str, actor: str,
          following: Claimed | None = None) -> Moved:
    """The fact of `task` (as it is now) having moved by `name` from `from_state`."""
    return Moved(task.pk, task.workflow, name, from_state, task.state, task.attempts, actor,
                 task.trace_id or None,
                 delivery_message_id(task.pk, task.state, task.restarts)
                 if delivery_owed(task) else None, following, task.parent_id, task.parent_step)


@dataclasses.dataclass
class Claimed:
    """A claim that won: the task as it is now (under the new token), the
    database's time at the claim, when the consumed message had been sent, and
    the worker that holds it."""

    task: Task
    db_now: datetime
    enqueued_at: datetime | None
    worker: str
    # Found after a lost reply (`held_by`) rather than returned by the claim.
    adopted: bool = False
    # The claim's own transition (None when adopted: its commit was not ours to see).
    moved: Moved | None = None

    @property
    def lease(self) -> Lease:
        return Lease(self.task.pk, self.task.lease_token, self.worker)


def delivery_owed(task: Task) -> bool:
    """Does this transition owe a webhook? Only an ending of a task with an
    endpoint; decided in memory, so a task without one costs nothing."""
    return task.state in FINISHED_STATES and bool(task.callback_url)


def _update_groups(tasks: list[Task], befores: list[dict[str, Any]],
                   fields: list[str]) -> list[tuple[dict[str, Any], list[Any]]]:
    """The UPDATEs that write `fields` of `tasks` as they are now: a field every
    task gives the same value is a constant, one every task moved by the same
    number (the version, an attempt budget) is `F(field) + n`, and the tasks
    are grouped by the rest — a batch of one edge is one UPDATE, not a CASE
    per row (Django's bulk_update) nor one per task."""
    shared: dict[str, Any] = {}
    varying = []
    for a in fields:
        new = [t.__dict__[a] for t in tasks]
        if all(v == new[0] for v in new):
            shared[a] = new[0]
            continue
        deltas = {v - b[a] if type(v) is int and type(b[a]) is int else None
                  for v, b in zip(new, befores, strict=True)}
        if len(deltas) == 1 and None not in deltas:
            shared[a] = F(a) + deltas.pop()
        else:
            varying.append(a)
    groups: list[tuple[dict[str, Any], list[Any]]] = []
    for task in tasks:
        values = {a: task.__dict__[a] for a in varying}
        group = next((g for g in groups if g[0] == values), None)
        if group is None:
            groups.append((values, [task.pk]))
        else:
            group[1].append(task.pk)
    return [({**shared, **values}, pks) for values, pks in groups]


def give_up_after() -> timedelta:
    return timedelta(seconds=pilot_settings.PILOT_WEBHOOK_GIVE_UP_SECONDS)


def _aware(value: Any) -> datetime:
    if isinstance(value, str):
        value = parse_datetime(value)
    return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)


def _guard_sql(table: str) -> str:
    """states.STEP_OVERWRITES as the upsert's WHERE: which stored states a
    written state may replace."""
    def quoted(values: Any) -> str:
        return ", ".join(f"'{v}'" for v in values)

    groups: dict[tuple[str, ...], list[str]] = {}
    for new, old in STEP_OVERWRITES.items():
        groups.setdefault(tuple(old), []).append(new)
    return " OR ".join(f"(excluded.state IN ({quoted(new)}) AND {table}.state IN "
                       f"({quoted(old)}))" for old, new in groups.items())


# What a written step row (`excluded`) makes of the stored one: the upsert's
# SET and its WHERE (states.STEP_OVERWRITES). One text for both forms: the
# portable upsert below, and PostgreSQL's split write (sql.py,
# step_rows), which names the new rows `excluded` too.
UPSERT_SET = f"""
    name = excluded.name,
    state = excluded.state,
    output = CASE WHEN excluded.state = 'succeeded' THEN excluded.output
                  ELSE {STEP_TABLE}.output END,
    attempts = CASE WHEN excluded.attempts > {STEP_TABLE}.attempts THEN excluded.attempts
                    ELSE {STEP_TABLE}.attempts END,
    compensable = CASE WHEN excluded.state = 'succeeded' THEN excluded.compensable
                       ELSE {STEP_TABLE}.compensable END,
    compensation_attempts = CASE
        WHEN excluded.compensation_attempts > {STEP_TABLE}.compensation_attempts
        THEN excluded.compensation_attempts ELSE {STEP_TABLE}.compensation_attempts END,
    error = CASE WHEN excluded.state IN ('compensating', 'compensated') THEN {STEP_TABLE}.error
                 ELSE excluded.error END,
    started_at = COALESCE(excluded.started_at, {STEP_TABLE}.started_at),
    finished_at = CASE WHEN excluded.state = 'compensating' THEN {STEP_TABLE}.finished_at
                       ELSE excluded.finished_at END,
    failures = CASE WHEN excluded.state = 'failed' AND excluded.failures IS NOT NULL
                    THEN excluded.failures ELSE {STEP_TABLE}.failures END
"""
UPSERT_GUARD = _guard_sql(STEP_TABLE)

# The upsert's conflict clause (portable SQL: PostgreSQL and SQLite >= 3.24).
UPSERT_ON_CONFLICT = f"""
ON CONFLICT (task_id, "index") DO UPDATE SET{UPSERT_SET}WHERE {UPSERT_GUARD}
"""


class OrmStore:
    """The task aggregate's verbs; the other aggregates' are its attributes:
    `deliveries` (webhook deliveries and endpoints), `schedules`, `signals`."""

    name = "orm"
    deliveries = DeliveryStore()
    schedules = ScheduleStore()
    signals = SignalStore()
    fold_batch = 200  # replay-log groups per fold (fold_replays): one transaction each

    # --- time ----------------------------------------------------------------------------

    def db_now(self) -> datetime:
        """The database's clock, now."""
        compiler = Query(None).get_compiler(connection=connection)
        sql, params = compiler.compile(Now())
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {sql}", params)
            return _aware(cursor.fetchone()[0])

    @staticmethod
    def _later(delta: timedelta) -> ExpressionWrapper[Any]:
        """The database's `now() + delta`, as an expression for an UPDATE."""
        return ExpressionWrapper(Now() + delta, output_field=DateTimeField())

    # --- claims ------------------------------------------------------------------------------

    def _slot_free(self, owner_id: Any, workflow: str, limits: dict[str, Any] | None, *,
                   undo: bool = False) -> bool:
        """The portable claim's final cap check (caps.py), inside the claim's
        transaction: serialized per client and per capped workflow as
        `pilot_claim_slot_v2` is (each count a statement of its own, so it sees
        every claim committed before the lock was granted). `undo`: the
        take-over of a compensation phase."""
        if limits is None:
            return True
        live = Q(lease_expires_at__gt=Now())
        held = Task.objects.filter(Q(state=TaskState.RUNNING)
                                   | Q(state__in=COMPENSATION_STATES) & live)
        group = group_of(workflow, limits)
        cap = cap_of(group, limits)
        if cap:
            serialize(LOCK_CLIENT, str(owner_id))
            counted = held if undo else Task.objects.filter(
                Q(state=TaskState.RUNNING) | Q(state__in=COMPENSATION_STATES) & (
                    live | Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=Now())))
            mine = counted.filter(owner_id=owner_id)
            mine = (mine.filter(workflow=workflow) if group != DEFAULT_GROUP
                    else mine.exclude(workflow__in=list(limits["own"])))
            if mine.count() >= cap:
                return False
        total = limits["total"].get(workflow)
        if total:
            serialize(LOCK_WORKFLOW, workflow)
            if held.filter(workflow=workflow).count() >= total:
                return False
        return True

    def _read_with_now(self, task_id: Any) -> Task | None:
        return Task.objects.annotate(pilot_db_now=Now()).filter(pk=task_id).first()

    def claim(self, task_id: Any, *, worker: str, lease: timedelta) -> Claimed | None:
        """pending, or retrying and due, with an attempt left → running (attempts
        + 1, a new token, the lease), with its audit row; None if there is
        nothing to claim or another claim won. Due-ness is the database's clock."""
        limits = caps()
        # Under caps the count and the claim share a transaction (and, on PostgreSQL,
        # the client's lock); without, the claim is its own compare-and-set.
        with transaction.atomic() if limits is not None else contextlib.nullcontext():
            task = self._read_with_now(task_id)
            if task is None:
                return None
            now, enqueued_at = _aware(task.pilot_db_now), task.enqueued_at
            if not task.is_due(now):
                return None
            if not self._slot_free(task.owner_id, task.workflow, limits):
                # Over a cap: this message is consumed; the task is owed one when
                # a slot frees (the dispatcher sends it).
                Task.objects.filter(pk=task.pk, lease_token=task.lease_token).update(
                    enqueued_at=None)
                return None
            try:
                move = self.transition(task, "claim", at=now, actor=f"worker:{worker}",
                                       reason=f"attempt {task.attempts + 1} of "
                                              f"{task.max_attempts}",
                                       worker=worker, now=now, lease=lease)
            except ConcurrentTransition:
                return None
        return Claimed(task, now, enqueued_at, worker, moved=move)

    def claim_next(self, *, worker: str, lease: timedelta) -> Claimed | None:
        """The queue: claim the next due task (pending, or retrying and due, with
        an attempt left), the highest priority first, then in due order,
        skipping tasks other claims hold; None when nothing is due."""
        from django.db.models import F

        limits = caps()
        with transaction.atomic():
            due = (Task.objects.filter(state__in=[TaskState.PENDING, TaskState.RETRYING],
                                       next_attempt_at__lte=Now(),
                                       attempts__lt=F("max_attempts")))
            due = due.exclude(blocked_q(Slots.now(limits)))
            task = (due.select_for_update(skip_locked=True).annotate(pilot_db_now=Now())
                    .order_by("-priority", "next_attempt_at").first())
            if task is None or not self._slot_free(task.owner_id, task.workflow, limits):
                return None
            now, enqueued_at = _aware(task.pilot_db_now), task.enqueued_at
            move = self.transition(task, "claim", at=now, actor=f"worker:{worker}",
                                   reason=f"attempt {task.attempts + 1} of {task.max_attempts}",
                                   worker=worker, now=now, lease=lease)
        return Claimed(task, now, enqueued_at, worker, moved=move)

    def resume(self, task_id: Any, *, worker: str, lease: timedelta,
               after_cancel_of: int | None = None) -> Claimed | None:
        """Take the compensation phase of a compensating or cancelling task over
        (`resume`: a new token, the lease). Without `after_cancel_of`: only when no
        live lease holds it and no backoff is pending. With it: only the worker
        whose running attempt held token `after_cancel_of` and was cancelled —
        nothing else happened since (the token moved exactly once)."""
        # A take-over counts toward its client's cap (caps.py); the worker whose
        # own cancelled attempt it is holds the slot already.
        limits = caps() if after_cancel_of is None else None
        with transaction.atomic() if limits is not None else contextlib.nullcontext():
            task = self._read_with_now(task_id)
            if task is None:
                return None
            now, enqueued_at = _aware(task.pilot_db_now), task.enqueued_at
            if after_cancel_of is None:
                if not task.is_resumable(now):
                    return None
                if not self._slot_free(task.owner_id, task.workflow, limits, undo=True):
                    # Over its cap: this message is consumed; the phase is owed one.
                    Task.objects.filter(pk=task.pk, lease_token=task.lease_token).update(
                        enqueued_at=None)
                    return None
                reason = "took the compensations over"
            else:
                if not (task.state == TaskState.CANCELLING
                        and task.lease_token == after_cancel_of + 1):
                    return None
                reason = "its running attempt was cancelled: compensating it"
            try:
                move = self.transition(task, "resume", at=now, actor=f"worker:{worker}",
                                       reason=reason, worker=worker, now=now, lease=lease)
            except ConcurrentTransition:
                return None
        return Claimed(task, now, enqueued_at, worker, moved=move)

    def held_by(self, *, worker: str, task_id: Any = None,
                besides: Iterable[Any] = ()) -> Claimed | None:
        """The task `worker` holds by its own latest claim or take-over — under
        its live lease, the task's last audit row that claim (or resume) by this
        worker — whose reply the worker may have lost: `task_id`'s, and not one
        of `besides`. A worker id is unique to its process and a worker runs one
        task at a time, so the answer is unambiguous; a claim older than
        ADOPTABLE_SECONDS is not adopted (a process restarted under a reused pid
        must not take its predecessor's task for its own). None when there is
        none. Reads only."""
        actor = f"worker:{worker}"[:200]
        held = (Task.objects.annotate(pilot_db_now=Now())
                .filter(state__in=LEASED_STATES, lease_owner=worker[:200],
                        lease_expires_at__gt=Now()))
        if task_id is not None:
            held = held.filter(pk=task_id)
        held = held.exclude(pk__in=list(besides))
        recent = self._later(-timedelta(seconds=ADOPTABLE_SECONDS))
        for task in held.order_by("-updated_at")[:3]:
            last = (TaskTransition.objects.filter(task_id=task.pk).order_by("-id")
                    .annotate(pilot_recent=ExpressionWrapper(Q(at__gte=recent),
                                                             output_field=BooleanField()))
                    .values_list("transition", "actor", "pilot_recent").first())
            if last in (("claim", actor, True), ("resume", actor, True)):
                return Claimed(task, _aware(task.pilot_db_now), None, worker, adopted=True)
        return None

    def checkpoints(self, task_id: Any) -> dict[int, StepCheckpoint]:
        return {cp.index: cp for cp in StepCheckpoint.objects.filter(task_id=task_id)}

    # --- fenced writes -------------------------------------------------------------------------

    def refusal(self, lease: Lease) -> Refused:
        row = Task.objects.filter(pk=lease.task_id).values_list("state", "lease_token").first()
        return Refused(lease, *(row or (None, None)))

    def _fence(self, lease: Lease, *, renew: bool, lease_length: timedelta | None) -> None:
        """Inside a transaction: hold the task row if it still carries our token
        (extending the lease when `renew`), or raise Refused."""
        mine = Task.objects.filter(pk=lease.task_id, lease_token=lease.token)
        if renew:
            held = mine.update(lease_expires_at=self._later(lease_length))  # type: ignore[arg-type]  # renew: given
        else:
            held = len(mine.select_for_update().values_list("pk", flat=True))
        if not held:
            raise self.refusal(lease)

    def write_steps(self, lease: Lease, rows: list[StepRow], *,
                    renew_for: timedelta | None = None) -> None:
        """Fence, then upsert `rows` (never downgrading a step); all or nothing.
        `renew_for` also extends the lease to the database's now + that long.
        Raises Refused, writing nothing, when the token is no longer the task's."""
        with transaction.atomic():  # nested: a savepoint, a refusal undoes only this
            self._fence(lease, renew=renew_for is not None, lease_length=renew_for)
            if rows:
                self.upsert_steps_in_tx(lease.task_id, rows)
        if renew_for is not None:
            lease.clock.mark()

    def renew(self, lease: Lease, *, lease_length: timedelta) -> None:
        self.write_steps(lease, [], renew_for=lease_length)

    def check(self, lease: Lease) -> None:
        if not Task.objects.filter(pk=lease.task_id, lease_token=lease.token).exists():
            raise self.refusal(lease)

    def save_progress(self, lease: Lease, *, index: int, progress: Any) -> None:
        with transaction.atomic():  # nested: a savepoint, a refusal undoes only this
            self._fence(lease, renew=False, lease_length=None)
            StepCheckpoint.objects.filter(task_id=lease.task_id, index=index).update(
                progress=progress)

    def consume_signal(self, lease: Lease, name: str, *, step: int,
                       at: datetime) -> Any:
        """Fence — holding the task's row, which a sender locks too — then
        consume the oldest unconsumed signal `name` for wait step `step`
        (SignalStore.consume_in_tx); None when none is stored. Meant for the
        transaction that records the step (or parks the task)."""
        with transaction.atomic():  # nested: a savepoint, a refusal undoes only this
            self._fence(lease, renew=False, lease_length=None)
            return self.signals.consume_in_tx(lease.task_id, name, step=step, at=at)

    @in_callers_transaction
    def upsert_steps_in_tx(self, task_id: Any, rows: list[StepRow]) -> None:
        """The upsert alone, for a caller that already holds the fence (or the
        task's row lock) in this transaction."""
        ops = connection.ops
        pk = Task._meta.pk.get_db_prep_value(task_id, connection)
        params = []
        for r in rows:
            params += [pk, r.index, r.name, r.state,
                       None if r.output is None else json.dumps(r.output), r.attempts,
                       r.compensable, r.compensation_attempts, r.error,
                       ops.adapt_datetimefield_value(r.started_at),
                       ops.adapt_datetimefield_value(r.finished_at),
                       None if r.failures is None else json.dumps(r.failures)]
        columns = ", ".join(f'"{c}"' for c in STEP_COLUMNS)
        values = ", ".join(["(" + ", ".join(["%s"] * len(STEP_COLUMNS)) + ")"] * len(rows))
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {STEP_TABLE} ({columns}) VALUES {values} "
                           f"{UPSERT_ON_CONFLICT}", params)

    # --- transitions ---------------------------------------------------------------------------

    def transition(self, task: Task, name: str, *, at: datetime, actor: str, reason: str = "",
                   steps: list[StepRow] | tuple[StepRow, ...] = (),
                   set_fields: dict[str, Any] | None = None,
                   then_claim_for: tuple[str, timedelta] | None = None,
                   **kwargs: Any) -> Moved:
        """Apply django-fsm transition `name` (with `kwargs`) to `task` and persist
        it as a compare-and-set on the token `task` carries — with its audit row
        and `steps` — all or nothing. `at` (a database time) stamps the change.
        Returns the `Moved` fact (the caller announces it: engine/announce.py).
        With `then_claim_for=(worker, lease)`, once it is persisted, claim the next
        due task for that worker (`claim_next`): the fact's `following` (None:
        none due).

        Raises TransitionNotAllowed if the edge is illegal from the task's state,
        ConcurrentTransition if the stored task has another token (someone else
        changed it since it was read). On any failure the in-memory task is left
        as it was, so it never claims a state the database does not have."""
        before = {a: task.__dict__.get(a) for a in _ATTNAMES}
        token, from_state = task.lease_token, task.state
        try:
            for attname, value in (set_fields or {}).items():
                setattr(task, attname, value)
            getattr(task, name)(**kwargs)
            task.updated_at = at
            changed = [a for a in _ATTNAMES if task.__dict__.get(a) != before[a]
                       or a == "updated_at"]
            following = self._persist(task, token, changed, name, from_state, actor, reason,
                                      at, list(steps), then_claim_for)
        except BaseException:
            task.__dict__.update(before)
            raise
        task._update_initial_state()
        return moved(task, name, from_state, actor, following)

    @in_callers_transaction
    def transition_locked_in_tx(self, tasks: list[Task], name: str, *, at: datetime,
                                actor: str, reason: str = "",
                                set_fields: dict[str, Any] | None = None,
                                **kwargs: Any) -> list[Moved]:
        """`transition` of many tasks by the same edge, in the caller's
        transaction, for rows it locked (`lock_free_in_tx`): the lock is the
        fence, so one UPDATE writes them all (one per set of equal new values)
        and one INSERT their audit rows — a batch costs a few statements, not
        two per task. The edge is checked per
        task in memory (TransitionNotAllowed on the first illegal one: nothing
        is written)."""
        if not tasks:
            return []
        froms: list[str] = []
        changed: set[str] = set()
        befores = [{a: t.__dict__.get(a) for a in _ATTNAMES} for t in tasks]
        try:
            for task, before in zip(tasks, befores, strict=True):
                froms.append(task.state)
                for attname, value in (set_fields or {}).items():
                    setattr(task, attname, value)
                getattr(task, name)(**kwargs)
                task.updated_at = at
                changed.update(a for a in _ATTNAMES
                               if task.__dict__.get(a) != before[a] or a == "updated_at")
            for values, pks in _update_groups(tasks, befores, sorted(changed)):
                Task.objects.filter(pk__in=pks).update(**values)
            TaskTransition.objects.bulk_create(
                TaskTransition(task_id=task.pk, transition=name, from_state=from_state,
                               to_state=task.state, actor=actor[:200], reason=reason, at=at)
                for task, from_state in zip(tasks, froms, strict=True))
            for task in tasks:
                if delivery_owed(task):
                    self.delivery_insert_in_tx(task)
        except BaseException:
            for task, before in zip(tasks, befores, strict=True):
                task.__dict__.update(before)
            raise
        for task in tasks:
            task._update_initial_state()
        return [moved(task, name, from_state, actor)
                for task, from_state in zip(tasks, froms, strict=True)]

    def _persist(self, task: Task, token: int, changed: list[str], name: str, from_state: str,
                 actor: str, reason: str, at: datetime, steps: list[StepRow],
                 then_claim_for: tuple[str, timedelta] | None = None) -> Claimed | None:
        with transaction.atomic():  # nested: a savepoint, a refusal undoes only this
            matched = Task.objects.filter(pk=task.pk, lease_token=token).update(
                **{a: task.__dict__[a] for a in changed})
            if matched != 1:
                raise ConcurrentTransition(f"task {task.pk} is no longer at version {token}")
            TaskTransition.objects.create(task_id=task.pk, transition=name,
                                          from_state=from_state, to_state=task.state,
                                          actor=actor[:200], reason=reason, at=at)
            if steps:
                self.upsert_steps_in_tx(task.pk, steps)
            if delivery_owed(task):
                self.delivery_insert_in_tx(task)
        if then_claim_for is None:
            return None
        worker, lease = then_claim_for
        return self.claim_next(worker=worker, lease=lease)

    @in_callers_transaction
    def delivery_insert_in_tx(self, task: Task) -> None:
        """The outbox row of `task`'s ending (in the caller's transaction): due
        now, its message counted as sent (the caller enqueues it on commit), given
        up PILOT_WEBHOOK_GIVE_UP_SECONDS from now — all the database's time —
        with the task's owner and traceparent (a delivery outlives its task). The
        unique (task, state, restarts) makes a second insert a no-op."""
        WebhookDelivery.objects.bulk_create([WebhookDelivery(
            task_id=task.pk, owner_id=task.owner_id, traceparent=task.traceparent,
            task_state=task.state, restarts=task.restarts,
            url=task.callback_url, created_at=Now(), next_attempt_at=Now(), enqueued_at=Now(),
            give_up_at=self._later(give_up_after()))], ignore_conflicts=True)

    # --- rows the dispatcher, operators, triggers and cleanup change ------------------------

    @staticmethod
    @in_callers_transaction
    def lock_free_in_tx(rows: QuerySet[Any], limit: int) -> list[Any]:
        """Up to `limit` of `rows` (a queryset of any of the engine's models,
        already filtered, ordered and shaped by the caller), locked FOR UPDATE
        SKIP LOCKED — rows another transaction holds are passed by, never waited
        for — in the caller's transaction: how any number of dispatchers and
        cleanups share a scan without doing anything twice."""
        return list(rows.select_for_update(skip_locked=True)[:limit])

    @in_callers_transaction
    def lock_task_in_tx(self, task_id: Any) -> Task | None:
        """The task FOR UPDATE, read with the database's time (`pilot_db_now`),
        in the caller's transaction; None when there is none."""
        return (Task.objects.select_for_update().annotate(pilot_db_now=Now())
                .filter(pk=task_id).first())

    @in_callers_transaction
    def lock_tasks_in_tx(self, rows: QuerySet[Task]) -> list[Task]:
        """Every task of `rows` (filtered and ordered by the caller — a fixed
        order, the lock order) FOR UPDATE, waiting for rows others hold, read
        with the database's time (`pilot_db_now`): a cancel's cascade to a
        parent's children must reach each of them."""
        return list(rows.select_for_update().annotate(pilot_db_now=Now()))  # type: ignore[no-redef]  # the annotation

    @in_callers_transaction
    def children_counted_in_tx(self, task_id: Any, created: int) -> None:
        """`created` more children of `task_id` (whose row the caller holds
        under its fence): kept on the row, the representation's
        `children_count`."""
        if created:
            Task.objects.filter(pk=task_id).update(
                children_count=F("children_count") + created)

    def interrupt_steps(self, task_id: Any, *, error: str, at: datetime) -> int:
        """The task's step that was running is recorded failed with `error`: no
        worker runs it any more (the next attempt rewrites it)."""
        return StepCheckpoint.objects.filter(task_id=task_id, state=StepState.RUNNING).update(
            state=StepState.FAILED, error=error, finished_at=at)

    def mark_sent(self, task_ids: list[Any], at: datetime) -> None:
        """The tasks' outstanding message was sent at `at` (the caller enqueues
        them on commit)."""
        Task.objects.filter(pk__in=task_ids).update(enqueued_at=at)

    @in_callers_transaction
    def reset_steps_in_tx(self, task_id: Any, *, to_pending: list[int], as_done: list[int]) -> None:
        """A retry's plan (plans.retry_plan), for a task the caller holds locked:
        steps `to_pending` run again from scratch; steps `as_done` keep their
        output and are owed no compensation any more."""
        if to_pending:
            StepCheckpoint.objects.filter(task_id=task_id, index__in=to_pending).update(
                state=StepState.PENDING, output=None, progress=None, error="",
                compensable=False, compensation_attempts=0, started_at=None, finished_at=None)
        if as_done:
            StepCheckpoint.objects.filter(task_id=task_id, index__in=as_done).update(
                state=StepState.SUCCEEDED, compensation_attempts=0)

    def insert_tasks(self, tasks: list[Task]) -> None:
        """Insert `tasks` (in idempotency-key order, the one lock order of
        triggers); a key that has a row already keeps it (the unique constraint
        decides races: the caller reads back which row won)."""
        Task.objects.bulk_create(sorted(tasks, key=lambda t: t.idempotency_key),
                                 ignore_conflicts=True)

    @in_callers_transaction
    def lock_keys_in_tx(self, owner: Any, keys: list[str]) -> QuerySet[Task]:
        """The owner's rows for `keys`, FOR UPDATE in key order, with the
        database's time (`pilot_db_now`)."""
        return (Task.objects.select_for_update().annotate(pilot_db_now=Now())
                .filter(owner=owner, idempotency_key__in=keys).order_by("idempotency_key"))

    def log_replays(self, replays: list[TaskReplay]) -> None:
        """Append replays to their log (never to the task row a worker fences on)."""
        TaskReplay.objects.bulk_create(replays)

    @in_callers_transaction
    def delete_tasks_in_tx(self, task_ids: list[Any]) -> int:
        """Delete the tasks and everything hanging off them, children first, in
        the caller's transaction — but a webhook delivery not yet delivered or
        given up, which outlives its task (its body fixed from the task and steps
        first: DeliveryStore.outlive). Returns the number of tasks deleted. The
        caller decides which ids may go (finished ones, under a lock)."""
        if not task_ids:
            return 0
        self.deliveries.outlive_in_tx(task_ids)  # before the steps go: a body may need them
        StepCheckpoint.objects.filter(task_id__in=task_ids)._raw_delete(StepCheckpoint.objects.db)
        TaskTransition.objects.filter(task_id__in=task_ids)._raw_delete(TaskTransition.objects.db)
        TaskReplay.objects.filter(task_id__in=task_ids)._raw_delete(TaskReplay.objects.db)
        TaskSignal.objects.filter(task_id__in=task_ids)._raw_delete(TaskSignal.objects.db)
        return Task.objects.filter(pk__in=task_ids)._raw_delete(Task.objects.db)

    @staticmethod
    def delete_q_results(ids: list[Any]) -> None:
        """Delete django-q2's Success/Failure rows `ids` (nothing in PILOT reads
        them; django-q2 writes each once, so the DELETE's own lock is enough)."""
        from django_q.models import Task as QResult

        QResult.objects.filter(pk__in=ids)._raw_delete(QResult.objects.db)

    # --- atomic steps --------------------------------------------------------------------------

    def atomic_step(self) -> contextlib.AbstractContextManager[None]:
        """The transaction an atomic step's body and record share."""
        return transaction.atomic()

    def is_lock_conflict(self, exc: BaseException) -> bool:
        """A transaction refused because another writer won (retry it whole)."""
        return False

    # --- triggers ---------------------------------------------------------------------------

    def create_or_replay(self, task: Task) -> tuple[str, Task] | None:
        """A fast path for one trigger (see PostgresStore); None: take the general path."""
        return None

    # --- time, for an author's tests (workflows.testing) -----------------------------------

    def skip_backoff(self, task_id: Any) -> int:
        """What waits out a backoff (a retry, a deferred compensation) or a
        timer or timeout (a waiting task) is due at the database's now. Not a
        transition (the token stays): time passing."""
        waiting = Task.objects.filter(pk=task_id, state=TaskState.WAITING,
                                      next_attempt_at__isnull=False).first()
        if waiting is not None:
            now = self.db_now()
            return Task.objects.filter(pk=task_id, lease_token=waiting.lease_token).update(
                next_attempt_at=now,
                waiting_for={**(waiting.waiting_for or {}), "until": now.isoformat()})
        return (Task.objects.filter(pk=task_id, next_attempt_at__isnull=False,
                                    state__in=[TaskState.RETRYING, *COMPENSATION_STATES])
                .update(next_attempt_at=Now()))

    def expire_lease(self, task_id: Any) -> int:
        """The task's lease ran out a second ago (as after its worker's death)."""
        return Task.objects.filter(pk=task_id, lease_expires_at__isnull=False).update(
            lease_expires_at=self._later(-timedelta(seconds=1)))

    # --- the activity rollup ----------------------------------------------------------------

    def activity_write(self, rows: list[ActivityMinute], *, fields: list[str],
                       drop_before: datetime) -> None:
        """Upsert the folded minutes `rows` (their `fields` recounted; two
        dispatchers folding one minute agree) and drop the minutes older than
        `drop_before`, in one transaction (engine/activity.py)."""
        with transaction.atomic():
            ActivityMinute.objects.bulk_create(
                rows, update_conflicts=True, unique_fields=["minute", "workflow"],
                update_fields=fields)
            ActivityMinute.objects.filter(minute__lt=drop_before).delete()

    # --- the replay log ---------------------------------------------------------------------

    def fold_replays(self, *, since: datetime | None, batch: int) -> tuple[int, int, int]:
        """Fold up to `batch` (task, UTC hour) groups of more than one TaskReplay
        row (at or after `since`; None: all): in each, of the rows this folder
        could lock (FOR UPDATE SKIP LOCKED), the newest is kept with their summed
        count and the others deleted. Returns (groups folded, rows removed,
        groups found). Here one transaction per group."""
        rows = (TaskReplay.objects.all() if since is None
                else TaskReplay.objects.filter(at__gte=since))
        groups = list(rows.annotate(hour=TruncHour("at", tzinfo=UTC)).order_by()
                      .values("task_id", "hour").annotate(n=Count("id")).filter(n__gt=1)
                      [:batch])
        folded = removed = 0
        for group in groups:
            gone = self._fold_group(group["task_id"], group["hour"])
            folded += gone > 0
            removed += gone
        return folded, removed, len(groups)

    def _fold_group(self, task_id: Any, hour: datetime) -> int:
        with transaction.atomic():
            members = list(TaskReplay.objects.select_for_update(skip_locked=True)
                           .filter(task_id=task_id, at__gte=hour, at__lt=hour + timedelta(hours=1))
                           .order_by("-at", "-id").values_list("id", "count"))
            if len(members) < 2:
                return 0
            (kept, _), others = members[0], [pk for pk, _ in members[1:]]
            TaskReplay.objects.filter(pk=kept).update(count=sum(n for _, n in members))
            TaskReplay.objects.filter(pk__in=others).delete()
            faults.fault_point("before_fold_commit")
        return len(others)


class SqliteStore(OrmStore):
    """SQLite allows one writer at a time. Every transaction begins IMMEDIATE
    (the connection's `transaction_mode`, pilot/settings.py): it takes the write
    lock at BEGIN, so two writers queue on the busy timeout instead of failing
    on a lock upgrade. An atomic step's transaction is no exception: it holds the
    write lock from its first statement to its COMMIT. Begun DEFERRED (as it
    once was) its body read on a snapshot, and any commit by anyone between that
    read and its first write — django-q2's statistics every 0.5 s, another
    task's heartbeat — made SQLite refuse the write (SQLITE_BUSY_SNAPSHOT,
    "database is locked", which the busy timeout does not wait out): every
    round of the step failed, its attempts burned, compensations were given up
    (review turn 3, F2). The cost: while an atomic step runs, every other writer
    waits for it (docs/operations.md, "SQLite's limits"). A BEGIN that waited
    the whole busy timeout in vain is a lock conflict (`is_lock_conflict`): the
    runner runs the transaction again."""

    name = "sqlite"

    def is_lock_conflict(self, exc: BaseException) -> bool:
        return "database is locked" in str(exc) or "database table is locked" in str(exc)


__all__ = ["Claimed", "Moved", "OrmStore", "SqliteStore", "moved"]
