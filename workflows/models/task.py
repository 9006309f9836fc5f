"""The Task: one run of one workflow for one idempotency key (docs/design.md).

The state field is protected: nothing assigns it. Every edge of the state
machine is a django-fsm transition below; transitions are pure (they only set
fields on the instance), and every one of them — through `VersionedFSMField` —
also increments `lease_token`, the task's version: a worker's fenced writes
name the token they claimed, so after *any* change (a recover, a cancel, a
retry, another worker's take-over) a stale worker can never write again, and
a (state, token) pair seen once never comes back. The engine's store persists
a transition as a compare-and-set on the token it read (workflows/engine/store).

Times passed to transitions (`now`) are the database's clock, never the
calling machine's (docs/design.md, "Time").
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django_fsm import RETURN_VALUE, ConcurrentTransitionMixin, FSMField, transition

from workflows.registry import DEFAULT_IDEMPOTENCY_TTL
from workflows.rules.keys import MAX_KEY_LENGTH
from workflows.rules.states import (
    COMPENSATION_STATES,
    FINISHED_STATES,
    LEASED_STATES,
    Source,
    TaskState,
)

# `waiting_for` kinds (docs/waiting.md).
WAIT_KINDS = ("timer", "signal", "children")

MAX_ERROR_LENGTH = 4000

S = TaskState


class VersionedFSMField(FSMField):
    """An FSMField whose every transition is a new version of the row: after the
    transition's body ran (and only if it did not raise) the model's
    `lease_token` goes up by one. One place, so no edge can forget it."""

    def change_state(self, instance: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().change_state(instance, method, *args, **kwargs)
        instance.lease_token += 1
        return result


class TaskQuerySet(models.QuerySet["Task"]):
    def expired(self, now: datetime) -> TaskQuerySet:
        """Finished tasks whose idempotency key may be reused (expires_at passed)."""
        return self.filter(state__in=FINISHED_STATES, expires_at__lte=now)

    def finished_before(self, ts: datetime) -> TaskQuerySet:
        return self.filter(state__in=FINISHED_STATES, finished_at__lt=ts)

    def expired_leases(self, now: datetime) -> TaskQuerySet:
        """Held by a worker whose lease ran out before `now` (a database time)."""
        return self.filter(state__in=LEASED_STATES, lease_expires_at__lt=now)

    def with_replays(self) -> TaskQuerySet:
        """Each task with `replays` and `last_replayed_at` read from its replay log
        in the same query (one index probe per task)."""
        from django.db.models import IntegerField, OuterRef, Subquery, Sum
        from django.db.models.functions import Coalesce

        from workflows.models.replay import TaskReplay

        log = TaskReplay.objects.filter(task_id=OuterRef("pk")).order_by().values("task_id")
        # (django-stubs' plugin reports the annotation's names as redefined)
        return self.annotate(  # type: ignore[no-redef]
            pilot_replays=Coalesce(Subquery(log.annotate(n=Sum("count")).values("n")),
                                   0, output_field=IntegerField()),
            pilot_last_replayed_at=Subquery(log.annotate(m=models.Max("at")).values("m")))


class Task(ConcurrentTransitionMixin, models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed through task_owner_key_uniq and pilot_task_owner_created_idx.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="pilot_tasks", db_index=False)
    # The key rule: workflows.rules.keys.
    idempotency_key = models.CharField(max_length=MAX_KEY_LENGTH)
    workflow = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    fingerprint = models.CharField(max_length=64)
    state = VersionedFSMField(default=S.PENDING, choices=S.choices, protected=True, max_length=20)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    error_type = models.CharField(max_length=200, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # What a parked task waits for (docs/waiting.md): {"kind": timer|signal|children,
    # "step": index, "name"?: signal, "until"?: ISO time}; written by `park`, kept
    # by `wake` (the woken wait step reads its deadline back), cleared by `retry`.
    # While waiting, `next_attempt_at` is when the wait ends by itself (NULL: never).
    waiting_for = models.JSONField(null=True, blank=True)
    # Among due tasks a worker claims the highest first, then the oldest due
    # (-100..100, Django's task framework's range; docs/waiting.md).
    priority = models.SmallIntegerField(default=0, db_default=0)
    # Not claimed before this (a delayed start, as triggered; its first
    # next_attempt_at is the later of this and the trigger's time).
    run_after = models.DateTimeField(null=True, blank=True)
    lease_token = models.PositiveBigIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.API)
    trace_id = models.CharField(max_length=64, blank=True, default="")
    # The W3C trace context its work continues (docs/tracing.md): the trigger's
    # `traceparent`, or the trigger span's when OpenTelemetry records one.
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")
    # Where its completion is POSTed (docs/webhooks.md): the trigger's
    # `callback_url`, else its owner's default endpoint at trigger time; "" = none.
    callback_url = models.CharField(max_length=2000, blank=True, default="", db_default="")
    # Times `retry` sent it back to pending: the <n> of its webhooks' ids.
    # (Database defaults too: rows inserted by raw SQL that predates these columns.)
    restarts = models.PositiveIntegerField(default=0, db_default=0)
    # How long its key is remembered once it finished (expires_at = finished_at +
    # this): its workflow's idempotency TTL when it was triggered, fixed then, so
    # a registry changed or a workflow removed before it ends does not change
    # the lifetime the client was promised (docs/design.md, "Data model").
    idempotency_ttl = models.DurationField(default=DEFAULT_IDEMPOTENCY_TTL,
                                           db_default=DEFAULT_IDEMPOTENCY_TTL)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    # The version of its workflow it was triggered on; every later attempt,
    # compensation and wait runs that version's steps (docs/writing-workflows.md,
    # "Versions").
    version = models.PositiveIntegerField(default=1, db_default=1)
    # A child task (docs/writing-workflows.md, "Children"): the task whose step
    # `parent_step` started it, as its `parent_index`-th child (the order its
    # parent's wait gathers results in). No database constraint: cleanup deletes
    # a parent whose key expired without touching children still kept.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.DO_NOTHING,
                               db_constraint=False, related_name="children")
    parent_step = models.CharField(max_length=100, blank=True, default="", db_default="")
    parent_index = models.PositiveIntegerField(null=True, blank=True)
    # Children it started, kept by the (fenced) statement that starts them.
    children_count = models.PositiveIntegerField(default=0, db_default=0)

    objects = TaskQuerySet.as_manager()
    # The database's time, annotated on the row by the engine's locking reads.
    pilot_db_now: datetime

    class Meta:
        constraints = [
            # The arbiter of concurrent triggers: one task per (client, key).
            models.UniqueConstraint(fields=["owner", "idempotency_key"],
                                    name="task_owner_key_uniq"),
            models.CheckConstraint(condition=Q(state__in=S.values), name="task_state_valid_chk"),
            models.CheckConstraint(condition=Q(attempts__lte=models.F("max_attempts")),
                                   name="task_attempts_within_max_chk"),
        ]
        indexes = [
            # GET /api/v1/tasks for one client, newest first (cursor pagination).
            models.Index(fields=["owner", "-created_at"], name="pilot_task_owner_created_idx"),
            # Admin list and dashboard: filter by state, newest first; counts by state.
            models.Index(fields=["state", "-created_at"], name="pilot_task_state_created_idx"),
            # Admin/API filter by workflow, newest first.
            models.Index(fields=["workflow", "-created_at"], name="pilot_task_wf_created_idx"),
            # Admin default ordering and its keyset pages, dashboard triggers per hour.
            models.Index(fields=["-created_at"], name="pilot_task_created_idx"),
            # Console key search: idempotency_key LIKE 'prefix%' (and = key). The
            # pattern opclass serves LIKE under any collation (the database's C.UTF-8
            # is not "C" to PostgreSQL); task_owner_key_uniq leads with owner_id.
            # Other databases ignore the opclass and get a plain index.
            models.Index(fields=["idempotency_key"], name="pilot_task_key_prefix_idx",
                         opclasses=["varchar_pattern_ops"]),
            # The queue: workers claim the next due task (state IN pending/retrying AND
            # next_attempt_at <= now ORDER BY next_attempt_at ... SKIP LOCKED); the
            # dispatcher finds due retries and phases (compensating/cancelling) and the
            # next one due.
            models.Index(fields=["next_attempt_at"], name="pilot_task_due_idx",
                         condition=Q(state__in=[S.PENDING, S.RETRYING,
                                                *COMPENSATION_STATES])),
            # The queue in claim order: the highest priority first, then the oldest due.
            models.Index(models.F("priority").desc(), "next_attempt_at",
                         name="pilot_task_claim_idx",
                         condition=Q(state__in=[S.PENDING, S.RETRYING])),
            # Dispatcher: waits whose timer or timeout is due (state = waiting AND
            # next_attempt_at <= now).
            models.Index(fields=["next_attempt_at"], name="pilot_task_wake_idx",
                         condition=Q(state=S.WAITING)),
            # Dispatcher: expired leases (state IN running/compensating/cancelling AND
            # lease_expires_at < now).
            models.Index(fields=["lease_expires_at"], name="pilot_task_lease_expiry_idx",
                         condition=Q(state__in=LEASED_STATES)),
            # Dispatcher: pending tasks whose enqueue may be lost (enqueued_at < now - 10 s).
            models.Index(fields=["enqueued_at"], name="pilot_task_pending_enq_idx",
                         condition=Q(state=S.PENDING)),
            # cleanup_tasks default: finished tasks with expires_at <= now.
            models.Index(fields=["expires_at"], name="pilot_task_expires_idx",
                         condition=Q(expires_at__isnull=False)),
            # A parent's children in the order it started them (GET /tasks?parent=,
            # a children wait's gathering, a cancel's cascade).
            models.Index(fields=["parent", "parent_index"], name="pilot_task_parent_idx",
                         condition=Q(parent__isnull=False)),
            # A child's ending asks whether its parent still has an open child:
            # only the open ones, so the last of 10 000 costs what the first did.
            models.Index(fields=["parent"], name="pilot_task_open_child_idx",
                         condition=Q(parent__isnull=False) & ~Q(state__in=FINISHED_STATES)),
            # The console's payload search (payload @> '{"order_id": 42}') uses
            # pilot_task_payload_gin_idx, a GIN on PostgreSQL only: migration 0030.
            # cleanup_tasks --older-than: finished tasks with finished_at < cutoff.
            models.Index(fields=["finished_at"], name="pilot_task_finished_idx",
                         condition=Q(finished_at__isnull=False)),
        ]
        permissions = [
            ("cancel_task", "Can cancel a task"),
            ("retry_task", "Can retry a task"),
            ("view_all_tasks", "Can view every client's tasks"),
            ("resend_webhook", "Can re-send a task's completion webhook"),
            ("signal_task", "Can send a signal to a task"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} {self.idempotency_key} ({self.state})"

    # --- derived --------------------------------------------------------------------

    # Duplicate triggers absorbed. A replay only appends to the TaskReplay log —
    # it never writes this row, which the task's worker fences on — so the count
    # is read from the log: annotated by `with_replays()` (selectors, the admin),
    # set by the trigger that replayed, or read here once.
    @property
    def replays(self) -> int:
        self._load_replays()
        return self.__dict__["pilot_replays"]

    @property
    def last_replayed_at(self) -> datetime | None:
        self._load_replays()
        return self.__dict__["pilot_last_replayed_at"]

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.pop("pilot_replays", None)  # read the log again when next asked
        self.__dict__.pop("pilot_last_replayed_at", None)
        super().refresh_from_db(*args, **kwargs)

    def _load_replays(self) -> None:
        if "pilot_replays" not in self.__dict__:
            from workflows.models.replay import TaskReplay

            log = TaskReplay.objects.filter(task_id=self.pk).aggregate(
                n=models.Sum("count"), last=models.Max("at"))
            self.pilot_replays, self.pilot_last_replayed_at = log["n"] or 0, log["last"]

    @property
    def waits_for(self) -> dict[str, Any] | None:
        """What it waits for while `waiting`, else None (the API's `waiting_for`)."""
        return self.waiting_for if self.state == S.WAITING else None

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_STATES

    def is_expired(self, now: datetime) -> bool:
        """Is its key free again at `now` (a database time)?"""
        return self.is_finished and self.expires_at is not None and self.expires_at <= now

    def is_due(self, now: datetime) -> bool:
        """Claimable for its steps at `now` (a database time): pending or
        retrying, due (a pending task's `next_attempt_at` is when it was
        triggered — or its `run_after` —, a retry's when its backoff ends), with
        an attempt left."""
        if self.attempts >= self.max_attempts:
            return False
        return self.state in (S.PENDING, S.RETRYING) and (self.next_attempt_at is None
                                                          or self.next_attempt_at <= now)

    def is_resumable(self, now: datetime) -> bool:
        """Claimable for its compensations at `now`: compensating or cancelling,
        with no live lease (its worker died, or none ever held it) and no
        backoff still to wait."""
        return (self.state in COMPENSATION_STATES
                and (self.lease_expires_at is None or self.lease_expires_at < now)
                and (self.next_attempt_at is None or self.next_attempt_at <= now))

    # --- field helpers used by transitions -----------------------------------------------

    def _set_error(self, error: str, error_type: str) -> None:
        self.error = (error or "")[:MAX_ERROR_LENGTH]
        self.error_type = (error_type or "")[:200]

    def _take_lease(self, worker: str, now: datetime, lease: timedelta) -> None:
        self.lease_owner = worker[:200]
        self.lease_expires_at = now + lease
        self.next_attempt_at = None
        self.enqueued_at = None  # its message is consumed: none outstanding

    def _release_lease(self) -> None:
        self.lease_owner = ""
        self.lease_expires_at = None

    def _finish(self, now: datetime) -> None:
        self._release_lease()
        self.next_attempt_at = None
        self.enqueued_at = None
        self.finished_at = now
        self.expires_at = now + self.idempotency_ttl  # the TTL fixed at its trigger

    # --- transitions (docs/design.md, "State machine"); pure ------------------------------

    @transition(field=state, source=[S.PENDING, S.RETRYING], target=S.RUNNING)
    def claim(self, *, worker: str, now: datetime, lease: timedelta) -> None:
        self.attempts += 1
        self._take_lease(worker, now, lease)
        if self.started_at is None:
            self.started_at = now

    @transition(field=state, source=S.RUNNING, target=S.SUCCEEDED)
    def succeed(self, *, result: Any, now: datetime) -> None:
        self.result = result
        self.error = ""
        self.error_type = ""
        self._finish(now)

    @transition(field=state, source=S.RUNNING, target=S.RETRYING)
    def schedule_retry(self, *, error: str, error_type: str, next_attempt_at: datetime) -> None:
        self._set_error(error, error_type)
        self._release_lease()
        self.next_attempt_at = next_attempt_at
        self.enqueued_at = None  # no message yet for this attempt: the dispatcher sends it

    @transition(field=state, source=S.RUNNING, target=S.RETRYING)
    def recover(self, *, next_attempt_at: datetime) -> None:
        """The dispatcher's edge for a running task whose lease expired: the lost
        attempt counts (it was counted at claim); the next one waits its backoff."""
        self._set_error("worker lost: lease expired before the attempt finished", "LeaseExpired")
        self._release_lease()
        self.next_attempt_at = next_attempt_at
        self.enqueued_at = None

    @transition(field=state, source=S.RUNNING, target=S.COMPENSATING)
    def compensate(self, *, error: str, error_type: str, worker: str = "",
                   now: datetime | None = None, lease: timedelta | None = None) -> None:
        """Failed for good with succeeded steps to undo: the durable compensation
        phase. The failing worker keeps the lease (`worker`) and runs the
        compensations under the new token; the dispatcher (no `worker`) leaves
        the task for any worker to claim."""
        self._set_error(error, error_type)
        if worker:
            self._take_lease(worker, now, lease)  # type: ignore[arg-type]  # given with a worker
        else:
            self._release_lease()
            self.next_attempt_at = None

    @transition(field=state, source=[S.RUNNING, S.COMPENSATING], target=S.FAILED)
    def fail(self, *, error: str, error_type: str, now: datetime) -> None:
        self._set_error(error, error_type)
        self._finish(now)

    @transition(field=state, source=S.RUNNING, target=S.WAITING)
    def park(self, *, waiting_for: dict[str, Any], until: datetime | None) -> None:
        """A wait step parks the task: no worker and no lease hold it, and
        nothing claims it before `wake` — its signal stored, its timer or
        timeout due at `until` (a database time; None: no timeout)."""
        self.waiting_for = waiting_for
        self._release_lease()
        self.next_attempt_at = until
        self.enqueued_at = None

    @transition(field=state, source=S.RUNNING, target=S.PENDING)
    def release(self, *, now: datetime) -> None:
        """The workers are stopping (engine/shutdown.py): the worker recorded the
        step it finished and gives the task back — no lease, due at `now`, owed a
        message — so the next start of the workers resumes it at its next step
        at once. The claim that follows continues this attempt, so it does not
        spend the budget (the cap moves by one, as `wake`'s does)."""
        self._release_lease()
        self.max_attempts += 1
        self.next_attempt_at = now
        self.enqueued_at = None

    @transition(field=state, source=S.WAITING, target=S.PENDING)
    def wake(self, *, now: datetime) -> None:
        """Due at `now` again: the wait step runs on and decides. The claim that
        follows continues the attempt that parked, so it does not spend the
        budget (the cap moves by one, as `retry`'s does); `waiting_for` stays
        for the wait step to read its deadline back."""
        self.max_attempts += 1
        self.next_attempt_at = now

    @transition(field=state, source=S.RUNNING, target=S.CANCELLING,
                permission="workflows.cancel_task")
    @transition(field=state, source=[S.PENDING, S.RETRYING, S.WAITING],
                target=RETURN_VALUE(S.CANCELLING, S.CANCELLED),
                permission="workflows.cancel_task")
    def cancel(self, *, needs_compensation: bool, now: datetime) -> str:
        """Running work, or succeeded steps to compensate, go through `cancelling`
        (a worker finishes it); anything else is cancelled at once. A running
        task's worker keeps its lease: it notices the cancel at its next write
        and takes the compensation phase over (`resume`). A compensating task
        is not cancellable: it is already undoing its work."""
        if self.state == S.RUNNING:
            return S.CANCELLING
        self.next_attempt_at = None
        if needs_compensation:
            return S.CANCELLING
        self._finish(now)
        return S.CANCELLED

    @transition(field=state, source=S.CANCELLING, target=S.CANCELLED)
    def finish_cancel(self, *, now: datetime, error: str = "", error_type: str = "") -> None:
        if error:
            self._set_error(error, error_type)
        self._finish(now)

    @transition(field=state, source=[S.FAILED, S.CANCELLED], target=S.PENDING,
                permission="workflows.retry_task")
    def retry(self, *, budget: int, now: datetime) -> None:
        """Back to pending — due at `now` — with a fresh budget of `budget`
        attempts; `attempts` keeps counting over the task's life, so the cap
        moves instead. Counts the restart (`restarts`: each terminal state gets
        its own webhook)."""
        self.max_attempts = self.attempts + budget
        self.restarts += 1
        self.waiting_for = None
        self.result = None
        self.error = ""
        self.error_type = ""
        self.next_attempt_at = now
        self.finished_at = None
        self.expires_at = None
        self._release_lease()

    @transition(field=state, source=list(COMPENSATION_STATES), target=None)
    def resume(self, *, worker: str, now: datetime, lease: timedelta) -> None:
        """A worker takes the compensation phase over (the state stays): the one
        whose running attempt was cancelled, or any worker once the previous
        holder's lease expired. The new token fences out everyone else."""
        self._take_lease(worker, now, lease)

    @transition(field=state, source=list(COMPENSATION_STATES), target=None)
    def defer(self, *, next_attempt_at: datetime) -> None:
        """A compensation failed retryably: give the task back and try again
        after the backoff (the dispatcher sends it when due)."""
        self._release_lease()
        self.next_attempt_at = next_attempt_at
        self.enqueued_at = None
